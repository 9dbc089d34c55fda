#!/usr/bin/env bash
# On a Proxmox host: run a command in a container, and when `pct exec` fails say so and what
# `pct status` says, in the same round trip (the happy path costs one raw `pct exec`).
# Sent as the program of `bash -c` (it runs on the host, where no gpuops files are shipped).
# Usage: pct_exec.sh CTID COMMAND [ARG...]   The command's stdout and stderr, merged; after a failed
# exec: "@@gpuops pct_exec_rc RC", pct status's output, "@@gpuops pct_rc RC" (protocol.parse_pct_exec).
set -u
ct=$1
shift
pct exec "$ct" -- "$@" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "@@gpuops pct_exec_rc $rc"
  pct status "$ct" 2>&1
  echo "@@gpuops pct_rc $?"
fi
exit 0
