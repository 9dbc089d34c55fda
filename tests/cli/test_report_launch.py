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
from test_report import python_values

SESSION = "report-train"
FX = "fake-train --mode fx-thread --gpus 5,6 --interval 0.1 --go {go}"
WARMUP = "fake-warmup --gpu {gpu} --duration 0.3 --steps 2"
SECRET = "hf_s3cr3t-report-7777"


def playbook_data(command: str, **extra: Any) -> dict[str, Any]:
    return {"name": "report-test", "env": {"HF_TOKEN": {"value": SECRET, "secret": True}},
            "preflight": {"gpus": [5, 6]}, "warmup": {"gpus": [5, 6], "command": WARMUP, "timeout": 60},
            "launch": {"session": SESSION, "command": command},
            "watch": {"stall_timeout": 0, "sample_interval": 0.5}, "abort": {"grace": 3}, **extra}


def read_page(path: Path, run: str, rule: str = "fx-tracing-race", aborted: bool = True) -> str:
    """The report a CI artifact holds: one file, at least two plots drawn with data, the run and the rule, in words
    (no Python value where a person reads words)."""
    page = path.read_text()
    assert python_values(page) == []
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") >= 2
    assert f"run {run}" in page and f"<th>rule</th><td>{rule}</td>" in page
    assert page.count("<polyline") >= 2  # memory and utilisation lines from the watchdog's samples
    assert "warmup GPU 5" in page and "training starts" in page and ("abort (watchdog)" in page) == aborted
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


#: A figure a float holds but no plot can draw (1.7e308 tokens/s), between ordinary ones; the training then fails.
HUGE = ("for i in 1 2 3 4 5 6; do echo \"step $i tok/s 505000\"; sleep 0.2; done; "
        "for i in 7 8 9 10 11 12; do echo \"step $i tok/s 1.7e308\"; sleep 0.2; done; exit 3")


def launch_with_a_huge_figure(ct: CtCli, tmp: Path) -> str:
    """`launch --report` of a run that logs 1.7e308 tokens/s and fails, then `gpuops report` of it: what the
    throughput plot says under it (the fault matrix's row 35.6 runs this too)."""
    data = playbook_data(HUGE)
    data["watch"] = {**data["watch"], "throughput": {"pattern": "tok/s ([0-9.e+]+)"}}
    ct.write(data)
    out = tmp / "report.html"
    result = ct.gpuops("launch", "--yes", "--report", str(out))
    assert result.code == 6, result  # the training's exit 3: what the run says, not the report
    assert "Traceback" not in result.err and f"gpuops: the run's report: {out}" in result.err
    page = read_page(out, ct.run_id(), rule="-", aborted=False)
    tp = re.findall(r"<svg.*?</svg>", page, re.S)[0]
    assert "<polyline" in tp  # 505k is drawn
    note = re.search(r'<p class="plotnote">(Left out of this plot: \d+ figures? that cannot be drawn .*?1\.7e\+308 at .*?)</p>', page)
    assert note, page[page.index("Throughput"):][:3000]
    again = ct.gpuops("report", "-o", str(tmp / "again.html"))
    assert again.code == 0 and "1.7e+308 at" in (tmp / "again.html").read_text(), again
    return f"launch --report: exit {result.code} (the run's), report written; gpuops report: exit 0; {note.group(1)}"


def test_a_figure_no_plot_can_draw_leaves_the_runs_exit_code_and_the_report_says_it(ct: CtCli, tmp_path: Path) -> None:
    launch_with_a_huge_figure(ct, tmp_path)
