"""The bench host's kernel log, which the `dmesg` and `journalctl` stand-ins read (tests/standins/bin/_kmsg.py),
and the Xid lines tests append to it.

Every Xid line here is a real one, quoted from where it was seen (/work/notes/research/health-notes.md, section
2.2), with only its PCI address put in the GPU's place: tests must not teach gpuops made-up driver text.
"""

from __future__ import annotations

import time
from pathlib import Path

#: Xid -> the driver's lines for it, as quoted from real logs; {bus} is the GPU's `0000:9a:00`, {dev} its
#: `0000:9a:00.0`.
XID_LINES: dict[int, tuple[str, ...]] = {
    # leptonai/gpud components/accelerator/nvidia/sxid/README.md (R515-R565 format)
    79: ("NVRM: Xid (PCI:{bus}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
         "NVRM: GPU {dev}: GPU has fallen off the bus."),
    # NVIDIA/gpu-operator#1146
    48: ("NVRM: Xid (PCI:{bus}): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has "
         "been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",),
    # leptonai/gpud components/memory/testdata/dmesg.decode.iso.log
    13: ("NVRM: Xid (PCI:{bus}): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 9, TPC 1, "
         "SM 1): Out Of Range Address",),
    43: ("NVRM: Xid (PCI:{bus}): 43, pid=2924364, name=pt_main_thread, Ch 00000008",),
    # leptonai/gpud components/accelerator/nvidia/xid/testdata/dmesg-with-xid-119.log (H100)
    119: ("NVRM: Xid (PCI:{bus}): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response "
          "from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",),
    # stas00/ml-engineering compute/accelerator/nvidia/debug.md (A100, driver 510.73.08)
    63: ("NVRM: Xid (PCI:{bus}): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",),
    # NVIDIA/open-gpu-kernel-modules kern_gpu_error_cont_ga100.c's own examples (and NVIDIA's memory error docs)
    95: ("NVRM: Xid (PCI:{bus}): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",),
    94: ("NVRM: Xid (PCI:{bus}): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",),
    # NVIDIA/open-gpu-kernel-modules#1150 (driver 590.48.01)
    45: ("NVRM: Xid (PCI:{bus}): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",),
}


def kernel_bus(bus_id: str) -> str:
    """nvidia-smi's `00000000:9A:00.0` as the driver's Xid line writes it: `0000:9a:00`."""
    domain, bus, rest = bus_id.split(":")
    return f"{domain[-4:]}:{bus}:{rest.split('.')[0]}".lower()


class KernelLog:
    """A host's kernel log file ($GPUOPS_FAKE_KMSG there). Absent, the host may not read it (dmesg refuses)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def enable(self, boot: float | None = None) -> "KernelLog":
        """Make it readable (root on the host), with the boot messages a real log starts with."""
        if not self.path.exists():
            booted = time.time() - 3600 if boot is None else boot
            self.path.with_name(self.path.name + ".boot").write_text(f"{booted:.6f}\n")
            self.path.write_text(
                f"{booted + 0.472903:.6f} nvidia: loading out-of-tree module taints kernel.\n"
                f"{booted + 0.544791:.6f} NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  "
                "Release Build  (nixbld@)  \n")
        return self

    def disable(self) -> None:
        self.path.unlink(missing_ok=True)

    def append(self, text: str, t: float | None = None) -> None:
        """One record (the kernel's clock: now, unless given)."""
        with self.path.open("a") as fh:
            fh.write(f"{time.time() if t is None else t:.6f} {text}\n")

    def append_xid(self, bus_id: str, xid: int, t: float | None = None) -> str:
        """The driver's real lines for Xid `xid` on the GPU with nvidia-smi bus id `bus_id`; returns the Xid line."""
        if xid not in XID_LINES:
            raise KeyError(f"no real line of Xid {xid} is quoted here (known: {sorted(XID_LINES)})")
        bus = kernel_bus(bus_id)
        lines = [line.format(bus=bus, dev=bus + ".0") for line in XID_LINES[xid]]
        for line in lines:
            self.append(line, t)
        return lines[0]
