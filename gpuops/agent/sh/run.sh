#!/usr/bin/env bash
# What the run's tmux session runs: the workdir, the env, the training command on a terminal of its
# own in this pane (run/pane.py: its output to the log byte for byte and to the pane, what is typed
# here to it), and its exit code recorded (also when it dies by a signal).
# Every attempt's training sees GPUOPS_ATTEMPT and GPUOPS_MAX_ATTEMPTS, and from the second on
# GPUOPS_RESTART_AFTER (the rule that ended the attempt before) and restart.command, where the playbook
# has one, in place of launch.command.
# Usage: run.sh RUN_ID PYTHON [ATTEMPT MAX_ATTEMPTS [RESTART_AFTER]]
#   (PYTHON: the interpreter that runs the agent; its package beside sh/)
set -u
# shellcheck source=SCRIPTDIR/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_dir "$1"
py=${2:-python3}
lib="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
printf 'gpuops run %s (log: %s). Ctrl-C here ends the run; C-b d detaches.\n' "$1" "$D/log"
if ! enter_workdir 2>"$D/cd.err"; then
  # The reason (bash's own words, less its "line N: cd: " prefix) goes into the log.
  printf 'gpuops: cannot cd to the workdir: %s; training not started\n' \
    "$(sed 's/^.*line [0-9]*: cd: //' "$D/cd.err")" | tee -a "$D/log"
  echo 126 >"$D/exit_code"
  exit 126
fi
load_env
guard_env
export GPUOPS_ATTEMPT="${3:-1}" GPUOPS_MAX_ATTEMPTS="${4:-1}"
command="$D/command"
if [ "$GPUOPS_ATTEMPT" != 1 ]; then
  export GPUOPS_RESTART_AFTER="${5:-}"
  [ -f "$D/restart-command" ] && command="$D/restart-command"
fi
# A node of a torchrun job: this attempt's rendezvous id (its command passes --rdzv-id "$GPUOPS_RDZV_ID").
if [ -f "$D/rdzv-id" ]; then GPUOPS_RDZV_ID="$(cat "$D/rdzv-id")"; export GPUOPS_RDZV_ID; fi
# Trapped (not ignored) signals: the command gets them with default handling, and this script
# survives to record the exit code.
trap 'true' INT TERM HUP QUIT
# The relay is imported from the agent's folder; the training starts in this workdir.
wd=$PWD
(cd "$lib" && exec "$py" -E -s -m gpuops_agent pane "$1" "$wd" "$command")
code=$?
printf '%s\n' "$code" >"$D/exit_code.tmp" && mv -f "$D/exit_code.tmp" "$D/exit_code"
