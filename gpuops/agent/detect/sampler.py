"""The watchdog's one nvidia-smi loop: memory, utilisation and the health fields of the run's GPUs, every sample.

One process samples every GPU of the run (`-lms`: the driver is opened once, not every sample), its output read
without blocking. Each sample is a GpuSample (index -> MiB used, utilisation %: what the quiet-failure
detectors judged before) and a HealthSample (each GPU's health row, the GPUs nvidia-smi could not open, those
it left out): the hardware detectors judge those (gpu_ecc, gpu_lost, gpu_slowdown). The loop form with the
health fields appended is the real driver's (tests/data/real_h200/health/loop-health.txt, load.txt). A
field an older driver refuses (`Field "x" is not a valid field to query.`, exit 2: the whole query fails) is
taken out, or spelled its older way, and the loop started again at once: memory is sampled whatever the driver.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import IO, Dict, List, Optional, Tuple

from ..system.procs import die_with_parent, end_child
from ..wire.health import LOOP_HEALTH, GpuHealth, LostGpu, parse_health, refused_field, without
from ..wire.smi import SAMPLE_FIELDS, GpuSample, SmiError

#: Seconds before a sampler that died is started again.
RESTART_AFTER = 30.0
#: What the sampler says when the driver refused one of its health fields (the samples go on).
REFUSED = "this driver's nvidia-smi does not know the health field"


@dataclass
class HealthSample:
    """The run's GPUs' health at one sample: each GPU's row, those nvidia-smi could not open, those it left out."""

    rows: Dict[int, GpuHealth] = field(default_factory=dict)
    lost: List[LostGpu] = field(default_factory=list)
    missing: List[int] = field(default_factory=list)


Reading = Tuple[GpuSample, HealthSample]


class Sampler:
    """`nvidia-smi --query-gpu=index,memory.used,utilization.gpu,<health> ... -lms N` read without blocking."""

    def __init__(self, gpus: List[int], interval: float, health: bool = True) -> None:
        self.gpus, self.interval = gpus, interval
        self.fields: Tuple[str, ...] = tuple(SAMPLE_FIELDS.split(",")) + (LOOP_HEALTH if health else ())
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.buf = b""
        self.rows: Dict[int, bytes] = {}
        self.lost: Dict[str, LostGpu] = {}
        self.down_since: Optional[float] = None
        self.problem: Optional[str] = None  # why there are no samples (said once)
        self.refused: List[str] = []  # health fields this driver does not know

    def argv(self) -> List[str]:
        wanted = ",".join(str(int(g)) for g in self.gpus)
        return ["nvidia-smi", "--query-gpu=" + ",".join(self.fields), "--format=csv,noheader,nounits",
                "-i", wanted, "-lms", str(max(100, int(self.interval * 1000)))]

    def start(self, now: float) -> None:
        try:
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        except OSError as exc:
            self.problem, self.down_since = "nvidia-smi cannot run: %s" % (exc.strerror or exc), now
            return
        os.set_blocking(self._out().fileno(), False)

    def _out(self) -> IO[bytes]:
        assert self.proc is not None and self.proc.stdout is not None  # started with stdout=PIPE
        return self.proc.stdout

    def fds(self) -> List[int]:
        return [self._out().fileno()] if self.proc is not None else []

    def poll(self, now: float) -> List[Reading]:
        """The complete samples that arrived."""
        if self.proc is None:
            if self.down_since is None or now - self.down_since >= RESTART_AFTER:
                self.start(now)
            return []
        try:
            raw = self._out().read()  # None: nothing yet; b"": its pipe closed
        except OSError:
            raw = None
        self.buf += raw or b""
        out: List[Reading] = []
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            out += self._line(line, now)
        if len(self.rows) + len(self.lost) >= len(self.gpus) and self.rows:
            out += self._sample()
        code = self.proc.poll()
        if code is None and raw == b"":  # its pipe closed: of no more use (and it would wake every wait)
            self.proc.kill()
            code = self.proc.wait()
        if code is not None:
            if self.rows or self.lost:
                out += self._sample()
            self.proc, self.down_since = None, now
            self.problem = self.problem or "nvidia-smi exited with code %s" % code
            if self.refused and self.refused[-1] == "":  # a field was taken out: start again at once
                self.refused.pop()
                self.down_since = None
        return out

    def _line(self, line: bytes, now: float) -> List[Reading]:
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return []
        refused = refused_field(text)
        if refused is not None and refused in self.fields and refused not in self.refused:
            self.fields = without(self.fields, refused)
            self.refused += [refused, ""]  # "": restart now
            self.problem = "%s %s: the loop goes on without it" % (REFUSED, refused)
            return []
        head = text.split(",", 1)[0].strip()
        if head.isdigit():
            out = self._sample() if int(head) in self.rows else []
            self.rows[int(head)] = line
            return out
        if text.startswith("Unable to determine the device handle"):
            lost = parse_health(text, self.fields).lost[0]
            key = lost.bus_id or text
            out = self._sample() if key in self.lost else []
            self.lost[key] = lost
            return out
        self.problem = text[:300] or "nvidia-smi failed"  # an error text: the loop is of no use
        return []

    def _sample(self) -> List[Reading]:
        text = b"\n".join(self.rows[i] for i in sorted(self.rows)).decode("utf-8", "replace")
        lost = list(self.lost.values())
        self.rows, self.lost = {}, {}
        try:
            reading = parse_health(text, self.fields)
        except SmiError as exc:
            self.problem = str(exc)[:300]
            return []
        rows = reading.by_index()
        sample: GpuSample = {i: (h.count("memory.used"), h.count("utilization.gpu")) for i, h in rows.items()}
        return [(sample, HealthSample(rows, lost, [g for g in self.gpus if g not in rows]))]

    def stop(self) -> None:
        end_child(self.proc)
