#!/usr/bin/env bash
# Kill every process of a run: those whose environment holds GPUOPS_RUN_ID=<run id> (the job, and
# compile or data workers that left its process group or session), and every process below them (a
# worker started with `setsid env -i ...` carries no marker, but it is a child). TERM, then KILL.
# Usage: kill_marked.sh RUN_ID [TERM_WAIT_SECONDS]   Prints "@@gpuops killed 0" or "@@gpuops survivors PIDS".
# The watchdog never carries the marker, so it is never among them.
set -u
case "${1:-}" in ""|*[!0-9a-z-]*) echo "kill_marked.sh: not a run id: ${1:-}" >&2; exit 2;; esac
M="GPUOPS_RUN_ID=$1"
steps=$(( ${2:-3} * 20 ))
MD="GPUOPS_RUN_DIR=$HOME/.gpuops/runs/$1"
# A process marked with the run id but another run directory is another home's run of the same id: a
# node of the same torchrun job in another container on this kernel (one PID namespace, as the test
# bench's containers share): never this run's.
marked() {
  local f
  grep -lzxF -- "$M" /proc/[0-9]*/environ 2>/dev/null | while IFS= read -r f; do
    if grep -qzF -- "GPUOPS_RUN_DIR=" "$f" 2>/dev/null && ! grep -qzxF -- "$MD" "$f" 2>/dev/null; then continue; fi
    f=${f#/proc/}; f=${f%/environ}
    [ "$f" != "$$" ] && echo "$f"
  done
}
# below PIDS...: every live process under them, from one pass over /proc/*/stat (field 4 is the parent).
below() {
  local -A kids=()
  local f line rest ppid pid todo out="" p c
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    rest=${line##*) }; ppid=${rest#* }; ppid=${ppid%% *}
    pid=${f#/proc/}; pid=${pid%/stat}
    kids[$ppid]+=" $pid"
  done
  todo="$*"
  while [ -n "$todo" ]; do
    # shellcheck disable=SC2086 # word splitting of the pid list is wanted
    set -- $todo; todo=""
    for p in "$@"; do
      for c in ${kids[$p]:-}; do
        case " $out " in *" $c "*) ;; *) out="$out $c"; todo="$todo $c";; esac
      done
    done
  done
  echo "$out"
}
found=""  # the run's unmarked descendants, remembered: once their parent dies they are init's children
live() {  # the pids given that still run (no zombie)
  local q
  for q in "$@"; do
    [ "$q" != "$$" ] && [ -e "/proc/$q" ] && ! grep -q "^State:[[:space:]]*Z" "/proc/$q/status" 2>/dev/null && echo "$q"
  done
}
pids() {
  local m
  m=$(marked)
  # shellcheck disable=SC2086
  { printf '%s\n' $m; live $found; } | sort -un
}
grow() {  # remember what is below the run's processes now
  local m
  m=$(marked)
  # shellcheck disable=SC2086
  found="$found $(below $m $found)"
}
grow
p=$(pids)
if [ -z "$p" ]; then echo "@@gpuops killed 0"; exit 0; fi
# shellcheck disable=SC2086 # word splitting of the pid list is wanted
kill -TERM $p 2>/dev/null
i=0
while [ $i -lt $steps ]; do p=$(pids); [ -z "$p" ] && break; sleep 0.05; i=$((i+1)); done
grow
p=$(pids)
# shellcheck disable=SC2086
[ -n "$p" ] && kill -KILL $p 2>/dev/null
i=0
while [ $i -lt 100 ]; do p=$(pids); [ -z "$p" ] && break; sleep 0.05; i=$((i+1)); done
p=$(pids)
echo "@@gpuops survivors $(printf '%s\n' "$p" | tr '\n' ' ')"
