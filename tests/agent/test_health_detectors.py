"""The four hardware detectors of the list (gpu-xid, gpu-ecc, gpu-lost, gpu-slowdown), fed as the watchdog feeds
them: health samples built from the real driver's row (tests/data/real_h200/health/, an H100 the lender gave for
an H200) with one field changed, and host-xids.jsonl records as the host's follower hands them over."""

from __future__ import annotations

from typing import Any

from test_health import recorded

from gpuops.agent.detect.detectors import Detectors
from gpuops.agent.detect.sampler import HealthSample
from gpuops.agent.wire.detector_list import DETECTORS, DetectorSettings
from gpuops.agent.wire.health import LostGpu, parse_health
from gpuops.agent.wire.xid import parse_line

BUS = "00000000:00:06.0"


def detectors(**actions: str) -> Detectors:
    """Every default-on detector with its defaults (an action changed where given)."""
    settings = []
    for spec in DETECTORS:
        s = spec.defaults() if spec.default_on else None
        if s is not None and spec.key in actions:
            s = spec.settings(**{**spec.plain(s), "action": actions[spec.key]})
        settings.append((spec.key, s))
    return Detectors(DetectorSettings(tuple(settings)), None, 0.0)


def sample(index: int = 0, lost: bool = False, missing: bool = False, **values: str) -> HealthSample:
    fields, text, _ = recorded("health-csv-noheader-nounits.txt")
    (row,) = parse_health(text, fields).gpus
    rows = {} if lost or missing else {index: type(row)(index, {**row.values, **values})}
    return HealthSample(rows, [LostGpu(BUS[4:], f"Unable to determine the device handle for GPU{BUS[4:]}: Unknown Error")]
                        if lost else [], [index] if lost or missing else [])


def feed(d: Detectors, *samples: tuple[float, HealthSample]) -> list[Any]:
    found = []
    for t, s in samples:
        d.health(t, s)
        found += [f for f in d.judge(t) if f.action != "note"]
    return found


def test_gpu_ecc_reports_what_is_new_in_the_run_not_what_the_gpu_started_with() -> None:
    d = detectors()
    found = feed(d, (1.0, sample(**{"ecc.errors.uncorrected.volatile.total": "1", "remapped_rows.pending": "Yes"})),
                 (3.0, sample(**{"ecc.errors.uncorrected.volatile.total": "1", "remapped_rows.pending": "Yes"})),
                 (5.0, sample(**{"ecc.errors.uncorrected.volatile.total": "4", "remapped_rows.pending": "Yes",
                                 "remapped_rows.failure": "Yes"})))
    assert [(f.rule, f.action, f.figures["counter"]) for f in found] == [
        ("gpu-ecc", "abort", "ecc.errors.uncorrected.volatile.total"), ("gpu-ecc", "abort", "remapped_rows.failure")]
    assert "3 new uncorrected ECC error(s) during the run (1 at its start, 4 now)" in found[0].message
    assert f"GPU 0 ({BUS}, GPU-e7f34ea0" in found[0].message and "contact NVIDIA support" in found[1].advice


def test_gpu_lost_at_once_for_a_lost_line_or_error_fields_and_after_its_window_for_a_missing_row() -> None:
    (lost,) = feed(detectors(), (1.0, sample()), (3.0, sample(lost=True)))  # known by the bus it read at 1.0
    assert (lost.rule, lost.action, lost.figures["gpu"]) == ("gpu-lost", "abort", 0) and "reboot the host" in lost.advice
    (errors,) = feed(detectors(), (1.0, sample(**{"utilization.gpu": "[GPU requires reset]"})))
    assert "[GPU requires reset]" in errors.message
    d = detectors()
    assert not feed(d, (1.0, sample()), (2.0, sample(missing=True)), (20.0, sample(missing=True)))
    (gone,) = feed(d, (32.0, sample(missing=True)))
    assert "missing from nvidia-smi's samples for 30 s" in gone.message


def test_gpu_slowdown_warns_once_a_hardware_slowdown_lasts_its_window_and_a_power_cap_never() -> None:
    d = detectors()
    cap = {"clocks_event_reasons.active": "0x0000000000000004"}
    thermal = {"clocks_event_reasons.active": "0x0000000000000040"}
    assert not feed(d, *((float(t), sample(**cap)) for t in range(0, 200, 2)))
    found = feed(d, *((float(t), sample(**thermal)) for t in range(200, 300, 2)))
    assert [(f.rule, f.action, f.figures["reasons"]) for f in found] == [("gpu-slowdown", "warn", ["hw_thermal_slowdown"])]


def test_gpu_xid_takes_its_action_for_what_needs_a_reset_and_warns_for_the_applications() -> None:
    def record(line: str) -> dict[str, Any]:
        return {"kind": "xid", **parse_line(line, 5.0).as_json(), "index": 0, "bus_id": BUS, "uuid": "GPU-x"}

    d = detectors()
    for line in ("NVRM: Xid (PCI:0000:00:06): 43, pid=2924364, name=pt_main_thread, Ch 00000008",
                 "NVRM: Xid (PCI:0000:00:06): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
                 "(GPC 9, TPC 1, SM 1): Out Of Range Address",
                 "NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."):
        d.xid(5.0, record(line))
    found = d.judge(5.0)
    assert [(f.figures["xid"], f.action) for f in found] == [(13, "warn"), (79, "abort")]
    assert found[1].message.startswith(f"Xid 79 (GPU has fallen off the bus) on GPU 0 ({BUS}, GPU-x)")
    assert "reboot the host" in found[1].advice
    d = detectors(gpu_xid="warn")
    d.xid(5.0, record("NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus."))
    assert [f.action for f in d.judge(5.0)] == ["warn"]
