#!/usr/bin/env bash
# Everything status and preflight need, in one round trip: the clock, the GPUs, the tools the
# watchdog needs, and for each gpuops session its tmux session, launch lock and current run.
# Usage: probe.sh [-s] [-n] [-H FIELDS] [SESSION...]   (-s: also the tail of each run's GPU samples; -n: not
# python3's version, which only preflight needs; -H: the GPUs' health, FIELDS appended to the GPU query (preflight,
# gpuops health; agent/wire/health.py); no SESSION: all)
# Prints marker lines (gpuops/agent/wire/protocol.py MARKS) with raw sections between them.
# Every process it starts costs the status that waits for it: bash builtins where they do the job.
set -u
G="$HOME/.gpuops"
samples=
python=1
health=
while [ $# -gt 0 ]; do
  case "$1" in
    -s) samples=1; shift;;
    -n) python=; shift;;
    -H) health=$2; shift 2;;
    *) break;;
  esac
done

now=${EPOCHREALTIME:-}  # bash >= 5: the clock without a date process (a locale may write a comma)
[ -n "$now" ] || now=$(date +%s.%N)
echo "@@gpuops now ${now/,/.}"
# The two nvidia-smi queries run side by side: each call initialises the driver (tens of ms). The
# compute apps come back through a pipe, read with builtins (no temporary files, no cat, no rm).
if command -v nvidia-smi >/dev/null 2>&1; then
  exec 3< <(nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv,noheader,nounits 2>&1
            echo "@@gpuops apps_rc $?")
  if [ -z "$health" ]; then
    echo "@@gpuops gpus"
    nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits 2>&1
    echo "@@gpuops gpus_rc $?"
  else
    fields=index,uuid,memory.used,memory.total,utilization.gpu,$health
    for _ in 1 2 3 4 5 6; do  # a field this driver does not know fails the whole query: ask again without it
      out=$(nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits 2>&1); rc=$?
      if [ "$rc" -ne 2 ]; then break; fi
      case "$out" in 'Field "'*'" is not a valid field to query.'*) ;; *) break;; esac
      bad=${out#Field \"}; bad=${bad%%\"*}
      echo "@@gpuops health_refused $bad"
      case "$bad" in clocks_event_reasons.*) alias=clocks_throttle_reasons.${bad#clocks_event_reasons.};; *) alias=;; esac
      fields=$(printf '%s\n' "$fields" | tr ',' '\n' | sed "s/^$bad\$/$alias/" | grep -v '^$' | paste -sd,)
    done
    echo "@@gpuops health_fields $fields"
    echo "@@gpuops gpus"
    if [ -n "$out" ]; then printf '%s\n' "$out"; fi
    echo "@@gpuops gpus_rc $rc"
  fi
  echo "@@gpuops apps"
  while IFS= read -r line <&3 || [ -n "$line" ]; do printf '%s\n' "$line"; done
  exec 3<&-
else
  echo "@@gpuops nosmi"
fi
command -v tmux >/dev/null 2>&1 || echo "@@gpuops notmux"
if [ -z "$python" ]; then
  :
elif command -v python3 >/dev/null 2>&1; then
  echo "@@gpuops python $(python3 -E -s -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>&1 | head -c 100)"
else
  echo "@@gpuops nopython"
fi

# running PID: the process exists and is no zombie (a killed process its parent never reaped).
running() {
  local st
  [ -n "$1" ] && st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}

list_sessions() {
  if [ $# -gt 0 ]; then
    printf '%s\n' "$@"
  else
    for f in "$G"/sessions/*; do [ -f "$f" ] && printf '%s\n' "${f##*/}"; done
  fi
}

list_sessions "$@" | while IFS= read -r S; do
  echo "@@gpuops session $S"
  if tmux has-session -t "=$S" 2>/dev/null; then echo "@@gpuops alive"; fi
  if [ -f "$G/locks/$S.lock" ] && ! flock -n "$G/locks/$S.lock" true 2>/dev/null; then
    echo "@@gpuops locked $(head -c 300 "$G/locks/$S.holder" 2>/dev/null | tr -d '\n')"
  fi
  R=$(head -c 64 "$G/sessions/$S" 2>/dev/null)
  # A session pointer holds a run id ([0-9a-z-]); anything else (tampered, half-written) names no run.
  case "$R" in ""|*[!0-9a-z-]*) continue;; esac
  D="$G/runs/$R"
  [ -d "$D" ] || continue
  echo "@@gpuops run $R"
  # meta.json and abort.json whole, up to the agent's own record limit (records.read_json): a matched
  # line of 64 KiB is up to 12 times as long JSON-escaped, and a cut record names no rule.
  [ -f "$D/meta.json" ] && echo "@@gpuops meta $(head -c 1048576 "$D/meta.json" | tr -d '\n')"
  [ -f "$D/exit_code" ] && echo "@@gpuops exit $(head -c 16 "$D/exit_code" | tr -d '\n')"
  [ -f "$D/started" ] && echo "@@gpuops started"
  [ -f "$D/abort.json" ] && echo "@@gpuops abort $(head -c 1048576 "$D/abort.json" | tr -d '\n')"
  [ -f "$D/abort-done.json" ] && echo "@@gpuops abort_done $(head -c 16384 "$D/abort-done.json" | tr -d '\n')"
  if [ -f "$D/watchdog.json" ]; then
    echo "@@gpuops watchdog $(head -c 16384 "$D/watchdog.json" | tr -d '\n')"
    # Its processes: the watchdog, and the supervisor that would start it again.
    wpid=$(grep -o '"pid":[0-9]*' "$D/watchdog.json" | head -n 1 | tr -dc '0-9')
    spid=$(head -c 16 "$D/supervisor.pid" 2>/dev/null | tr -dc '0-9')
    if running "$wpid" || running "$spid"; then
      echo "@@gpuops watchdog_pid alive"
    else
      echo "@@gpuops watchdog_pid dead"
    fi
  fi
  [ -f "$D/log" ] && echo "@@gpuops log $(stat -c '%s %Y' "$D/log")"
  # The GPU fault that ended it (hardware.json), and the host's kernel-log follower (host-xids.jsonl: its first
  # record, whether its link here lives, its last Xids, its end).
  [ -f "$D/hardware.json" ] && echo "@@gpuops hardware $(head -c 65536 "$D/hardware.json" | tr -d '\n')"
  if [ -f "$D/host-xids.jsonl" ]; then
    IFS= read -r first <"$D/host-xids.jsonl"
    echo "@@gpuops host_log ${first:0:16384}"
    lp=${first#*\"link_pid\":}; lp=${lp%%[!0-9]*}
    if [ "$lp" != "$first" ] && running "$lp"; then echo "@@gpuops host_log_pid alive"; else echo "@@gpuops host_log_pid dead"; fi
    tail -n 64 "$D/host-xids.jsonl" | grep -F '"kind":"xid"' | tail -n 8 | while IFS= read -r x; do
      echo "@@gpuops host_xid ${x:0:16384}"
    done
    last=$(tail -n 1 "$D/host-xids.jsonl")
    case "$last" in *'"kind":"ended"'*) echo "@@gpuops host_log_end ${last:0:16384}";; esac
  fi
  # The compile guard's counts, one record per Python process that compiled (at most 64).
  n=0
  for f in "$D"/compile-guard-counts/*.json; do
    [ -f "$f" ] || continue
    n=$((n + 1)); [ "$n" -le 64 ] || break
    echo "@@gpuops guard_counts $(head -c 4096 "$f" | tr -d '\n')"
  done
  if [ -n "$samples" ] && [ -f "$D/samples.jsonl" ]; then
    echo "@@gpuops samples"
    tail -c 24576 "$D/samples.jsonl"
    echo
    echo "@@gpuops samples_end"
  fi
done
true
