#!/usr/bin/env bash
# One GPU's warmup in the foreground, its output streamed back and kept in warmup-<gpu>.log; the
# exit code is the warmup's. `gpuops stop` during the launch ends it before or after (exit 86; the client
# reads the stop from abort.json, not from this status, which the warmup can exit with too).
# Usage: warmup.sh RUN_ID GPU COMMAND   (COMMAND has {gpu} replaced already)
set -u
# shellcheck source=SCRIPTDIR/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
run_dir "$1"
GPU=$2 COMMAND=$3
stopped_check
enter_workdir || exit 126
load_env
guard_env
export GPUOPS_GPU="$GPU" GPUOPS_PHASE="warmup-$GPU"
bash -c "$COMMAND" </dev/null 2>&1 | tee -a "$D/warmup-$GPU.log"
rc=${PIPESTATUS[0]}
stopped_check
exit "$rc"
