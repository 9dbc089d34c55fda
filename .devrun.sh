#!/usr/bin/env bash
# One device session: the torchrun hang record, gpuops health on real nvidia-smi, the restart case, fd-1000 stacks.
set -u
T0=$(date +%s)
bash tools/device_setup.sh .whl > "$OUT/setup.txt" 2>&1; ldd /usr/sbin/sshd | grep "not found" >> "$OUT/setup.txt"; cat /etc/os-release | head -2 >> "$OUT/setup.txt"
export PYTHONPATH=/tmp/site:$PWD
P=/opt/torch/.venv/bin/python3
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version --format=csv; $P -c 'import torch;print(torch.__version__)'; } > "$OUT/machine.txt" 2>&1
timeout 300 $P tools/real_nodes.py "$OUT" --hang > "$OUT/hang-run.txt" 2>&1; echo "rc=$? t=$(( $(date +%s)-T0 ))" >> "$OUT/hang-run.txt"
true
true
if [ $(( $(date +%s)-T0 )) -lt 300 ]; then
  timeout $(( 560 - ($(date +%s)-T0) )) $P tools/real_nodes.py "$OUT" > "$OUT/nodes-run.txt" 2>&1; echo "rc=$? t=$(( $(date +%s)-T0 ))" >> "$OUT/nodes-run.txt"
fi
cd "$OUT" && for d in nodes-hang nodes; do [ -d $d ] && tar czf $d.tgz $d && rm -rf $d; done; ls -la "$OUT"
