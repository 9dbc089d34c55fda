"""`launch --report FILE`, `logs -f --report FILE` and `gpuops report [RUN]` on the bench: a run hit by the FX race,
on the local target and over the real sshd into CT 200; the page is read back as a person would find it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from bench import LocalEnv
from bench.cli import CtCli, gpuops

SESSION = "report-train"
FX = "fake-train --mode fx-thread --gpus 5,6 --interval 0.1 --go {go}"
WARMUP = "fake-warmup --gpu {gpu} --duration 0.3 --steps 2"
SECRET = "hf_s3cr3t-report-7777"


def playbook_data(command: str, **extra: Any) -> dict[str, Any]:
    return {"name": "report-test", "env": {"HF_TOKEN": {"value": SECRET, "secret": True}},
            "preflight": {"gpus": [5, 6]}, "warmup": {"gpus": [5, 6], "command": WARMUP, "timeout": 60},
            "launch": {"session": SESSION, "command": command},
            "watch": {"stall_timeout": 0, "sample_interval": 0.5}, "abort": {"grace": 3}, **extra}


def read_page(path: Path, run: str, rule: str = "fx-tracing-race") -> str:
    """The report a CI artifact holds: one file, at least two plots drawn with data, the run and the rule."""
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 2
    assert f"run {run}" in page and f"<th>rule</th><td>{rule}</td>" in page
    assert page.count("<polyline") >= 2  # memory and utilisation lines from the watchdog's samples
    assert "warmup GPU 5" in page and "training starts" in page and "abort (watchdog)" in page
    assert SECRET not in page
    assert not re.search(r"""(?:src|href)\s*=\s*["']?https?:""", page)
    return page


def test_launch_report_on_the_local_target_and_gpuops_report_of_the_finished_run(local_env: LocalEnv,
                                                                                 tmp_path: Path) -> None:
    inv = tmp_path / "local.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"here": {"transport": "local"}},
                                   "targets": {"local": {"host": "here", "gpus": [5, 6]}}}))
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({**playbook_data("sleep 2; touch go; " + FX.format(go="go")), "target": "local",
                                  "workdir": str(tmp_path)}))
    out = tmp_path / "report.html"
    result = gpuops("launch", "-i", str(inv), "-p", str(pb), "--yes", "--json", "--report", str(out))
    assert result.code == 7, result
    summary = result.events()[-1]
    page = read_page(out, summary["run"])
    assert "<th>exit code</th><td>7</td>" in page and "HF_TOKEN" not in page.split("<th>command</th>")[0]

    again = tmp_path / "again.html"
    got = gpuops("report", "-i", str(inv), "-p", str(pb), "-o", str(again), "--json")
    assert got.code == 0, got
    (event,) = got.events()
    assert event["event"] == "report" and event["run"] == summary["run"] and event["path"] == str(again)
    assert event["plots"] == 3 and event["exit_code"] == 7
    read_page(again, summary["run"])

    unknown = gpuops("report", "-i", str(inv), "-p", str(pb), "20261203-000000-abcdef", "-o", str(tmp_path / "x.html"))
    assert unknown.code == 2, unknown
    assert f"no run 20261203-000000-abcdef in ~/.gpuops/runs (its newest runs: {summary['run']})" in unknown.err
    assert "Traceback" not in unknown.err and not (tmp_path / "x.html").exists()


def test_launch_report_over_ssh_into_the_container(ct: CtCli, tmp_path: Path) -> None:
    go = tmp_path / "go"
    ct.write(playbook_data(f"sleep 2; touch {go}; " + FX.format(go=go)))
    out = tmp_path / "report.html"
    result = ct.gpuops("launch", "--yes", "--report", str(out))
    assert result.code == 7, result
    assert f"gpuops: the run's report: {out}" in result.err
    page = read_page(out, ct.run_id())
    assert "<th>target</th><td>ct200 (CT 200)</td>" in page
    assert "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function" in page


def test_logs_follow_report_writes_the_page_when_the_run_it_follows_ends(ct: CtCli, tmp_path: Path) -> None:
    go = tmp_path / "go"
    ct.write(playbook_data(FX.format(go=go)))
    started = ct.gpuops("launch", "--yes", "--detach")
    assert started.code == 0, started
    follower = ct.start("logs", "-f", "--json", "--report", str(tmp_path / "followed.html"))
    follower.wait_for(lambda: '"event": "following"' in follower.out, "the follower attached")
    go.touch()
    done = follower.finish()
    assert done.code == 7, done
    read_page(tmp_path / "followed.html", ct.run_id())
    assert json.loads(done.text.splitlines()[-1])["event"] == "summary"


def test_report_needs_follow_on_logs(ct: CtCli, tmp_path: Path) -> None:
    ct.write(playbook_data("true"))
    result = ct.gpuops("logs", "--report", str(tmp_path / "r.html"))
    assert result.code == 2 and "--report needs --follow" in result.err, result
