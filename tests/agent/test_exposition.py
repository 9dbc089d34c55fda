"""The Prometheus text format as gpuops writes it (agent/wire/exposition.py, agent/wire/metric_table.py): every
exposition passes `promtool check metrics` with no warning, whatever names the run has; no free text in a label.

The same expositions read back by the real node_exporter and Prometheus are in tests/agent/test_metrics_prometheus.py.
"""

from __future__ import annotations

import re
import shutil

import pytest
from bench.prom import promtool_check

from gpuops.agent.wire.exposition import LABEL_MAX, Exposition, Family, escape_label, label_value, number
from gpuops.agent.wire.metric_table import (
    GPU_FAMILIES,
    GPU_HEALTH_FAMILIES,
    RUN_FAMILIES,
    STATES,
    GpuReading,
    RunSnapshot,
    health_family,
    render,
)


def needs_promtool(test):  # type: ignore[no-untyped-def]
    """A test that runs promtool (a process: a bench test, skipped where Debian's prometheus is not installed)."""
    skip = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) missing")
    return pytest.mark.bench(skip(test))

HOSTILE = ['ct"200', "back\\slash", "new\nline", "x" * 10_000, "tab\there", "bad \udcff bytes", "}{,=", "\x00nul"]


def full_run(**over: object) -> RunSnapshot:
    """A run with a value in every family: ended by a rule after a restart, notifications, two GPUs."""
    snap = RunSnapshot(
        run="20261206-101500-3fa9c2", target="ct200", playbook="dflash-drafter", session="train", state="aborted",
        attempt=2, max_attempts=3, started_at=1796120700.0, ended_at=1796124300.5, exit_code=7, command_exit_code=130,
        throughput=98364.0, throughput_baseline=505695.0, throughput_min_ratio=0.5, log_silence_seconds=0.4,
        stall_timeout_seconds=900.0, heartbeat_at=1796124300.25, heartbeat_age_seconds=1.5,
        aborts={"fx-tracing-race": 1, "stall": 1}, restarts={"stall": 1},
        matches=[("fx-tracing-race", "abort", 1), ("throughput-drop", "warn", 2)],
        notifications=[("aborted", "webhook", 1, 0), ("restarted", "command", 0, 1)],
        gpus=[GpuReading(5, "GPU-4b5d3c1e-0f7a-2c8e-9d1b-6a3f5e7c9b2d", 1443, 17, 1, 1443.0),
              GpuReading(6, "GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5", None, None, None, None)])
    for key, value in over.items():
        setattr(snap, key, value)
    return snap


def samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@needs_promtool
def test_every_family_is_declared_once_with_help_and_type_and_promtool_has_no_warning() -> None:
    text = render([full_run()])
    names = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
    assert len({n for n, _ in names}) == len(names)  # each family once
    declared = {f.name for f in RUN_FAMILIES} | {g.family.name for g in GPU_FAMILIES}
    assert {n for n, _ in names} == declared  # every family has a value in this run
    for name, kind in names:
        assert (kind == "counter") == name.endswith("_total")
        assert re.search(rf"^# HELP {name} \S", text, re.M)
    assert promtool_check(text) == ""


def test_a_running_run_has_no_exit_code_and_its_state_is_one_series_each_of_one() -> None:
    text = render([full_run(state="running", exit_code=None, ended_at=None, command_exit_code=None)])
    assert "gpuops_run_exit_code" not in text and "gpuops_run_end_timestamp_seconds" not in text
    states = dict(re.findall(r'^gpuops_run_state\{.*state="([^"]+)"\} (\d)$', text, re.M))
    assert set(states) == set(STATES) and [s for s, v in states.items() if v == "1"] == ["running"]
    assert re.search(r"^gpuops_run_ended\{.*\} 0$", text, re.M)


def test_an_ended_run_shows_its_exit_code_and_ended() -> None:
    text = render([full_run()])
    assert re.search(r'^gpuops_run_exit_code\{run="20261206-101500-3fa9c2",target="ct200",playbook="dflash-drafter"\} 7$',
                     text, re.M)
    assert re.search(r'^gpuops_run_state\{.*state="aborted"\} 1$', text, re.M)
    assert re.search(r"^gpuops_run_ended\{.*\} 1$", text, re.M)
    assert re.search(r'^gpuops_gpu_memory_used_bytes\{.*gpu="5",uuid="GPU-4b5d3c1e-[^"]+"\} 1513095168$', text, re.M)
    assert re.search(r'^gpuops_gpu_utilization_ratio\{.*gpu="5",.*\} 0.17$', text, re.M)
    assert re.search(r'^gpuops_gpu_info\{.*gpu="6",uuid="GPU-0c1d[^"]+"\} 1$', text, re.M)
    assert not re.search(r'^gpuops_gpu_memory_used_bytes\{.*gpu="6"', text, re.M)  # [N/A] is no sample, never a 0


@needs_promtool
@pytest.mark.parametrize("name", HOSTILE, ids=lambda n: repr(n[:12]))
def test_a_hostile_name_never_breaks_the_format(name: str) -> None:
    """A target, playbook, session or node name with quotes, backslashes, newlines, control or undecodable
    characters, or 10,000 characters long: one line per sample, and promtool reads it without a warning."""
    run = full_run(target=name, playbook=name, session=name, node=name)
    text = render([run, full_run(run="20261206-101501-000000")])
    assert promtool_check(text) == ""
    assert len(samples(text)) == len(samples(render([full_run(), full_run(run="20261206-101501-000000")])))
    for line in samples(text):
        assert len(line) < 2000


@needs_promtool
def test_a_rule_or_word_that_is_not_a_name_is_exposed_as_other_and_counted() -> None:
    """A rule label takes a rule's name, never text: a name with quotes or a log line is `other` (summed)."""
    line = 'RuntimeError: "x"\nTraceback (most recent call last):'
    run = full_run(aborts={'loss "nan"': 1, line: 2, "y" * 200: 1},
                   matches=[(line, "abort", 3), ("ok-rule", 'warn"', 1)],
                   notifications=[('aborted"', "webhook", 1, 0), ("ended", "x\ny", 2, 0)])
    text = render([run])
    assert "Traceback" not in text and "RuntimeError" not in text and "yyyy" not in text
    assert re.search(r'^gpuops_aborts_total\{.*rule="other"\} 4$', text, re.M)
    assert re.search(r'^gpuops_rule_matches_total\{.*rule="other",action="abort"\} 3$', text, re.M)
    assert re.search(r'^gpuops_rule_matches_total\{.*rule="ok-rule",action="other"\} 1$', text, re.M)
    assert re.search(r'^gpuops_notifications_sent_total\{.*what="other",via="webhook"\} 1$', text, re.M)
    assert promtool_check(text) == ""


def test_label_values_are_escaped_and_bounded() -> None:
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    long_a, long_b = label_value("n" * 5000 + "a"), label_value("n" * 5000 + "b")
    assert len(long_a) == LABEL_MAX and long_a != long_b and long_a.startswith("n" * 100)
    assert label_value("ok-name") == "ok-name"
    assert label_value("\udcff").encode("utf-8")  # encodable


def test_numbers_as_the_format_writes_them() -> None:
    assert [number(v) for v in (True, 3, 2.0, 0.17, float("nan"), float("inf"), -float("inf"), None, "7")] == \
        ["1", "3", "2", "0.17", "NaN", "+Inf", "-Inf", None, None]
    assert number(1796124300.25) == "1796124300.25" and float(number(1e20) or 0) == 1e20


def test_a_family_with_a_bad_name_or_type_is_refused_where_it_is_declared() -> None:
    for name, kind in (("gpuops_x_total", "gauge"), ("gpuops_x", "counter"), ("gpuops x", "gauge"),
                       ("gpuops_x", "histogram")):
        with pytest.raises(ValueError):
            Family(name, kind, "help")
    with pytest.raises(ValueError):
        Family("gpuops_x", "gauge", "help", ("bad-label",))


def test_one_family_per_name_and_a_series_given_twice_is_kept_once() -> None:
    out = Exposition()
    fam = Family("gpuops_t", "gauge", "help")
    out.add(fam, {"run": "a"}, 1)
    out.add(fam, {"run": "a"}, 2)
    out.add(fam, {"run": "b"}, None)
    assert samples(out.render()) == ['gpuops_t{run="a"} 1']
    with pytest.raises(ValueError):
        out.add(Family("gpuops_t", "gauge", "other help"), {"run": "c"}, 1)


def test_the_same_run_given_twice_and_two_runs_render_one_family_each() -> None:
    a, b = full_run(), full_run(run="20261206-101501-000000", target="ct201")
    text = render([a, a, b])
    assert text.count("# TYPE gpuops_run_info gauge") == 1
    assert len(re.findall(r"^gpuops_run_info\{", text, re.M)) == 2


def test_a_snapshot_travels_as_json_and_renders_the_same() -> None:
    import json

    run = full_run()
    assert render([RunSnapshot.from_plain(json.loads(json.dumps(run.plain())))]) == render([run])


def test_a_gpu_health_family_is_one_row_of_its_table() -> None:
    """Issue 36's counters: a health_family row renders from GpuReading.health with the GPU's labels."""
    import gpuops.agent.wire.metric_table as table

    row = health_family("ecc_uncorrected", "gpuops_gpu_health_ecc_uncorrected_errors_total", "counter",
                        "Uncorrected ECC errors of a run GPU since the run started.")
    assert all(f.family.name.startswith("gpuops_gpu_health_") for f in GPU_HEALTH_FAMILIES)
    run = full_run()
    run.gpus[0].health["ecc_uncorrected"] = 2
    saved = table.GPU_HEALTH_FAMILIES
    table.GPU_HEALTH_FAMILIES = (row,)
    try:
        text = render([run])
    finally:
        table.GPU_HEALTH_FAMILIES = saved
    assert re.search(r'^gpuops_gpu_health_ecc_uncorrected_errors_total\{.*gpu="5",uuid="GPU-4b5d[^"]+"\} 2$', text, re.M)
    assert 'gpuops_gpu_health_ecc_uncorrected_errors_total{run="20261206-101500-3fa9c2",target="ct200",' \
           'playbook="dflash-drafter",gpu="6"' not in text
