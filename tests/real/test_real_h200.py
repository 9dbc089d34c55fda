"""The matcher and the nvidia-smi parser on output captured from a real H200 with real PyTorch.

tests/data/real_h200/README.md says how it was captured (tools/device_check.sh).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.agent.wire.signatures.matcher import Matcher, builtin_rules
from gpuops.client.launch.gpus import check_idle, parse_gpus

REAL = Path(__file__).parent.parent / "data" / "real_h200"


def _hits(name: str) -> list:
    m = Matcher(builtin_rules())
    data = (REAL / name).read_bytes()
    return m.feed(data) + m.finish()


def _section(text: str, title: str) -> str:
    """The lines under `## <title>` up to the next `##`."""
    out, on = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            on = line[3:] == title
            continue
        if on:
            out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("name, rule", [
    ("fx-race.log", "fx-tracing-race"),
    ("fx-caught.log", "fx-tracing-race"),
    ("oom.log", "cuda-oom"),
    ("assert.log", "cuda-error"),
])
def test_real_pytorch_failures_abort_with_the_right_rule(name: str, rule: str) -> None:
    hits = [h for h in _hits(name) if h.action == "abort"]
    assert hits, f"no abort hit in the real {name}"
    assert hits[0].rule == rule
    assert "Traceback (most recent call last):" in hits[0].excerpt


def test_real_caught_race_gives_one_hit_per_drafter_thread() -> None:
    hits = [h for h in _hits("fx-caught.log") if h.rule == "fx-tracing-race"]
    assert len(hits) == 3
    assert all("falling back to eager" in h.excerpt for h in hits)


def test_real_training_lines_and_warnings_alone_do_not_match() -> None:
    text = (REAL / "fx-race.log").read_text()
    clean = "\n".join(line for line in text.splitlines() if line.startswith("step ") or "UserWarning" in line or "warnings.warn" in line)
    m = Matcher(builtin_rules())
    assert m.feed(clean.encode()) + m.finish() == []


def test_real_nvidia_smi_rows_parse() -> None:
    text = (REAL / "nvidia-smi.txt").read_text()
    rows = _section(text, "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits")
    (gpu,) = parse_gpus(rows)
    assert (gpu.index, gpu.memory_used_mib, gpu.memory_total_mib, gpu.utilization_pct) == (0, 0, 143771, 0)


def test_real_busy_gpu_fails_the_idle_check() -> None:
    text = (REAL / "nvidia-smi.txt").read_text()
    apps = text.split("## nvidia-smi compute apps while a process holds 2 GiB", 1)[1].splitlines()
    app_rows = "\n".join(line for line in apps if line.count(",") == 3 and not line.startswith("0,"))
    gpu_rows = "\n".join(line for line in apps if line.startswith("0,") and line.count(",") == 4)
    (gpu,) = parse_gpus(gpu_rows, app_rows)
    assert gpu.memory_used_mib > 2048 and gpu.processes[0].name == "python3"
    (finding,) = check_idle([gpu], (0,), max_memory_mib=500, max_util_pct=10, allow_processes=False)
    assert not finding.ok and len(finding.problems) == 2
