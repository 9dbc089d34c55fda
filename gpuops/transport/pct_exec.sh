#!/usr/bin/env bash
# On a Proxmox host: run a command in a container, and when `pct exec` fails say so and what
# `pct status` says, in the same round trip (the happy path costs one raw `pct exec`).
# Sent as the program of `bash -c` (it runs on the host, where no gpuops files are shipped).
# Usage: pct_exec.sh CTID COMMAND [ARG...]   The command's stdout and stderr, merged; after a failed
# exec: "@@pct-exec-rc RC", pct status's output, "@@pct-status-rc RC" (pct.py's parse_pct_exec reads them).
set -u
ct=$1
shift
pct exec "$ct" -- "$@" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "@@pct-exec-rc $rc"
  pct status "$ct" 2>&1
  echo "@@pct-status-rc $?"
fi
exit 0
