#!/usr/bin/env bash
# A notify `command` channel: in the run's workdir, with the playbook's env (but not the run's marker:
# the run's reap must not end a notification), the command, its payload in $GPUOPS_NOTIFY_JSON and
# its line in $GPUOPS_NOTIFY_TEXT (the caller exports both).
# Usage: notify.sh DIR COMMAND   (DIR: the run directory, or notify-test's folder with env.sh and workdir)
set -u
# shellcheck source=SCRIPTDIR/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
D=$1
enter_workdir || exit 126
if [ -f "$D/env.sh" ]; then
  # shellcheck disable=SC1091 # written per run by `gpuops launch` (per test by notify-test)
  . "$D/env.sh"
fi
exec bash -c "$2" </dev/null
