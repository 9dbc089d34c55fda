"""Record what a real GPU machine answers to the GPU-health queries gpuops sends, and what its kernel log
and PyTorch's Flight Recorder give (standard library; torch only in the Flight Recorder case's workers).

    python3 tools/real_health.py OUTDIR

OUTDIR/health/: one file per query (`<name>.txt`: the exact argv, the output, the exit status), the
kernel-log probes, a load phase (the sampler's loop query beside nvidia-smi's own dmon while a matmul
runs), and OUTDIR/fr/: a two-rank gloo job under torchrun where rank 1 skips its 6th all_reduce, each
rank's Flight Recorder dump taken from a helper thread while the main thread waits in the collective,
and whether a Python signal handler ran meanwhile. Nothing is edited afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List

#: The per-GPU health fields of `--query-gpu` (driver 580 names; the old `clocks_throttle_reasons.*`
#: spelling is recorded separately).
HEALTH_FIELDS = [
    "index", "pci.bus_id", "uuid", "name",
    "ecc.mode.current", "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending", "retired_pages.sbe", "retired_pages.dbe",
    "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
    "clocks_event_reasons.active", "clocks_event_reasons.hw_slowdown", "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown", "clocks_event_reasons.sw_thermal_slowdown",
    "clocks_event_reasons.sw_power_cap",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "pcie.link.gen.gpucurrent", "pcie.link.gen.gpumax", "pcie.link.gen.hostmax",
    "temperature.gpu", "temperature.memory", "power.draw", "power.limit", "pstate",
    "clocks_event_reasons.supported", "gpu_recovery_action",
]
#: Refused by driver 580.159 ("is not a valid field to query", exit 2): recorded so the stand-in refuses them too.
REFUSED_FIELDS = ["reset_status.reset_required", "reset_status.drain_and_reset_recommended"]
SAMPLE_FIELDS = "index,memory.used,utilization.gpu"
HERE = Path(__file__).resolve().parent


def record(out: Path, name: str, argv: List[str], timeout: float = 60, env: dict | None = None) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        text, code = done.stdout + done.stderr, str(done.returncode)
    except FileNotFoundError as exc:
        text, code = str(exc) + "\n", "not found"
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        code = "timeout after %ss" % timeout
    (out / (name + ".txt")).write_text("$ %s\n%s## exit %s\n" % (" ".join(argv), text, code))
    return text


def smi(out: Path) -> None:
    s = "nvidia-smi"
    record(out, "version", [s, "--version"])
    record(out, "help-query-gpu", [s, "--help-query-gpu"])
    record(out, "help-query-remapped-rows", [s, "--help-query-remapped-rows"])
    record(out, "help-query-retired-pages", [s, "--help-query-retired-pages"])
    all_fields = ",".join(HEALTH_FIELDS)
    record(out, "health-csv-noheader", [s, "--query-gpu=" + all_fields, "--format=csv,noheader"])
    record(out, "health-csv-noheader-nounits", [s, "--query-gpu=" + all_fields, "--format=csv,noheader,nounits"])
    record(out, "health-csv", [s, "--query-gpu=" + all_fields, "--format=csv"])
    record(out, "health-csv-i0", [s, "--query-gpu=" + all_fields, "--format=csv,noheader,nounits", "-i", "0"])
    with open(out / "health-each-field.txt", "w") as f:  # which fields the driver takes, one at a time
        for field in HEALTH_FIELDS + REFUSED_FIELDS:
            done = subprocess.run([s, "--query-gpu=" + field, "--format=csv,noheader"], capture_output=True, text=True)
            f.write("%s\t%s\t%s\n" % (field, done.returncode, (done.stdout + done.stderr).strip()))
    old = "clocks_throttle_reasons.active,clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.hw_thermal_slowdown"
    record(out, "old-throttle-names", [s, "--query-gpu=" + old, "--format=csv,noheader"])
    record(out, "unknown-field", [s, "--query-gpu=index,ecc.errors.bogus", "--format=csv,noheader"])
    record(out, "remapped-rows", [s, "--query-remapped-rows=gpu_bus_id,gpu_uuid,remapped_rows.correctable,"
                                  "remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure", "--format=csv"])
    record(out, "remapped-rows-noheader", [s, "--query-remapped-rows=gpu_bus_id,gpu_uuid,remapped_rows.correctable,"
                                           "remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure",
                                           "--format=csv,noheader,nounits"])
    record(out, "retired-pages", [s, "--query-retired-pages=gpu_bus_id,gpu_uuid,retired_pages.address,retired_pages.cause",
                                  "--format=csv"])
    record(out, "q-health", [s, "-q", "-d", "ECC,ROW_REMAPPER,PERFORMANCE,TEMPERATURE,PAGE_RETIREMENT"])
    record(out, "q-reset-status", [s, "-q", "-d", "RESET_STATUS"])
    record(out, "q-full", [s, "-q"])
    record(out, "q-bad-display", [s, "-q", "-d", "NOSUCH"])
    record(out, "index-out-of-range", [s, "--query-gpu=" + all_fields, "--format=csv,noheader", "-i", "5"])
    record(out, "index-one-missing", [s, "--query-gpu=" + all_fields, "--format=csv,noheader", "-i", "0,5"])
    record(out, "by-bus-id", [s, "--query-gpu=index,pci.bus_id", "--format=csv,noheader", "-i", "00000000:00:06.0"])
    record(out, "loop-health", [s, "--query-gpu=" + SAMPLE_FIELDS + ",ecc.errors.uncorrected.volatile.total,"
                                "remapped_rows.pending,remapped_rows.failure,clocks_event_reasons.active,pci.bus_id",
                                "--format=csv,noheader,nounits", "-lms", "500", "-i", "0"], timeout=3)


def load(out: Path) -> None:
    """A matmul for 14 s: the watchdog's loop query, one-shot queries and dmon side by side."""
    script = HERE / "real_health_load.py"
    worker = subprocess.Popen([sys.executable, str(script), "14"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    time.sleep(3)
    loop = subprocess.Popen(["nvidia-smi", "--query-gpu=" + SAMPLE_FIELDS, "--format=csv,noheader,nounits",
                             "-lms", "500", "-i", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    loop_s = subprocess.Popen(["nvidia-smi", "--query-gpu=" + SAMPLE_FIELDS, "--format=csv,noheader,nounits",
                               "-lms", "2000", "-i", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    loop_h = subprocess.Popen(["nvidia-smi", "--query-gpu=" + SAMPLE_FIELDS + "," + ",".join(HEALTH_FIELDS[1:]),
                               "--format=csv,noheader,nounits", "-lms", "1000", "-i", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    dmon = subprocess.Popen(["nvidia-smi", "dmon", "-s", "um", "-c", "8"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    shots = []
    for _ in range(8):
        done = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(HEALTH_FIELDS), "--format=csv,noheader"],
                              capture_output=True, text=True)
        shots.append("%.2f %s" % (time.time(), done.stdout.strip()))
        time.sleep(1)
    dmon_out = dmon.communicate(timeout=30)[0]
    for proc in (loop, loop_s, loop_h):
        proc.terminate()
    loop_out, loop_s_out, loop_h_out = loop.communicate()[0], loop_s.communicate()[0], loop_h.communicate()[0]
    worker_out = worker.communicate(timeout=60)[0].decode(errors="replace")
    (out / "load.txt").write_text(
        "## the watchdog's loop query, -lms 500, during a bf16 matmul loop\n" + loop_out +
        "## the same, -lms 2000\n" + loop_s_out +
        "## the sample fields and every health field, nounits, -lms 1000\n" + loop_h_out +
        "## nvidia-smi dmon -s um -c 8, same time\n" + dmon_out +
        "## one-shot health queries under load (epoch, row)\n" + "\n".join(shots) + "\n" +
        "## worker\n" + worker_out)


def kernel_log(out: Path) -> None:
    record(out, "dmesg", ["dmesg"])
    record(out, "dmesg-nvrm", ["bash", "-c", "dmesg | grep -i -E 'nvrm|xid|nvidia' | head -50"])
    record(out, "dmesg-time-format", ["dmesg", "--time-format", "iso"])
    record(out, "dmesg-follow", ["timeout", "2", "dmesg", "--follow", "--since", "now"], timeout=5)
    record(out, "journalctl-k", ["journalctl", "-k", "-n", "20", "--no-pager"])
    record(out, "journalctl-k-json", ["journalctl", "-k", "-n", "3", "-o", "json", "--no-pager"])
    record(out, "kmsg", ["bash", "-c", "ls -l /dev/kmsg; cat /proc/sys/kernel/dmesg_restrict; "
                         "timeout 1 head -c 2000 /dev/kmsg; echo; id"])
    record(out, "dmesg-as-nobody", ["bash", "-c", "command -v setpriv && setpriv --reuid=65534 --regid=65534 "
                                    "--clear-groups dmesg | tail -3"])
    record(out, "os", ["bash", "-c", "uname -a; cat /etc/os-release | head -3; ls /sys/bus/pci/devices | head; "
                       "cat /proc/driver/nvidia/version 2>&1; ls /proc/driver/nvidia/gpus 2>&1"])


def flight_recorder(out: Path) -> None:
    script = HERE / "real_fr_train.py"
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(out / "ontimeout_"),
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    record(out, "torchrun", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--master-port", "29517", str(script), str(out)], timeout=150, env=env)
    record(out, "torchfrtrace", ["bash", "-c", "command -v torchfrtrace; cd %s && mkdir -p tr && "
                                 "cp rank0.pickle tr/trace_0 && cp rank1.pickle tr/trace_1 && "
                                 "%s -m torch.distributed.flight_recorder.fr_trace --prefix trace_ tr 2>&1 | tail -30"
                                 % (out, sys.executable)], timeout=60)


def main(argv: List[str]) -> int:
    top = Path(argv[0])
    if "--smi-only" in argv:
        health = top / "health"
        health.mkdir(parents=True, exist_ok=True)
        smi(health)
        load(health)
        return 0
    health, fr = top / "health", top / "fr"
    for d in (health, fr):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    t0 = time.time()
    smi(health)
    kernel_log(health)
    load(health)
    record(health, "after-load", ["nvidia-smi", "--query-gpu=" + ",".join(HEALTH_FIELDS), "--format=csv,noheader"])
    if "--no-fr" not in argv:
        flight_recorder(fr)
    (top / "took.json").write_text(json.dumps({"seconds": round(time.time() - t0, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
