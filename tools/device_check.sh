#!/usr/bin/env bash
# gpuops against a real NVIDIA GPU and real PyTorch (run from the repo root on a GPU machine).
# Writes what it saw to $OUT (default ./device-out): real nvidia-smi formats, real PyTorch
# failure texts, and gpuops' own runs (status, preflight, warmup, abort) on the local target.
set -u
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
ROOT=$PWD
# A machine without a package registry gets click/pyyaml/rich wheels and the tmux .deb files carried in .whl/.
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>&1 | tail -2
  mkdir -p /tmp/tmuxroot && for d in .whl/*.deb; do dpkg -x "$d" /tmp/tmuxroot; done
  export PATH=/tmp/tmuxroot/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/tmuxroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
export PYTHONPATH=/tmp/site:$ROOT TMUX_TMPDIR=/tmp/gpuops-tmux HOME=/tmp/gpuops-home
unset TMUX
mkdir -p "$TMUX_TMPDIR" "$HOME"
G="python3 -m gpuops"

{
  echo "## versions"; nvidia-smi --version 2>&1 | head -3; python3 -c 'import torch; print("torch", torch.__version__)'; tmux -V; command -v flock
  for q in "--query-gpu=index,name,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader" \
           "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits" \
           "--query-gpu=index,memory.used --format=csv" \
           "--query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv,noheader,nounits" \
           "--query-gpu=index,xyz --format=csv" "-L" "--query-gpu=index --format=csv,noheader -i 5"; do
    echo "## nvidia-smi $q"; nvidia-smi $q; echo "## exit $?"
  done
  python3 tools/real_torch.py hold --gpu 0 --gib 2 --seconds 8 & sleep 6
  echo "## nvidia-smi compute apps while a process holds 2 GiB"
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv,noheader,nounits; echo "## exit $?"
  nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits
  wait
} >"$OUT/nvidia-smi.txt" 2>&1

for mode in fx-race fx-caught oom assert; do
  timeout 120 python3 tools/real_torch.py train --fail "$mode" --steps 14 --fail-at 5 >"$OUT/real_$mode.txt" 2>&1
  echo "## exit $?" >>"$OUT/real_$mode.txt"
done

cat >/tmp/inv.yaml <<'EOF'
hosts: {here: {transport: local}}
targets: {local: {host: here}}
EOF
play() {  # name preflight_gpus warmup_gpus command
  cat >/tmp/$1.yaml <<EOF
name: real-$1
target: local
workdir: $ROOT
preflight: {gpus: [$2], max_memory_used_mib: 1000}
$( [ -n "$3" ] && echo "warmup: {gpus: [$3], command: 'python3 tools/real_torch.py warmup --gpu {gpu}', timeout: 600}" )
launch: {session: real-$1, command: '$4'}
watch: {stall_timeout: 120}
abort: {signal: INT, grace: 10}
EOF
}
{
  echo "## gpuops status (real nvidia-smi)"; $G status -i /tmp/inv.yaml; echo "## exit $?"
  $G status --json -i /tmp/inv.yaml; echo "## exit $?"
  play fx 0 0 "python3 tools/real_torch.py train --fail fx-race"
  echo "## launch: warmup on GPU 0, then the real FX race (expect 7)"; $G launch -i /tmp/inv.yaml -p /tmp/fx.yaml; echo "## exit $?"
  echo "## GPU after the abort"; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits
  for m in fx-caught oom assert none; do
    play $m 0 "" "python3 tools/real_torch.py train --fail $m --steps 30"
    echo "## launch --fail $m (expect 7; none: 0)"; $G launch --json -i /tmp/inv.yaml -p /tmp/$m.yaml | tail -1; echo "## exit ${PIPESTATUS[0]}"
  done
  python3 tools/real_torch.py hold --gpu 0 --gib 4 --seconds 40 >/dev/null 2>&1 & sleep 8
  play busy 0 "" "python3 tools/real_torch.py train"
  echo "## launch while another process holds 4 GiB on GPU 0 (expect 4, nothing started)"; $G launch -i /tmp/inv.yaml -p /tmp/busy.yaml; echo "## exit $?"
  tmux ls 2>&1
  kill %1 2>/dev/null; wait
} >"$OUT/gpuops.txt" 2>&1
echo done
