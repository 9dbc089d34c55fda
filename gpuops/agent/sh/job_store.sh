#!/usr/bin/env bash
# The job link of one node of a torchrun job (agent/run/jobstore.py), with the training's environment:
# it needs the training's torch. It carries no run marker: the run's reap does not take it.
# Usage: job_store.sh RUN_ID
set -u
# shellcheck source=SCRIPTDIR/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_dir "$1"
enter_workdir 2>/dev/null || true
load_env
unset GPUOPS_RUN_ID GPUOPS_RUN_DIR
lib="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}"
exec python3 -m gpuops_agent job-store "$1"
