"""The agent's side of the metrics, in-process on made-up run directories: what a run's records say (reading.py),
the textfile written whole (outlets.py), a failing or slow place said once and never waited for, and the sweep."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from bench import wait_until

from gpuops.agent.metrics.outlets import STALE_AFTER, Outlet, group_url, sweep, textfile_name, write_textfile
from gpuops.agent.metrics.reading import Reader
from gpuops.agent.wire import protocol as p
from gpuops.agent.wire import watchfile

RUN = "20261206-101500-3fa9c2"


def cfg(**over: object) -> watchfile.WatchConfig:
    raw = {"run": RUN, "playbook": "pb", "session": "train", "gpus": [5, 6],
           "rules": [{"name": "loss-nan", "pattern": "loss nan", "action": "abort"}],
           "restart": {"max": 2, "on": ["stall", "loss-nan"]}, "throughput": {"pattern": r"tok/s (\d+)", "min_ratio": 0.4},
           **over}
    return watchfile.parse(raw)


def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / RUN
    d.mkdir()
    (d / p.META).write_text(json.dumps({"id": RUN, "playbook": "pb", "target": "ct200", "session": "train",
                                        "phase": "running"}))
    (d / p.LOG).write_text("step 1\n")
    return d


def beat(**over: object) -> dict:
    return {"ts": time.time(), "started": time.time() - 60, "state": "watching", "attempt": 1, "max_attempts": 3,
            "stall": {"timeout": 900.0}, "telemetry": {
                "gpus": {"5": [1443, 17], "6": [None, None]}, "processes": {"5": 1, "6": 0}, "throughput": 505695,
                "uuids": {"5": "GPU-aaa", "6": "GPU-bbb"},
                "baseline": {"throughput": 500000.0, "gpu_memory": {"5": 1400.0}}}, **over}


def events(d: Path, *records: dict, partial: str = "") -> None:
    with open(d / p.EVENTS, "a") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
        fh.write(partial)


def test_a_live_run_as_its_records_say(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    snap = Reader(str(d), cfg()).snapshot(time.time(), beat(), live=True)
    assert (snap.run, snap.target, snap.playbook, snap.session, snap.state) == (RUN, "ct200", "pb", "train", "running")
    assert (snap.attempt, snap.max_attempts, snap.exit_code, snap.ended) == (1, 3, None, False)
    assert (snap.throughput, snap.throughput_baseline, snap.throughput_min_ratio) == (505695, 500000.0, 0.4)
    assert snap.stall_timeout_seconds == 900.0 and 0 <= (snap.log_silence_seconds or 0) < 60
    gpus = {g.gpu: g for g in snap.gpus}
    assert (gpus[5].uuid, gpus[5].memory_used_mib, gpus[5].utilization_pct, gpus[5].processes,
            gpus[5].memory_baseline_mib) == ("GPU-aaa", 1443, 17, 1, 1400.0)
    assert (gpus[6].memory_used_mib, gpus[6].memory_baseline_mib) == (None, None)  # [N/A] stays no sample
    assert snap.heartbeat_age_seconds is None  # a file is read later: the time, not an age


def test_aborts_restarts_and_matches_by_rule_over_every_attempt_and_no_text_in_a_label(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    for n, (reason, rule) in enumerate((("stall", None), ("match", "loss-nan")), 1):
        folder = Path(p.attempt_dir(str(d), n))
        folder.mkdir(parents=True)
        (folder / p.ATTEMPT).write_text(json.dumps({"attempt": n, "rule": rule or reason}))
        (folder / p.ABORT).write_text(json.dumps({"reason": reason, "rule": rule}))
    (d / p.ABORT).write_text(json.dumps({"reason": "match", "rule": 'RuntimeError: "x"\nTraceback'}))
    events(d, {"event": "match", "rule": "loss-nan", "action": "abort"},
           {"event": "match", "rule": "Traceback (most recent call last):", "action": "warn"},
           {"event": "notify_sent", "what": "aborted", "channel": 1, "via": "webhook"},
           {"event": "notify_failed", "what": "restarted", "channel": 2, "via": "command"},
           {"event": "notify_failed", "what": "aborted", "channel": None, "reason": "cannot queue"},
           partial='{"event": "match", "rule": "loss-nan", "act')  # a line being written: read at the next look
    reader = Reader(str(d), cfg())
    snap = reader.snapshot(time.time(), beat(attempt=3), live=True)
    assert snap.state == "aborting"
    assert snap.aborts == {"stall": 1, "loss-nan": 1, "other": 1}
    assert snap.restarts == {"stall": 1, "loss-nan": 1}
    assert snap.matches == [("loss-nan", "abort", 1), ("other", "warn", 1)]
    assert snap.notifications == [("aborted", "webhook", 1, 0), ("restarted", "command", 0, 1)]
    events(d, partial='ion": "abort"}\n')
    assert reader.snapshot(time.time(), beat(attempt=3), live=True).matches[0] == ("loss-nan", "abort", 2)


def test_an_ended_run_has_its_exit_code_and_keeps_its_gpus_uuids_not_their_samples(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    (d / p.EXIT_CODE).write_text("0\n")
    snap = Reader(str(d), cfg()).snapshot(time.time(), beat(state="done"), live=False)
    assert (snap.state, snap.exit_code, snap.command_exit_code, snap.ended) == ("succeeded", 0, 0, True)
    assert snap.ended_at and abs(snap.ended_at - time.time()) < 60
    assert [(g.uuid, g.memory_used_mib, g.utilization_pct) for g in snap.gpus] == [("GPU-aaa", None, None),
                                                                                     ("GPU-bbb", None, None)]
    assert snap.log_silence_seconds is None


def test_gpu_health_counters_in_the_heartbeat_reach_the_gpus_reading(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    b = beat()
    b["telemetry"]["health"] = {"5": {"ecc_uncorrected": 2, "note": "text is no counter"}}
    gpus = {g.gpu: g for g in Reader(str(d), cfg()).snapshot(time.time(), b, live=True).gpus}
    assert (gpus[5].health, gpus[6].health) == ({"ecc_uncorrected": 2}, {})


def test_a_restart_waiting_and_a_node_of_a_torchrun_job(tmp_path: Path) -> None:
    d = run_dir(tmp_path)
    (d / p.ATTEMPT).write_text(json.dumps({"attempt": 2, "state": p.ATTEMPT_WAITING}))
    job = {"id": RUN, "node_rank": 1, "nodes": ["ct200", "ct201"], "endpoint": "a:1", "node_name": "ct201", "key": "k"}
    snap = Reader(str(d), cfg(job=job)).snapshot(time.time(), {"state": "restarting", "attempt": 2}, live=True)
    assert (snap.state, snap.attempt, snap.node, snap.node_rank) == ("restarting", 2, "ct201", 1)
    assert textfile_name(RUN, 1) == f"gpuops-{RUN}-node1.prom" and textfile_name(RUN, None) == f"gpuops-{RUN}.prom"
    assert group_url("http://pg:9091/", RUN, "ct201") == f"http://pg:9091/metrics/job/gpuops/run/{RUN}/node@base64/Y3QyMDE"


def test_the_textfile_is_replaced_whole_readable_by_others_and_leaves_no_temporary(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        write_textfile(str(tmp_path), "gpuops-x.prom", "a 1\n")
        write_textfile(str(tmp_path), "gpuops-x.prom", "a 2\n")
    finally:
        os.umask(old)
    assert [f.name for f in tmp_path.iterdir()] == ["gpuops-x.prom"]
    assert (tmp_path / "gpuops-x.prom").read_text() == "a 2\n"
    assert stat.S_IMODE((tmp_path / "gpuops-x.prom").stat().st_mode) == 0o644  # node_exporter's own user reads it
    with pytest.raises(OSError):
        write_textfile(str(tmp_path / "gpuops-x.prom"), "y.prom", "a 1\n")  # a file where the folder should be


def test_a_failing_place_is_said_once_per_spell_and_a_slow_one_never_holds_up_an_offer() -> None:
    state = {"fail": True}
    release = threading.Event()
    delivered: list[str] = []

    def deliver(text: str) -> None:
        if text == "slow":
            release.wait(30)
        if state["fail"]:
            raise OSError(28, "No space left on device")
        delivered.append(text)

    outlet = Outlet("cannot write the run's metrics file in /m", deliver, lambda t: t.replace("/m", "/***"))
    for text in ("a", "b", "c"):
        outlet.offer(text)
        assert outlet.flush(10)
    assert outlet.warning() == "cannot write the run's metrics file in /***: No space left on device"
    assert outlet.warning() is None  # once
    state["fail"] = False
    outlet.offer("d")
    assert outlet.flush(10) and delivered == ["d"] and outlet.warning() is None
    outlet.offer("slow")
    wait_until(lambda: outlet.busy, message="the slow delivery under way")
    for text in ("e", "f", "g"):
        outlet.offer(text)  # the place is stuck: offers replace what waits, none waits for it
    assert outlet.busy and not release.is_set() and not outlet.flush(0.1)  # they returned while it is still stuck
    release.set()
    assert outlet.flush(30) and delivered == ["d", "slow", "g"]  # the newest text wins


def test_the_sweep_takes_only_gpuops_files_nobody_rewrote_for_a_day(tmp_path: Path) -> None:
    names = ("gpuops-old.prom", "gpuops-new.prom", "other.prom", "gpuops-mine.prom", ".gpuops-old.prom.7.tmp",
             ".gpuops-new.prom.8.tmp")
    for name in names:
        (tmp_path / name).write_text("x 1\n")
    past = time.time() - STALE_AFTER - 60
    for name in ("gpuops-old.prom", "other.prom", "gpuops-mine.prom", ".gpuops-old.prom.7.tmp"):
        os.utime(tmp_path / name, (past, past))
    sweep(str(tmp_path), "gpuops-mine.prom")
    assert sorted(f.name for f in tmp_path.iterdir()) == [".gpuops-new.prom.8.tmp", "gpuops-mine.prom",
                                                          "gpuops-new.prom", "other.prom"]


def test_the_metrics_tool_lists_live_runs_and_those_ended_within_keep_ended(tmp_path: Path) -> None:
    from gpuops.agent.metrics.tool import snapshots

    runs = tmp_path / ".gpuops" / "runs"
    now = time.time()
    for run, ended_ago, keep in (("20261206-000001-aaaaaa", None, 600), ("20261206-000002-bbbbbb", 30, 600),
                                 ("20261206-000003-cccccc", 30, 10), ("20261206-000004-dddddd", 4000, 600)):
        d = runs / run
        d.mkdir(parents=True)
        (d / p.META).write_text(json.dumps({"id": run, "playbook": "pb", "target": "ct200", "session": "s" + run[-1],
                                            "phase": "running"}))
        (d / p.WATCH).write_text(json.dumps(watchfile.compose(cfg(run=run, metrics={"keep_ended": keep}))))
        (d / p.WATCHDOG).write_text(json.dumps(beat(state="done" if ended_ago else "watching")))
        if ended_ago:
            (d / p.EXIT_CODE).write_text("1\n")
            for name in (p.EXIT_CODE, p.WATCHDOG):
                os.utime(d / name, (now - ended_ago, now - ended_ago))
    got = snapshots(now, home=str(tmp_path))
    assert [(s["run"], s["state"], s["exit_code"]) for s in got] == [
        ("20261206-000002-bbbbbb", "failed", 6), ("20261206-000001-aaaaaa", "running", None)]
    assert got[1]["heartbeat_age_seconds"] is not None and got[1]["schema_version"] == p.SCHEMA_VERSION
    assert [s["run"] for s in snapshots(now, "other-playbook", home=str(tmp_path))] == []


def test_a_launch_in_warmup_is_warming_while_it_holds_the_launch_lock_and_not_started_once_its_launcher_is_gone(
        tmp_path: Path) -> None:
    import fcntl

    from gpuops.agent.metrics.tool import snapshots

    state = tmp_path / ".gpuops"
    d = state / "runs" / RUN
    d.mkdir(parents=True)
    (d / p.META).write_text(json.dumps({"id": RUN, "playbook": "pb", "target": "ct200", "session": "train",
                                        "phase": "warmup"}))
    (state / p.SESSIONS).mkdir()
    (state / p.SESSIONS / "train").write_text(RUN + "\n")
    (state / p.LOCKS).mkdir()
    with open(state / p.LOCKS / "train.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the launcher, warming up
        assert [(s["state"], s["exit_code"]) for s in snapshots(time.time(), home=str(tmp_path))] == [("warming", None)]
    assert [(s["state"], s["exit_code"]) for s in snapshots(time.time(), home=str(tmp_path))] == [("not-started", None)]
