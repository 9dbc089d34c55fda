#!/usr/bin/env bash
# Kill every process of a run: those whose environment holds GPUOPS_RUN_ID=<run id> (the job, and
# compile or data workers that left its process group or session). TERM, then KILL.
# Usage: kill_marked.sh RUN_ID [TERM_WAIT_SECONDS]   Prints "@@gpuops killed 0" or "@@gpuops survivors PIDS".
# The watchdog never carries the marker, so it is never among them.
set -u
case "${1:-}" in ""|*[!0-9a-z-]*) echo "kill_marked.sh: not a run id: ${1:-}" >&2; exit 2;; esac
M="GPUOPS_RUN_ID=$1"
steps=$(( ${2:-3} * 20 ))
pids() {
  grep -lzxF -- "$M" /proc/[0-9]*/environ 2>/dev/null | sed -e "s,/proc/,," -e "s,/environ,," | grep -vx "$$"
}
p=$(pids)
if [ -z "$p" ]; then echo "@@gpuops killed 0"; exit 0; fi
# shellcheck disable=SC2086 # word splitting of the pid list is wanted
kill -TERM $p 2>/dev/null
i=0
while [ $i -lt $steps ]; do p=$(pids); [ -z "$p" ] && break; sleep 0.05; i=$((i+1)); done
p=$(pids)
# shellcheck disable=SC2086
[ -n "$p" ] && kill -KILL $p 2>/dev/null
i=0
while [ $i -lt 100 ]; do p=$(pids); [ -z "$p" ] && break; sleep 0.05; i=$((i+1)); done
p=$(pids)
echo "@@gpuops survivors $(printf '%s\n' "$p" | tr '\n' ' ')"
