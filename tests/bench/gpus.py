"""The fake GPU state that the nvidia-smi stand-in reads, and the helpers tests use to shape it.

A GPU state dir ($GPUOPS_FAKE_GPUS) holds:
  gpus.json            {"driver_version", "cuda_version", "compute_apps_visible", "gpus": [
                          {"index", "name", "uuid", "pci_bus_id", "memory_total",
                           "memory_used", "utilization"}, ...]}
                       memory_used / utilization are the baseline (another job's load).
                       No gpus.json: nvidia-smi fails as when no driver is loaded (exit 9).
                       Health (absent keys read as a healthy GPU, as tests/data/real_h200/health/ shows
                       one): "ecc_uncorrected_volatile", "ecc_corrected_volatile", "ecc_uncorrected_aggregate",
                       "remapped_correctable", "remapped_uncorrectable", "remap_pending", "remap_failure",
                       "slowdown" (clock-event reason names), "recovery_action", "pcie" ({gen, gen_max,
                       width, width_max}), "temperature", "requires_reset", "lost" (set_health).
  procs/<pid>.json     {"pid", "starttime", "name", "gpus": [{"gpu", "used_memory", "busy"}]}
                       written by stand-in workloads; an entry counts only while that
                       process lives (same pid and start time); nvidia-smi drops dead ones.
                       The flat form {"pid", "gpu", "used_memory", "name"} is read too.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

DRIVER_VERSION = "580.159"
CUDA_VERSION = "13.0"
GPU_NAME = "NVIDIA H200"
MEMORY_TOTAL_MIB = 143771
# REFERENCE.md's GPU 0; the others are derived the same way for every fake host.
FIRST_UUID = "GPU-df71818e-792d-a40d-e8f9-12f85bf764dd"
# PCI bus ids of the eight SXM slots of an HGX H200 board.
BUS_IDS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]


def gpu_uuid(index: int) -> str:
    """A stable UUID per GPU index, so a host and its containers agree on a GPU's identity."""
    if index == 0:
        return FIRST_UUID
    h = hashlib.sha1(f"gpuops-bench-gpu-{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def gpu_record(index: int) -> dict:
    bus = BUS_IDS[index] if index < len(BUS_IDS) else f"{0xE0 + index:02X}"
    return {
        "index": index,
        "name": GPU_NAME,
        "uuid": gpu_uuid(index),
        "pci_bus_id": f"00000000:{bus}:00.0",
        "memory_total": MEMORY_TOTAL_MIB,
        "memory_used": 0,
        "utilization": 0,
    }


def process_starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: with the pid it names one process even after pid reuse."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _write_json(path: Path, data: dict) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


class FakeGpus:
    """One GPU state dir: the GPUs of a host or a container as nvidia-smi there sees them."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def state_file(self) -> Path:
        return self.path / "gpus.json"

    @property
    def procs_dir(self) -> Path:
        return self.path / "procs"

    def create(self, count: int = 8) -> "FakeGpus":
        self.procs_dir.mkdir(parents=True, exist_ok=True)
        _write_json(
            self.state_file,
            {
                "driver_version": DRIVER_VERSION,
                "cuda_version": CUDA_VERSION,
                "compute_apps_visible": True,
                "gpus": [gpu_record(i) for i in range(count)],
            },
        )
        return self

    def state(self) -> dict:
        return json.loads(self._live_state_file().read_text())

    def _live_state_file(self) -> Path:
        off = self.path / "gpus.json.unloaded"
        return self.state_file if self.state_file.exists() else off

    def _update(self, change) -> None:
        path = self._live_state_file()
        data = json.loads(path.read_text())
        change(data)
        _write_json(path, data)

    def set_gpu(self, index: int, *, memory_used: int | None = None, utilization: int | None = None) -> None:
        """Set a GPU's baseline load (e.g. another job holding memory), on top of live processes."""

        def change(data: dict) -> None:
            for gpu in data["gpus"]:
                if gpu["index"] == index:
                    if memory_used is not None:
                        gpu["memory_used"] = int(memory_used)
                    if utilization is not None:
                        gpu["utilization"] = int(utilization)
                    return
            raise KeyError(f"no GPU {index} in {self.path}")

        self._update(change)

    def set_health(self, index: int, **health: object) -> None:
        """Give a GPU a health state nvidia-smi then reports (keys: the module docstring's health keys; None
        removes one): e.g. set_health(5, ecc_uncorrected_volatile=2), set_health(6, remap_failure=True),
        set_health(4, slowdown=["hw_thermal_slowdown"]), set_health(7, lost=True)."""
        known = {"ecc_uncorrected_volatile", "ecc_corrected_volatile", "ecc_uncorrected_aggregate",
                 "remapped_correctable", "remapped_uncorrectable", "remap_pending", "remap_failure", "slowdown",
                 "recovery_action", "pcie", "temperature", "requires_reset", "lost"}
        unknown = set(health) - known
        if unknown:
            raise KeyError(f"unknown health keys {sorted(unknown)} (known: {sorted(known)})")

        def change(data: dict) -> None:
            for gpu in data["gpus"]:
                if gpu["index"] == index:
                    for key, value in health.items():
                        if value is None:
                            gpu.pop(key, None)
                        else:
                            gpu[key] = value
                    return
            raise KeyError(f"no GPU {index} in {self.path}")

        self._update(change)

    def bus_id(self, index: int) -> str:
        """The GPU's pci.bus_id as nvidia-smi prints it (`00000000:9A:00.0`)."""
        return next(g["pci_bus_id"] for g in self.state()["gpus"] if g["index"] == index)

    def hide_compute_apps(self, hidden: bool = True) -> None:
        """Inside an LXC container the compute-apps list can be empty while memory is used."""
        self._update(lambda data: data.__setitem__("compute_apps_visible", not hidden))

    def unload_driver(self) -> None:
        """nvidia-smi then fails with the no-driver error (exit 9)."""
        if self.state_file.exists():
            os.replace(self.state_file, self.path / "gpus.json.unloaded")

    def load_driver(self) -> None:
        off = self.path / "gpus.json.unloaded"
        if off.exists():
            os.replace(off, self.state_file)

    def register(self, pid: int, gpu: int, used_memory: int, *, name: str = "python3", busy: bool = False) -> Path:
        """Record that live process `pid` holds `used_memory` MiB on `gpu` (it counts until the process ends)."""
        self.procs_dir.mkdir(parents=True, exist_ok=True)
        entry = self.procs_dir / f"{pid}.json"
        data = {"pid": pid, "starttime": process_starttime(pid), "name": name, "gpus": []}
        if entry.exists():
            data = json.loads(entry.read_text())
        data["gpus"] = [g for g in data["gpus"] if g["gpu"] != gpu]
        data["gpus"].append({"gpu": gpu, "used_memory": int(used_memory), "busy": busy})
        _write_json(entry, data)
        return entry

    def query(self, *fields: str, env: dict[str, str] | None = None) -> list[list[str]]:
        """Rows of `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` run against this dir."""
        from bench import BIN_DIR

        run_env = dict(os.environ if env is None else env)
        run_env["GPUOPS_FAKE_GPUS"] = str(self.path)
        out = subprocess.run(
            [str(BIN_DIR / "nvidia-smi"), f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            env=run_env,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        return [line.split(", ") for line in out.splitlines()]

    def memory_used(self, index: int) -> int:
        """memory.used of one GPU as nvidia-smi reports it now (baseline plus live processes)."""
        for idx, used in self.query("index", "memory.used"):
            if int(idx) == index:
                return int(used)
        raise KeyError(f"no GPU {index} in {self.path}")
