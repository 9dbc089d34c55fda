#!/usr/bin/env bash
# Sourced by run.sh and warmup.sh: the run directory, the stop check, the workdir and the env.
# shellcheck disable=SC2034 # D is used by the scripts that source this file

# run_dir RUN_ID: sets D, refusing anything that is not a run id.
run_dir() {
  case "${1:-}" in ""|*[!0-9a-z-]*) echo "gpuops: not a run id: ${1:-}" >&2; exit 2;; esac
  D="$HOME/.gpuops/runs/$1"
  [ -d "$D" ] || { echo "gpuops: no run directory $D" >&2; exit 2; }
}

# stopped_check: `gpuops stop` during a launch claimed abort.json: end before anything (more) starts. Exit 86
# is for a person reading: the client reads the stop from abort.json itself, since a warmup may print any
# line and exit with any status.
stopped_check() {
  if [ -f "$D/abort.json" ]; then exit 86; fi
}

# enter_workdir: cd as the playbook says ($D/workdir: empty = home, ~ and ~/... = the home, a
# relative path from the home as written, an absolute path). Fails with bash's own words on stderr.
enter_workdir() {
  local wd
  # The x keeps trailing newlines, which $( ) would strip: the name is used exactly as written.
  wd=$(cat "$D/workdir" 2>/dev/null; printf x)
  wd=${wd%x}
  cd "$HOME" || return 1
  # shellcheck disable=SC2088 # "~/"* is the literal text of the file, matched as a pattern
  case "$wd" in
    "") return 0;;
    "~") cd -- "$HOME" || return 1;;
    "~/"*) cd -- "$HOME/${wd#\~/}" || return 1;;
    *) cd -- "$wd" || return 1;;
  esac
}

# load_env: the playbook's env exports (mode 0600: they hold the secret values), then the run's marker.
load_env() {
  # shellcheck disable=SC1091 # written per run by `gpuops launch`
  . "$D/env.sh"
  export GPUOPS_RUN_ID="${D##*/}" GPUOPS_RUN_DIR="$D"
}

# guard_env: gpuops' folder first on PYTHONPATH (the playbook's PYTHONPATH kept after it), always: its
# sitecustomize.py registers the faulthandler the run's stacks come from. With the run's compile-guard
# record (launch.compile_guard, or a restarted attempt with restart.compile_guard) the job also runs
# under the compile guard: GPUOPS_COMPILE_GUARD=1. Called after load_env.
guard_env() {
  local guard
  guard="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/guard/pythonpath"  # its sitecustomize.py
  case ":${PYTHONPATH:-}:" in
    *":$guard:"*) ;;  # there already
    *) export PYTHONPATH="$guard${PYTHONPATH:+:$PYTHONPATH}";;
  esac
  [ -f "$D/compile-guard" ] || return 0
  export GPUOPS_COMPILE_GUARD=1
}
