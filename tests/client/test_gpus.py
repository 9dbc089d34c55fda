"""nvidia-smi parsing on real H200 output (REFERENCE.md) and the idle check preflight relies on."""

from __future__ import annotations

import pytest

from gpuops.client.launch.gpus import SmiError, check_idle, parse_gpus

UUID = "GPU-df71818e-792d-a40d-e8f9-12f85bf764dd"
REAL_NOUNITS = "0, 0, 143771, 0\n"  # index,memory.used,memory.total,utilization.gpu from a real H200
REAL_APPS = f"468, {UUID}, 910 MiB, python3\n"


def test_parses_real_rows_with_and_without_units() -> None:
    gpus = parse_gpus(f"0, {UUID}, 0, 143771, 0\n1, GPU-x, 910 MiB, 143771 MiB, 97 %\n", REAL_APPS)
    assert [(g.index, g.memory_used_mib, g.memory_total_mib, g.utilization_pct) for g in gpus] == [(0, 0, 143771, 0), (1, 910, 143771, 97)]
    assert gpus[0].processes[0].pid == 468 and gpus[0].processes[0].used_mib == 910 and gpus[0].processes[0].name == "python3"
    assert gpus[1].processes == ()


def test_empty_compute_apps_means_no_processes() -> None:
    (gpu,) = parse_gpus(f"0, {UUID}, 0, 143771, 0", "")
    assert gpu.processes == ()


def test_not_available_fields_are_none_not_zero() -> None:
    (gpu,) = parse_gpus(f"0, {UUID}, 3, 143771, [N/A]", f"[N/A], {UUID}, [N/A], [Not Found]")
    assert gpu.utilization_pct is None
    assert gpu.processes[0].pid is None


@pytest.mark.parametrize("text", [
    'Field "xyz" is not a valid field to query.',
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
])
def test_error_text_is_refused_not_misread(text: str) -> None:
    with pytest.raises(SmiError):
        parse_gpus(text)


def test_idle_check_reports_each_problem_against_thresholds() -> None:
    gpus = parse_gpus("5, A, 30000, 143771, 97\n6, B, 0, 143771, 0\n7, C, 900, 143771, 0\n", "1, C, 900 MiB, python3")
    findings = check_idle(gpus, (5, 6, 7, 8), max_memory_mib=500, max_util_pct=10, allow_processes=False)
    by = {f.index: f for f in findings}
    assert "30000 MiB used > 500 MiB" in by[5].problems and "utilisation 97% > 10%" in by[5].problems
    assert by[6].ok
    assert any("compute process" in p for p in by[7].problems)
    assert not by[8].ok and "not found" in by[8].problems[0]


def test_allow_processes_only_waives_the_process_check() -> None:
    gpus = parse_gpus("7, C, 100, 143771, 0\n", "1, C, 100 MiB, python3")
    assert check_idle(gpus, (7,), max_memory_mib=500, max_util_pct=10, allow_processes=True)[0].ok
