#!/usr/bin/env bash
# The launch lock of one session and of the GPUs the run will use: taken here, printed with the
# probe taken under it, and held for as long as the launcher's heartbeats keep coming on stdin.
# Usage: lock.sh [-H FIELDS] SESSION HOLDER [GPU...]   (-H: the probe reads the GPUs' health too: probe.sh -H)
# A GPU belongs to at most one launch or run on this target, whatever the playbook: a GPU whose
# lock another launch holds, or that a live run of another session uses, is refused (gpu-held).
#        lock.sh --forget SESSION HOLDER [GPU...]
# --forget: a launcher whose connection dropped (its lock holder here ended with it) takes its name
# off the holder files, so the next launch does not report a launcher that died.
set -u
G="$HOME/.gpuops"
if [ "${1:-}" = --forget ]; then
  S=$2 HOLDER=$3
  shift 3
  forget() { if [ "$(head -n 1 "$1" 2>/dev/null)" = "$2" ]; then rm -f "$1"; fi; }
  forget "$G/locks/$S.holder" "$HOLDER"
  for N in "$@"; do forget "$G/locks/gpu-$N.holder" "session $S: $HOLDER"; done
  exit 0
fi
health=()
if [ "${1:-}" = -H ]; then health=(-H "$2"); shift 2; fi
S=$1 HOLDER=$2
shift 2
HERE=$(dirname "${BASH_SOURCE[0]}")
# 70: the home is not writable (protocol.CANNOT_CREATE_EXIT)
mkdir -p "$G/locks" "$G/runs" "$G/sessions" || exit 70
L="$G/locks/$S"
exec 9>>"$L.lock" || exit 70
# Held without a holder's name: a launcher that is just writing it, or a status probe peeking
# (flock -n ... true): retry for a moment, so a refusal is real and names who holds the lock.
i=0
until flock -n 9; do
  h=$(head -c 300 "$L.holder" 2>/dev/null)
  if [ -n "$h" ] || [ $i -ge 20 ]; then echo "@@gpuops busy $h"; exit 75; fi
  sleep 0.05; i=$((i+1))
done

# The GPUs: each one's lock (another launch in progress), then the live runs of other sessions.
gpu_fds=()
for N in "$@"; do
  exec {fd}>>"$G/locks/gpu-$N.lock" || exit 70
  i=0
  until flock -n "$fd"; do
    h=$(head -c 300 "$G/locks/gpu-$N.holder" 2>/dev/null)
    if [ -n "$h" ] || [ $i -ge 20 ]; then echo "@@gpuops gpu-held $N launch: $h"; exit 75; fi
    sleep 0.05; i=$((i+1))
  done
  gpu_fds+=("$fd")
done
# between_attempts RUN_DIR: a run with no session that is alive all the same: an attempt ended, a
# restart is due or its next attempt waits (watchdog.json / attempt.json), and its supervisor lives.
# A run holds its GPUs from preflight to its last attempt's end.
between_attempts() {
  grep -qsE '"restart_due": *true|"state": *"restarting"' "$1/watchdog.json" \
    || grep -qsE '"state": *"(waiting|starting)"' "$1/attempt.json" || return 1
  local pid
  pid=$(head -c 16 "$1/supervisor.pid" 2>/dev/null | tr -dc '0-9')
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}
if [ $# -gt 0 ]; then
  for f in "$G"/sessions/*; do
    [ -f "$f" ] || continue
    other=${f##*/}
    [ "$other" = "$S" ] && continue
    R=$(head -c 64 "$f" 2>/dev/null)
    case "$R" in ""|*[!0-9a-z-]*) continue;; esac
    if tmux has-session -t "=$other" 2>/dev/null; then how="tmux session $other"
    elif between_attempts "$G/runs/$R"; then how="tmux session $other, between attempts"
    else continue; fi
    used=$(grep -o '"gpus":\[[0-9,]*\]' "$G/runs/$R/meta.json" 2>/dev/null | tr -dc '0-9,')
    for N in "$@"; do
      case ",$used," in *",$N,"*) echo "@@gpuops gpu-held $N run $R ($how)"; exit 75;; esac
    done
  done
fi

stale=$(head -c 300 "$L.holder" 2>/dev/null)
printf '%s\n' "$HOLDER" >"$L.holder"
for N in "$@"; do printf 'session %s: %s\n' "$S" "$HOLDER" >"$G/locks/gpu-$N.holder"; done
[ -n "$stale" ] && echo "@@gpuops stale $stale"
close_locks() { exec 9>&-; for fd in "${gpu_fds[@]}"; do exec {fd}>&-; done; }
( close_locks; bash "$HERE/probe.sh" ${health[@]+"${health[@]}"} "$S" )
echo "@@gpuops locked-ok"

# Hold the locks while the launcher sends heartbeats; a silent launcher is a dead one. A launcher
# that ends normally says `release`; one that died leaves its name in the holder file, so the
# next launch reports the recovery (`stale`).
released=
while IFS= read -r -t 30 line; do [ "$line" = release ] && { released=1; break; }; done
# A launcher that died during warmup left its warmup running (holding the GPU): stop it, as the
# launcher would have, before the locks are free. Quietly: our stdout may be gone with it.
R=$(head -c 64 "$G/sessions/$S" 2>/dev/null)
case "$R" in ""|*[!0-9a-z-]*) R="";; esac
if [ -z "$released" ] && [ -n "$R" ] && grep -qsF '"phase":"warmup"' "$G/runs/$R/meta.json" \
    && ! tmux has-session -t "=$S" 2>/dev/null; then
  ( close_locks; bash "$HERE/kill_marked.sh" "$R" ) >/dev/null 2>&1
fi
if [ -n "$released" ]; then
  rm -f "$L.holder"
  for N in "$@"; do rm -f "$G/locks/gpu-$N.holder"; done
fi
true
