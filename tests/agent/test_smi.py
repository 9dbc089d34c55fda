"""The target-side nvidia-smi parser on real H200 output (tests/data/real_h200/nvidia-smi.txt, REFERENCE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.agent.wire import smi
from gpuops.agent.wire.smi import SmiError, parse_gpus, parse_sample, sample_argv
from gpuops.client.launch import gpus

REAL = Path(__file__).parent.parent / "data" / "real_h200" / "nvidia-smi.txt"


def section(title: str) -> str:
    """The output recorded under `## <title>` in the real capture, up to its `## exit` line."""
    text = REAL.read_text()
    start = text.index(f"## {title}\n") + len(title) + 4
    return text[start:text.index("## exit", start)]


def test_the_real_nounits_query_parses() -> None:
    (gpu,) = parse_gpus(section("nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits"))
    assert (gpu.index, gpu.uuid, gpu.memory_used_mib, gpu.memory_total_mib, gpu.utilization_pct) == (
        0, "GPU-e2c709da-2648-e261-973f-79bd6202ecc3", 0, 143771, 0)


def test_the_real_compute_app_holding_2_gib_is_attached_to_its_gpu() -> None:
    apps = section("nvidia-smi compute apps while a process holds 2 GiB")
    (gpu,) = parse_gpus("0, GPU-e2c709da-2648-e261-973f-79bd6202ecc3, 2575, 143771, 0", apps)
    assert gpu.processes == (smi.Process(478, 2566, "python3"),)


def test_the_real_empty_compute_apps_output_is_no_process() -> None:
    apps = section("nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory,process_name --format=csv,noheader,nounits")
    assert apps.strip() == ""
    (gpu,) = parse_gpus("0, GPU-x, 0, 143771, 0", apps)
    assert gpu.processes == ()


def test_a_sample_of_three_gpus_maps_index_to_memory_and_utilisation() -> None:
    # the compiled, eager and empty_cache phases of REFERENCE.md, one per GPU
    assert parse_sample("5, 1443, 17\n6, 6249, 19\n7, 4449, 15\n") == {5: (1443, 17), 6: (6249, 19), 7: (4449, 15)}


def test_a_sample_with_units_parses_the_same() -> None:
    assert parse_sample("5, 1443 MiB, 17 %") == {5: (1443, 17)}


def test_not_available_is_none_not_zero() -> None:
    assert parse_sample("5, [N/A], [N/A]\n6, 910, [Not Supported]\n") == {5: (None, None), 6: (910, None)}


@pytest.mark.parametrize("text", [
    "No devices were found",  # real: `-i 5` on a one-GPU host, exit 6
    'Field "xyz" is not a valid field to query.',
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.",
    "5, 1443, 17\n6, 6249",  # a torn table is not a sample either
    "index, memory.used [MiB], utilization.gpu [%]",  # a header (the query asked for noheader)
])
def test_error_text_is_refused_not_read_as_idle(text: str) -> None:
    with pytest.raises(SmiError):
        parse_sample(text)


def test_the_sample_command_asks_only_for_the_run_gpus() -> None:
    assert sample_argv([5, 6, 7]) == [
        "nvidia-smi", "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader,nounits", "-i", "5,6,7"]
    assert sample_argv([])[-1] == "--format=csv,noheader,nounits"


def test_gpus_keeps_its_names_and_uses_the_target_parser() -> None:
    assert gpus.parse_gpus is smi.parse_gpus and gpus.SmiError is smi.SmiError and gpus.Gpu is smi.Gpu
    assert gpus.QUERY_GPUS.argv[1] == "--query-gpu=" + smi.GPU_FIELDS
