"""The GPUs' own health, the pure pieces: the real driver's answers read through gpuops' own parser and verdict
(tests/data/real_h200/health/: recorded on the lent GPU machine, an H100 80GB HBM3 that the lender gave when an
H200 was asked for, driver 580.159.04), NVIDIA's Xid catalog as shipped, the driver's real Xid lines, the kernel
log's time stamps, the outcome of a run its hardware ended, and the four detectors on fed samples."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpuops.agent.wire import xid as X
from gpuops.agent.wire.health import HEALTH_FIELDS, LOOP_HEALTH, SLOWDOWN, parse_health, reasons, refused_field, without
from gpuops.agent.wire.records import outcome
from gpuops.agent.wire.smi import SmiError
from gpuops.agent.wire.verdict import OK, RESET, SERVICE, WARN, judge, judge_lost

REAL = Path(__file__).resolve().parents[1] / "data" / "real_h200" / "health"
H100 = "GPU-e7f34ea0-114a-0d8c-23c0-b0b597e891a3"


def recorded(name: str) -> tuple[list[str], str, str]:
    """A record's query fields (its argv's --query-gpu), its output, its exit line."""
    lines = (REAL / name).read_text().splitlines()
    fields = re.search(r"--query-gpu=(\S+)", lines[0]).group(1).split(",")
    body = [x for x in lines[1:] if not x.startswith("## ")]
    return fields, "\n".join(body), next(x for x in lines if x.startswith("## exit"))


# -- the real driver's answers, read by gpuops' parser and judged by its verdict -------------------------------
@pytest.mark.parametrize("name", ["health-csv-noheader.txt", "health-csv-noheader-nounits.txt", "index-one-missing.txt"])
def test_the_real_drivers_health_row_reads_as_a_healthy_h100(name: str) -> None:
    fields, text, code = recorded(name)
    assert code == "## exit 0"
    (row,) = parse_health(text, fields).gpus
    assert (row.index, row.bus_id, row.uuid, row.bus) == (0, "00000000:00:06.0", H100, "0000:00:06")
    assert row.as_json()["ecc"] == {"uncorrected_volatile": 0, "corrected_volatile": 0, "uncorrected_aggregate": 0}
    assert row.flag("retired_pages.pending") is None  # [N/A]: Hopper remaps rows, it retires no pages
    assert (row.flag("remapped_rows.pending"), row.flag("remapped_rows.failure")) == (False, False)
    assert (row.mask, reasons(row.mask)) == (1, ["gpu_idle"])
    assert row.link() == {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16}
    assert (row.recovery_action, row.number("power.draw"), row.errors) == ("None", 70.11, {})
    verdict = judge(row)
    assert (verdict.level, verdict.problems) == (OK, [])


def test_the_real_loop_with_health_fields_and_the_load_read_as_samples_a_power_cap_is_no_slowdown() -> None:
    """The watchdog's loop form with the health fields appended (loop-health.txt) and the same fields under a bf16
    matmul loop (load.txt): sw_power_cap Active at ~680 W of 700 W is normal at full load, not a slowdown."""
    fields = ["index", "memory.used", "utilization.gpu", "ecc.errors.uncorrected.volatile.total",
              "remapped_rows.pending", "remapped_rows.failure", "clocks_event_reasons.active", "pci.bus_id"]
    _, text, _ = recorded("loop-health.txt")
    rows = parse_health(text, fields).gpus
    assert len(rows) == 6 and {(r.count("memory.used"), r.mask, r.bus_id) for r in rows} == {(0, 1, "00000000:00:06.0")}
    load = (REAL / "load.txt").read_text().split("## the sample fields and every health field, nounits, -lms 1000\n")[1]
    load = load.split("## ")[0]
    health_fields = recorded("health-csv-noheader.txt")[0][1:]
    busy = parse_health(load, ["index", "memory.used", "utilization.gpu", *health_fields]).gpus
    assert [r.count("utilization.gpu") for r in busy][-1] == 99 and busy[-1].raw("clocks_event_reasons.sw_power_cap") == "Active"
    assert busy[-1].mask == 0x4 and not busy[-1].mask & SLOWDOWN
    assert {judge(r).level for r in busy} == {OK}


def test_a_refused_field_is_named_and_taken_out_or_spelled_the_older_way() -> None:
    each = {line.split("\t")[0]: line.split("\t") for line in (REAL / "health-each-field.txt").read_text().splitlines()}
    for field in ("reset_status.reset_required", "reset_status.drain_and_reset_recommended"):  # gone in 580
        assert each[field][1] == "2" and refused_field(each[field][2]) == field
    assert each["gpu_recovery_action"][1:] == ["0", "None"] and set(LOOP_HEALTH) <= set(each) and set(HEALTH_FIELDS) <= set(each)
    _, text, code = recorded("unknown-field.txt")
    assert code == "## exit 2" and refused_field(text) == "ecc.errors.bogus"
    assert without(("index", "gpu_recovery_action", "uuid"), "gpu_recovery_action") == ("index", "uuid")
    assert without(("index", "clocks_event_reasons.active"), "clocks_event_reasons.active") == (
        "index", "clocks_throttle_reasons.active")  # the older name the 580 driver still takes (old-throttle-names.txt)


def test_text_that_is_no_table_is_an_error_never_healthy_gpus() -> None:
    fields, text, code = recorded("index-out-of-range.txt")
    assert (code, text) == ("## exit 6", "No devices were found")
    with pytest.raises(SmiError):
        parse_health(text, fields)


def test_a_lost_gpu_line_in_each_field_report_form_names_its_bus() -> None:
    """The forms quoted in health-notes.md section 3 (field reports: never seen on the lent machine)."""
    fields = ["index", "uuid"]
    for line, bus in (("Unable to determine the device handle for GPU0000:91:00.0: Unknown Error", "0000:91:00.0"),
                      ("Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error", "0000:0B:00.0"),
                      ("Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost.  Reboot the system to "
                       "recover this GPU", "0000:02:00.0"),
                      ("Unable to determine the device handle for GPU0: 0000:24:00.0: GPU is lost.  Reboot the system "
                       "to recover this GPU", "0000:24:00.0")):
        reading = parse_health(f"1, GPU-x\n{line}\n", fields)
        assert [g.index for g in reading.gpus] == [1] and [x.bus_id for x in reading.lost] == [bus]
        assert X.bus_key(bus) == X.bus_key(bus.lower()) and judge_lost(reading.lost[0]).level == RESET


# -- the verdict's rules ---------------------------------------------------------------------------------------
def row(**values: str) -> Any:
    fields, text, _ = recorded("health-csv-noheader-nounits.txt")
    (healthy,) = parse_health(text, fields).gpus
    return type(healthy)(0, {**healthy.values, **values})


@pytest.mark.parametrize("values, level, counter, action", [
    ({"ecc.errors.uncorrected.volatile.total": "2"}, RESET, "ecc.errors.uncorrected.volatile.total", "nvidia-smi -r -i 00000000:00:06.0"),
    ({"remapped_rows.failure": "Yes"}, SERVICE, "remapped_rows.failure", "contact NVIDIA support"),
    ({"remapped_rows.pending": "Yes"}, RESET, "remapped_rows.pending", "the remap takes effect at the reset"),
    ({"retired_pages.pending": "Yes"}, RESET, "retired_pages.pending", "reload the driver"),
    ({"gpu_recovery_action": "Reboot"}, RESET, "gpu_recovery_action", "reboot the host"),
    ({"gpu_recovery_action": "Drain and Reset"}, RESET, "gpu_recovery_action", "let running work finish"),
    ({"gpu_recovery_action": "Something New"}, RESET, "gpu_recovery_action", "take the GPU out of service"),
    ({"temperature.gpu": "[GPU requires reset]"}, RESET, "temperature.gpu", "if that fails, reboot the host"),
    ({"clocks_event_reasons.active": "0x0000000000000040"}, WARN, "clocks_event_reasons.active", "cooling"),
    ({"pcie.link.width.current": "8"}, WARN, "pcie.link.width.current", "reseat the GPU"),
    ({"temperature.memory": "95"}, WARN, "temperature.memory", "cooling"),
    ({"pcie.link.gen.current": "1"}, OK, None, None),  # the generation drops when a GPU idles: not judged
])
def test_each_cause_has_its_level_counter_and_nvidias_action(values: dict[str, str], level: str, counter: Any,
                                                              action: Any) -> None:
    verdict = judge(row(**values))
    assert verdict.level == level
    if counter is not None:
        (problem,) = verdict.problems
        assert problem.counter == counter and action in problem.action


# -- NVIDIA's Xid catalog as shipped, and the driver's real lines ------------------------------------------------
def test_the_shipped_catalog_names_its_sources_and_classifies_every_xid() -> None:
    shipped = json.loads(Path(X.CATALOG).read_text())
    assert any("docs.nvidia.com/deploy/xid-errors" in s["url"] for s in shipped["source"])
    assert len(shipped["xids"]) == 172 and all(e["resolution"] in X.ACTIONS for e in shipped["xids"].values())
    assert {c: X.info(c).resolution for c in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 120)} == {
        13: "restart_app", 31: "restart_app", 43: "ignore", 45: "ignore", 48: "reset_gpu", 63: "ignore",
        64: "reset_gpu", 74: "reset_gpu", 79: "reboot", 92: "ignore", 94: "restart_app", 95: "reset_gpu",
        119: "reset_gpu", 120: "reset_gpu"}
    assert X.info(999).resolution == "unknown" and not X.needs_reset("unknown")


@pytest.mark.parametrize("line, bus, code, pid, process, message, resolution", [
    # leptonai/gpud sxid README (R515-R565: unknown pid and name quoted so)
    ("[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     "0000:91:00", 79, None, None, "GPU has fallen off the bus.", "reboot"),
    # the catalog's own example (R570+: pid and name left out)
    ("[...] NVRM: Xid (PCI:0000:5a:00): 79, GPU has fallen off the bus.", "0000:5a:00", 79, None, None,
     "GPU has fallen off the bus.", "reboot"),
    # gpud dmesg.decode.iso.log (dmesg --decode --time-format iso)
    ("kern  :warn  : 2025-01-21T04:41:44,287197+00:00 NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, "
     "Ch 00000008", "0000:38:00", 43, 2924364, "pt_main_thread", "Ch 00000008", "ignore"),
    # syslog form (NVIDIA/gpu-operator#1146)
    ("Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, "
     "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 "
     "partition 7, subpartition 1.", "0000:07:00", 48, None, None, None, "reset_gpu"),
    # a MIG instance in the parentheses; RST: No (the driver's own example, kern_gpu_error_cont_ga100.c)
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     "0000:01:00", 94, 7194, None, "Contained: CE User Channel (0x9). RST: No, D-RST: No", "restart_app"),
    # 154 says the recovery action it changed to (gpud kmsg_test.go, GB200: a 4-digit domain)
    ("[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
     "0009:01:00", 154, None, None, None, "reset_gpu"),
    # 45 names the Xid that caused it (open-gpu-kernel-modules#1150, driver 590.48.01)
    ("kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
     "0000:dc:00", 45, 1818990, "python3", "Ch 00000001 caused by previous Xid 149", "ignore"),
])
def test_the_drivers_real_xid_lines_read_with_any_readers_prefix(line: str, bus: str, code: int, pid: Any, process: Any,
                                                                  message: Any, resolution: str) -> None:
    event = X.parse_line(line, 12.5)
    assert (event.bus, event.code, event.pid, event.process, event.t) == (bus, code, pid, process, 12.5)
    if message is not None:
        assert event.message == message
    assert event.info.resolution == resolution and event.line.startswith("NVRM: Xid (")


def test_lines_that_are_no_xid_read_as_none_and_bus_ids_read_in_every_spelling() -> None:
    for line in ("[    0.544791] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build",
                 "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.", "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): "
                 "20034, Fatal, Link 48 LTSSM Fault Up", ""):
        assert X.parse_line(line) is None
    assert {X.bus_key(b) for b in ("00000000:3B:00.0", "0000:3b:00", "0000:3B:00.0", "3b:00.0")} == {"0000:3b:00"}
    assert X.classify(95, "Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No").level == RESET


def test_the_kernel_logs_time_stamps_read_as_epoch_seconds() -> None:
    from gpuops.agent.system.kernlog import parse_stamp

    first = (REAL / "dmesg-time-format.txt").read_text().splitlines()[1]  # dmesg --time-format iso, as recorded
    t, text = parse_stamp(first)
    assert t == pytest.approx(1796533812.266368) and text.startswith("Linux version 6.18.44")
    assert parse_stamp("2026-12-06T05:10:12.266368+0100 pve1 kernel: x")[0] == pytest.approx(1796530212.266368)
    assert parse_stamp("[    0.544791] NVRM: x") == (None, "[    0.544791] NVRM: x")


# -- the outcome of a run its hardware ended ---------------------------------------------------------------------
def test_a_gpus_own_failure_is_hardware_exit_10_and_a_stop_or_success_still_decides() -> None:
    hw = {"rule": "gpu-xid"}
    assert outcome(None, {"reason": "match", "rule": "gpu-xid"}, False) == ("hardware", 10)
    assert outcome(None, {"reason": "match", "rule": "gpu-lost"}, False) == ("hardware", 10)
    assert outcome(None, {"reason": "stall"}, False, hw) == ("hardware", 10)
    assert outcome("1\n", None, False, hw) == ("hardware", 10) and outcome("1\n", None, False) == ("failed", 6)
    assert outcome(None, None, False, hw) == ("hardware", 10) and outcome(None, None, True, hw) == ("running", None)
    assert outcome(None, {"reason": "stop", "by": "stop"}, False, hw) == ("stopped", 6)
    assert outcome(None, {"reason": "match", "rule": "fx-tracing-race"}, False, hw) == ("aborted", 7)
    assert outcome("0\n", None, False, hw) == ("succeeded", 0)
