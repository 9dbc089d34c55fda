"""The run in Prometheus, proven with the real tools (issue 38): node_exporter's textfile collector, the Pushgateway and
a Prometheus server scraping both every second on 127.0.0.1 (tests/bench/prom.py), one set shared by this module.

A detached run on the bench (real sshd, pct and tmux) with `watch.metrics.textfile` or `watch.metrics.pushgateway`
set is read back through Prometheus' HTTP API: its throughput, its state going to ended, its exit code, and its
series gone `keep_ended` seconds after its end. Every exposition passes `promtool check metrics` with no warning.
The dashboard's every query runs against the same Prometheus.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from bench import wait_until
from bench.cli import CtCli
from bench.prom import PromStack, missing_tools, promtool_check

from gpuops.agent.wire.metric_table import GpuReading, RunSnapshot, render

SESSION = "prom"
GPUS = (5, 6)
TOK = 505695
# A loaded two-core machine: the run starts, samples, scrapes and ends within these.
SEEN_WITHIN = 60.0


@pytest.fixture(scope="module")
def prom() -> Iterator[PromStack]:
    missing = missing_tools()
    if missing:
        pytest.skip(f"Debian's Prometheus tools are not installed ({', '.join(missing)}): .ci/run installs them")
    stack = PromStack().start()
    try:
        yield stack
    finally:
        stack.stop()


def write_playbook(ct: CtCli, command: str, metrics: dict[str, Any], **watch: Any) -> Path:
    return ct.write({
        "name": "prom-test",
        "preflight": {"gpus": list(GPUS)},
        "launch": {"session": SESSION, "command": command},
        "watch": {"stall_timeout": 60, "sample_interval": 0.5, "throughput": {"pattern": r"tok/s (\d+)"},
                  "metrics": metrics, **watch},
        "abort": {"grace": 3},
    })


def perf(seconds: float) -> str:
    return (f"fake-train --mode perf --gpus {','.join(map(str, GPUS))} --interval 0.1 --duration {seconds} "
            f"--tok-per-s {TOK} --mib 543")


def series(text: str, name: str, run: str) -> list[str]:
    """The sample lines of family `name` for the run."""
    return [line for line in text.splitlines() if line.startswith(name + "{") and f'run="{run}"' in line]


def one(stack: PromStack, expr: str) -> float | None:
    values = stack.values(expr)
    assert len(values) <= 1, values
    return next(iter(values.values()), None)


def launch_detached(ct: CtCli) -> str:
    result = ct.gpuops("launch", "--detach")
    assert result.code == 0, result
    return ct.run_id()


# -- the textfile collector -------------------------------------------------------------------------------------------
def test_a_detached_run_shows_in_node_exporter_and_prometheus_until_its_end_and_then_goes(
        prom: PromStack, ct: CtCli) -> None:
    write_playbook(ct, perf(8), {"textfile": str(prom.textfile_dir), "keep_ended": 8})
    run = launch_detached(ct)
    prom_file = prom.textfile_dir / f"gpuops-{run}.prom"

    # within two sample intervals of the first figure: node_exporter serves the run's throughput and state
    def served() -> str | None:
        text = prom.node_metrics()
        return text if series(text, "gpuops_throughput", run) else None

    text = wait_until(served, timeout=SEEN_WITHIN, message="the run's throughput in node_exporter's output")
    assert series(text, "gpuops_throughput", run)[0].endswith(f" {TOK}")
    assert [line.rsplit(" ", 1)[1] for line in series(text, "gpuops_run_state", run) if 'state="running"' in line] == ["1"]
    assert promtool_check(prom_file.read_text()) == ""
    assert prom.values('node_textfile_scrape_error') == {"__name__=node_textfile_scrape_error,instance="
                                                           f"127.0.0.1:{prom.node_port},job=node": 0.0}
    # and Prometheus has it, with the run's GPUs by UUID
    wait_until(lambda: one(prom, f'gpuops_throughput{{run="{run}"}}') == TOK, timeout=SEEN_WITHIN,
               message="the throughput in Prometheus")
    assert one(prom, f'gpuops_run_state{{run="{run}",state="running",target="ct200",playbook="prom-test"}}') == 1
    def trained() -> Any:  # the trainer's memory on both GPUs, as sampled
        rows = prom.query(f'gpuops_gpu_memory_used_bytes{{run="{run}"}} > {500 * 2**20}')
        return rows if len(rows) == 2 else None

    memory = wait_until(trained, timeout=SEEN_WITHIN, message="the GPUs' memory in Prometheus")
    assert sorted(r["metric"]["gpu"] for r in memory) == ["5", "6"]
    assert all(r["metric"]["uuid"].startswith("GPU-") for r in memory)

    # gpuops metrics prints the same exposition from the records, with the heartbeat's age at this moment
    def printed() -> Any:
        said = ct.gpuops("metrics")
        assert said.code == 0, said
        return said if series(said.text, "gpuops_throughput", run) else None

    said = wait_until(printed, timeout=SEEN_WITHIN, message="the throughput in gpuops metrics (watchdog.json's beat)")
    assert promtool_check(said.text) == ""
    assert series(said.text, "gpuops_throughput", run)[0].endswith(f" {TOK}")
    assert series(said.text, "gpuops_watchdog_heartbeat_age_seconds", run)
    (obj,) = [e for e in ct.gpuops("metrics", "--json").events() if e["run"] == run]
    assert (obj["event"], obj["target"], obj["state"], obj["throughput"]) == ("metrics", "ct200", "running", TOK)
    assert sorted(g["gpu"] for g in obj["gpus"]) == list(GPUS) and obj["exit_code"] is None

    # the run ends by itself: its state goes to succeeded and its exit code shows
    wait_until(lambda: one(prom, f'gpuops_run_exit_code{{run="{run}"}}') == 0, timeout=SEEN_WITHIN,
               message="the exit code in Prometheus")
    assert one(prom, f'gpuops_run_state{{run="{run}",state="succeeded"}}') == 1
    assert one(prom, f'gpuops_run_state{{run="{run}",state="running"}}') == 0
    assert one(prom, f'gpuops_run_ended{{run="{run}"}}') == 1
    final = prom_file.read_text()
    assert promtool_check(final) == "" and "gpuops_gpu_memory_used_bytes" not in final  # drained GPUs: no sample
    ended = ct.gpuops("metrics")
    assert [line.rsplit(" ", 1)[1] for line in series(ended.text, "gpuops_run_exit_code", run)] == ["0"]

    # keep_ended later the file is gone, so are the series, and so is the process that took them away
    wait_until(lambda: not prom_file.exists(), timeout=SEEN_WITHIN, message="the run's file taken away")
    wait_until(lambda: not prom.query(f'gpuops_run_info{{run="{run}"}}'), timeout=SEEN_WITHIN,
               message="the run's series gone from Prometheus")
    assert [name for name in prom.textfile_dir.iterdir() if run in name.name] == []
    assert run not in ct.gpuops("metrics").text  # past keep_ended: no longer one of the target's runs
    wait_until(lambda: not ct.run_processes(run), timeout=30, message="no process of the run left")


# -- the Pushgateway ---------------------------------------------------------------------------------------------------
def test_the_pushgateway_receives_the_runs_group_and_its_end(prom: PromStack, ct: CtCli) -> None:
    """Pushed as a secret URL read from the launcher's environment: the group is the run's, its end is pushed (aborted
    by a rule: exit 7, the abort by rule counted), it is deleted keep_ended later, and the URL is never shown."""
    write_playbook(ct, f"{perf(60)} & sleep 3; echo 'loss nan at step 30'; wait",
                   {"pushgateway": {"from_env": "GPUOPS_TEST_PUSHGATEWAY"}, "keep_ended": 8},
                   rules=[{"name": "loss-nan", "pattern": r"loss nan\b", "action": "abort"}])
    env = {"GPUOPS_TEST_PUSHGATEWAY": prom.pushgateway_url}
    result = ct.gpuops("launch", "--detach", env=env)
    assert result.code == 0, result
    run = ct.run_id()

    def group() -> dict[str, Any] | None:
        return next((g for g in prom.pushgateway_groups() if g["labels"].get("run") == run), None)

    pushed = wait_until(group, timeout=SEEN_WITHIN, message="the run's group on the Pushgateway")
    assert pushed["labels"] == {"job": "gpuops", "run": run}
    wait_until(lambda: one(prom, f'gpuops_run_exit_code{{run="{run}",job="gpuops"}}') == 7, timeout=SEEN_WITHIN,
               message="the run's end through the Pushgateway")
    assert one(prom, f'gpuops_run_state{{run="{run}",state="aborted"}}') == 1
    assert one(prom, f'gpuops_aborts_total{{run="{run}",rule="loss-nan"}}') == 1
    assert one(prom, f'gpuops_rule_matches_total{{run="{run}",rule="loss-nan",action="abort"}}') == 1
    assert one(prom, f'gpuops_throughput{{run="{run}"}}') == TOK
    wait_until(lambda: group() is None, timeout=SEEN_WITHIN, message="the run's group deleted after keep_ended")

    said = ct.gpuops("logs", "--json", env=env)
    address = prom.pushgateway_url.split("://", 1)[1]
    for where, text in (("logs", said.text), ("events", (ct.run_dir(run) / "events.jsonl").read_text())):
        assert address not in text, where


# -- the dashboard's queries -------------------------------------------------------------------------------------------
def full_run(run: str) -> RunSnapshot:
    return RunSnapshot(
        run=run, target="ct200", playbook="dash", session="train", state="aborted", attempt=2, max_attempts=3,
        started_at=time.time() - 60, ended_at=time.time(), exit_code=7, command_exit_code=130, throughput=98364.0,
        throughput_baseline=505695.0, throughput_min_ratio=0.5, log_silence_seconds=0.4, stall_timeout_seconds=900.0,
        heartbeat_at=time.time(), aborts={"fx-tracing-race": 1}, restarts={"stall": 1},
        matches=[("throughput-drop", "warn", 2)], notifications=[("aborted", "webhook", 1, 1)],
        gpus=[GpuReading(5, "GPU-4b5d3c1e-0f7a-2c8e-9d1b-6a3f5e7c9b2d", 1443, 17, 1, 1443.0)])


def test_every_dashboard_query_runs_and_reads_series(prom: PromStack) -> None:
    """Each panel's PromQL (Grafana's variables set to All) against the real Prometheus: a typo is a query error or
    an empty panel. The GPU health panel (issue 36's families) and the DCGM join wait for series gpuops or DCGM
    exporter do not have here: they must parse."""
    from test_metrics_dashboard import HEALTH, queries

    run = "20261206-000000-dash00"
    path = prom.textfile_dir / f"gpuops-{run}.prom"
    live = full_run("20261206-000000-dash01")
    live.state, live.exit_code, live.ended_at = "running", None, None
    path.write_text(render([full_run(run), live]))  # one ended run, one live
    try:
        wait_until(lambda: prom.query(f'gpuops_run_info{{run="{run}"}}'), timeout=SEEN_WITHIN,
                   message="the synthetic run in Prometheus")
        for panel, target in queries():
            expr = re.sub(r"\$(target|playbook|run)\b", ".*", target["expr"])
            result = prom.query(expr)
            if HEALTH in target["expr"] or "DCGM_" in target["expr"]:
                continue
            assert result, f"panel {panel['title']!r} query {target['refId']} reads nothing: {expr}"
    finally:
        path.unlink()


def test_hostile_names_reach_prometheus_escaped_and_bounded(prom: PromStack) -> None:
    """A target and playbook name with quotes, backslashes and a newline, one of 10,000 characters, a rule that is
    a log line: node_exporter reads the file (no scrape error), Prometheus gets the names as written (the long one
    cut to 128 characters), and the log line never reaches a label."""
    hostile = 'ct"200\\x\nend\ttab\x00nul \u00e9'
    runs = {"20261206-000000-host01": hostile, "20261206-000000-host02": "t" * 10_000}
    paths = []
    for run, name in runs.items():
        snap = full_run(run)
        snap.target, snap.playbook = name, name
        snap.aborts = {'RuntimeError: "x"\nTraceback (most recent call last):': 1}
        text = render([snap])
        assert promtool_check(text) == ""
        paths.append(prom.textfile_dir / f"gpuops-{run}.prom")
        paths[-1].write_text(text)
    try:
        rows = wait_until(lambda: (r := prom.query('gpuops_run_info{run=~"20261206-000000-host.*"}')) and len(r) == 2
                          and r, timeout=SEEN_WITHIN, message="both runs in Prometheus")
        got = {r["metric"]["run"]: r["metric"]["target"] for r in rows}
        assert got["20261206-000000-host01"] == hostile
        assert len(got["20261206-000000-host02"]) == 128 and got["20261206-000000-host02"].startswith("t" * 100)
        assert one(prom, 'node_textfile_scrape_error') == 0
        rules = {r["metric"]["rule"] for r in prom.query('gpuops_aborts_total{run=~"20261206-000000-host.*"}')}
        assert rules == {"other"}
    finally:
        for path in paths:
            path.unlink()


# -- a metrics place that fails ----------------------------------------------------------------------------------------
@pytest.fixture
def silent_pushgateway() -> Iterator[str]:
    """A Pushgateway that accepts connections and never answers (a hung server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_an_unwritable_folder_and_a_silent_pushgateway_change_neither_the_abort_nor_its_exit_code(
        ct: CtCli, tmp_path: Path, silent_pushgateway: str) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the folder should be\n")
    write_playbook(ct, f"{perf(60)} & sleep 2; echo 'loss nan at step 20'; wait",
                   {"textfile": str(blocker / "textfile"), "pushgateway": silent_pushgateway},
                   rules=[{"name": "loss-nan", "pattern": r"loss nan\b", "action": "abort"}])
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    summary = result.events()[-1]
    assert summary["rule"] == "loss-nan" and summary["by"] == "watchdog"
    events = [json.loads(line) for line in (ct.run_dir() / "events.jsonl").read_text().splitlines()]
    failed = [e["message"] for e in events if e["event"] == "metrics_failed"]
    assert len([m for m in failed if "metrics file" in m]) == 1, failed  # said once, not every sample
    assert any(str(blocker) in m and "Not a directory" in m for m in failed), failed
    assert not any(silent_pushgateway.split("://")[1] in m for m in failed)
    assert not blocker.with_name("textfile").exists()
