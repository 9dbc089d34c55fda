"""Watch and abort, end to end: `gpuops launch` over real sshd + pct into CT 200, real tmux, fake trainers.

What a user notices is asserted: the exit code, the words and excerpt on the terminal or in JSON,
the abort record in the run directory, the tmux session gone, no process of the run left, and the
trainer's (fake) GPU memory back to 0.
"""

from __future__ import annotations

import calendar
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench import FakeProxmox, SshServer, procs, wait_until, write_inventory
from bench.cli import CLI_TIMEOUT, Cli, Running, gpuops

GPUS = (5, 6)
SESSION = "train"
FX_LINE = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function"


# -- helpers shared with test_logs_stop.py ------------------------------------------------------
def write_playbook(
    path: Path,
    command: str,
    *,
    stall: float = 0,
    signal_name: str = "INT",
    grace: float = 5,
    rules: list[dict[str, str]] | None = None,
    builtin: bool = True,
    gpus: tuple[int, ...] = GPUS,
) -> Path:
    """A playbook that runs `command` in tmux session `train`, watching GPUs `gpus`."""
    data: dict[str, Any] = {
        "name": "watch-test",
        "preflight": {"gpus": list(gpus)},
        "launch": {"session": SESSION, "command": command},
        "watch": {"builtin": builtin, "rules": rules or [], "stall_timeout": stall},
        "abort": {"signal": signal_name, "grace": grace},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trainer(mode: str, *extra: str) -> str:
    """A fake-train command line on the run's GPUs."""
    return " ".join(["fake-train", "--mode", mode, "--gpus", ",".join(map(str, GPUS)), "--interval", "0.05", *extra])


@dataclass
class Ct:
    """CT 200 on the bench's fake Proxmox host, reached over real sshd, and the gpuops files for it."""

    sshd: SshServer
    fake: FakeProxmox
    inventory: Path
    tmp: Path
    vmid: int = 200

    def playbook(self, command: str, **options: Any) -> Path:
        return write_playbook(self.tmp / "playbook.yaml", command, **options)

    def argv(self, command: str, *args: str, playbook: Path | None = None) -> list[str]:
        pb = playbook or self.tmp / "playbook.yaml"
        return [sys.executable, "-m", "gpuops", command, "-i", str(self.inventory), "-p", str(pb), "-t", "ct200", *args]

    def gpuops(self, command: str, *args: str, playbook: Path | None = None, timeout: float = CLI_TIMEOUT,
               env: dict[str, str] | None = None) -> Cli:
        argv = self.argv(command, *args, playbook=playbook)
        if command == "launch":
            argv.append("--yes")
        return gpuops(*argv[3:], timeout=timeout, env=env)

    def start(self, command: str, *args: str, playbook: Path | None = None) -> Running:
        argv = self.argv(command, *args, playbook=playbook)
        if command == "launch":
            argv.append("--yes")
        return Running(*argv[3:])  # bench.cli.Running adds `python -m gpuops` itself

    def launch_detached(self, command: str, **options: Any) -> str:
        """`launch --detach` a run of `command`; return its run id once the run is started and watched."""
        self.playbook(command, **options)
        result = self.gpuops("launch", "--detach")
        assert result.code == 0, result
        run_id = self.run_id()
        assert f"run {run_id} started in tmux session '{SESSION}'" in result.err, result
        assert "its watchdog stops it" in result.err, result
        return run_id

    # -- what is on the target ---------------------------------------------------------------
    def run_id(self) -> str:
        return (self.fake.home(self.vmid) / ".gpuops" / "sessions" / SESSION).read_text().strip()

    def run_dir(self, run_id: str | None = None) -> Path:
        return self.fake.home(self.vmid) / ".gpuops" / "runs" / (run_id or self.run_id())

    def log(self) -> bytes:
        return (self.run_dir() / "log").read_bytes()

    def abort_record(self) -> dict[str, Any]:
        return json.loads((self.run_dir() / "abort.json").read_text())

    def session_alive(self) -> bool:
        return self.fake.tmux(self.vmid, "has-session", "-t", f"={SESSION}").returncode == 0

    def run_processes(self, run_id: str | None = None) -> list[int]:
        """Live processes that carry the run's marker (GPUOPS_RUN_ID=<id>) in their environment."""
        marker = (run_id or self.run_id()).encode()
        return procs.find(lambda env: env.get(b"GPUOPS_RUN_ID") == marker)

    def gpu_memory(self) -> dict[int, int]:
        gpus = self.fake.gpus(self.vmid)
        return {g: gpus.memory_used(g) for g in GPUS}

    def wait_training(self) -> None:
        """The trainer holds its GPUs (fake memory registered)."""
        wait_until(lambda: all(self.gpu_memory().values()), timeout=60, message="the trainer's GPU memory")

    def assert_run_gone(self) -> None:
        """What a user checks after a run ended: no session, no process of the run, GPUs drained."""
        assert not self.session_alive(), "the tmux session is still alive"
        assert self.run_processes() == [], "processes of the run are left"
        assert self.gpu_memory() == dict.fromkeys(GPUS, 0)


def make_ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Ct:
    files = tmp_path / "gpuops files"  # a space in the paths: the hints gpuops prints must still work
    files.mkdir()
    inventory = write_inventory(files / "inventory.yaml", sshd)
    return Ct(sshd, fake_proxmox, inventory, files)


def excerpt_lines(text: str) -> list[str]:
    """The excerpt as the text renderer shows it on stderr (`    | ` lines)."""
    return [line[6:] for line in text.splitlines() if line.startswith("    | ")]


# -- the FX-tracing race in real PyTorch output -------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "first_excerpt_line"),
    [
        ("fx-thread", "Exception in thread drafter-1:"),  # uncaught in a drafter thread
        ("fx-interleaved", "Traceback (most recent call last):"),  # three threads' tracebacks interleaved
        ("fx-caught", "Traceback (most recent call last):"),  # logged, eager fallback, the process runs on
        ("fx-tqdm", "Traceback (most recent call last):"),  # after a tqdm bar's carriage returns
        ("fx-rank", None),  # torchrun's [rank0]: prefixes
    ],
)
def test_fx_race_aborts_with_the_excerpt_and_drains_the_gpus(ct: Ct, mode: str, first_excerpt_line: str | None) -> None:
    ct.playbook(trainer(mode))
    result = ct.gpuops("launch")
    assert result.code == 7, result
    assert "ABORT: rule 'fx-tracing-race' matched" in result.err, result
    excerpt = excerpt_lines(result.err)
    assert FX_LINE in excerpt[-1], result
    assert any("Traceback (most recent call last):" in line for line in excerpt), result
    if first_excerpt_line:
        assert any(line.endswith(first_excerpt_line) for line in excerpt), result
    assert re.search(r"gpuops: ABORTED \(exit 7\): run \S+ aborted: rule 'fx-tracing-race' matched", result.err), result
    ct.assert_run_gone()
    assert b"Traceback (most recent call last):" in result.out  # the log streamed as it came


def test_caught_fx_race_is_aborted_while_the_trainer_keeps_running(ct: Ct) -> None:
    ct.playbook(trainer("fx-caught", "--slow-interval", "0.2"))
    result = ct.gpuops("launch")
    assert result.code == 7, result
    # The trainer never exited by itself: gpuops' Ctrl-C ended it (the exit code run.sh recorded).
    assert (ct.run_dir() / "exit_code").read_text().strip() == "130"
    ct.assert_run_gone()


def test_fx_race_on_a_local_target_aborts_the_same_way(local_env: Any, tmp_path: Path) -> None:
    inventory = tmp_path / "local.yaml"
    inventory.write_text("hosts: {here: {transport: local}}\ntargets: {local: {host: here}}\n")
    playbook = write_playbook(tmp_path / "playbook.yaml", trainer("fx-thread"))
    argv = [sys.executable, "-m", "gpuops", "launch", "--yes", "-i", str(inventory), "-p", str(playbook), "-t", "local"]
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLI_TIMEOUT)
    assert result.returncode == 7, result.stderr
    assert "rule 'fx-tracing-race' matched" in result.stderr
    assert local_env.tmux("has-session", "-t", f"={SESSION}").returncode != 0
    assert [local_env.gpus.memory_used(g) for g in GPUS] == [0, 0]


def test_a_log_that_only_mentions_the_messages_does_not_abort(ct: Ct) -> None:
    ct.playbook(trainer("sample", "--sample", "mentions", "--then", "exit", "--code", "0"))
    result = ct.gpuops("launch")
    assert result.code == 0, result
    assert "ABORT" not in result.err and "WARN" not in result.err, result
    assert FX_LINE.encode() in result.out  # the mention was there, and streamed
    assert "finished with exit code 0" in result.err
    assert not (ct.run_dir() / "abort.json").exists()
    ct.assert_run_gone()


# -- other fatal signatures ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mode", "rule", "last_line"),
    [
        ("oom", "cuda-oom", "torch.OutOfMemoryError: CUDA out of memory."),
        ("assert", "cuda-error", "torch.AcceleratorError: CUDA error: device-side assert triggered"),
    ],
)
def test_oom_and_device_side_assert_abort(ct: Ct, mode: str, rule: str, last_line: str) -> None:
    # These trainers print the traceback and exit 1 at once: the match decides (7), not the exit (6).
    ct.playbook(trainer(mode))
    result = ct.gpuops("launch")
    assert result.code == 7, result
    assert f"rule '{rule}' matched" in result.err, result
    assert any(line.startswith(last_line) for line in excerpt_lines(result.err)), result
    record = ct.abort_record()
    assert record["rule"] == rule and record["line"].startswith(last_line)
    ct.assert_run_gone()


# -- the abort record ---------------------------------------------------------------------------
def test_abort_record_says_which_rule_when_and_the_excerpt(ct: Ct) -> None:
    ct.playbook(trainer("fx-thread"))
    before = time.time()
    result = ct.gpuops("launch")
    assert result.code == 7, result
    record = ct.abort_record()
    assert record["reason"] == "match"
    assert record["rule"] == "fx-tracing-race"
    assert record["line"].startswith(FX_LINE)
    assert "Exception in thread drafter-1:" in record["excerpt"] and FX_LINE in record["excerpt"]
    stamp = calendar.timegm(time.strptime(record["time"], "%Y-%m-%dT%H:%M:%SZ"))
    assert before - 2 <= stamp <= time.time() + 2
    assert (record["signal"], record["grace"]) == ("INT", 5)


# -- how the run is stopped: signal, grace, kill, reap ------------------------------------------
def test_abort_signal_term_reaches_the_foreground_job(ct: Ct) -> None:
    ct.playbook(trainer("fx-caught"), signal_name="TERM", grace=30)
    result = ct.gpuops("launch")
    assert result.code == 7, result
    assert ct.abort_record()["signal"] == "TERM"
    # Died of SIGTERM (143), not of the session kill (SIGHUP, 129) after the grace.
    assert (ct.run_dir() / "exit_code").read_text().strip() == "143"
    ct.assert_run_gone()


def test_a_trainer_that_ignores_ctrl_c_is_killed_after_the_grace(ct: Ct) -> None:
    ct.playbook(trainer("ignore-int"), grace=2, rules=[{"name": "step-20", "pattern": r"^step 20/", "action": "abort"}])
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    events = result.events()
    (aborted,) = [e for e in events if e["event"] == "aborted"]
    assert aborted["seconds"] >= 2.0  # Ctrl-C did nothing; the session was killed when the grace ran out
    assert aborted["survivors"] == []
    assert events[-1]["rule"] == "step-20"
    # It kept logging after Ctrl-C: the grace was waited out, not cut short.
    steps_logged = [int(m) for m in re.findall(rb"^step (\d+)/", ct.log(), re.M)]
    assert max(steps_logged) > 21
    ct.assert_run_gone()


def test_workers_that_left_the_session_are_killed_on_abort(ct: Ct) -> None:
    ct.playbook(trainer("spawn-orphan", "--steps", "100000"), rules=[{"name": "step-10", "pattern": r"^step 10/"}])
    result = ct.gpuops("launch")
    assert result.code == 7, result
    ct.assert_run_gone()


def test_workers_left_behind_by_a_finished_run_are_reaped(ct: Ct) -> None:
    ct.playbook(trainer("spawn-orphan", "--steps", "3"))
    result = ct.gpuops("launch")
    assert result.code == 0, result
    ct.assert_run_gone()


# -- a run that ends by itself: the rest of the log goes through the matcher first -------------
@pytest.mark.parametrize(
    ("command", "code", "words"),
    [
        (trainer("steps", "--steps", "3"), 0, "finished with exit code 0"),
        (trainer("exit", "--steps", "3", "--code", "3"), 6, "training exited with code 3"),
        (trainer("sample", "--sample", "oom", "--then", "exit", "--code", "1"), 7, "rule 'cuda-oom' matched"),
        (trainer("sample", "--sample", "fx_race_thread", "--then", "exit", "--code", "0"), 7, "rule 'fx-tracing-race' matched"),
        # The traceback is the log's last bytes, without a final newline, and the trainer exits 1 at once.
        ("printf 'Traceback (most recent call last):\\n  File \"t.py\", line 1, in <module>\\n"
         "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function.'; exit 1",
         7, "rule 'fx-tracing-race' matched"),
    ],
    ids=["exit-0", "exit-3", "oom-then-exit-1", "fx-then-exit-0", "fx-as-last-bytes"],
)
def test_exit_code_of_a_run_that_ends_by_itself(ct: Ct, command: str, code: int, words: str) -> None:
    ct.playbook(command)
    result = ct.gpuops("launch")
    assert result.code == code, result
    assert words in result.err, result
    wait_until(lambda: not ct.session_alive(), message="the session to end")
    ct.assert_run_gone()


def test_fx_race_after_megabytes_of_output_is_caught(ct: Ct) -> None:
    count = 100_000  # about 7.6 MB of log lines flat out, then the traceback, then exit 0
    ct.playbook(f"fake-train --mode numbered --count {count} --width 64 --then-sample fx_race_thread")
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    events = result.events()
    logged = [e["line"] for e in events if e["event"] == "log"]
    assert logged[count - 1].startswith(f"line {count:06d} ") and logged[count] == "Exception in thread drafter-1:"
    (match,) = [e for e in events if e["event"] == "match"]
    assert match["rule"] == "fx-tracing-race" and match["line_number"] == count + 12
    ct.assert_run_gone()


# -- stall --------------------------------------------------------------------------------------
def test_a_silent_run_is_stopped_as_stalled(ct: Ct) -> None:
    ct.playbook(trainer("hang", "--steps", "4"), stall=3)
    started = time.monotonic()
    result = ct.gpuops("launch")
    assert result.code == 8, result
    assert time.monotonic() - started >= 3
    assert re.search(r"STALL: no log output for [0-9.]+s \(stall_timeout 3", result.err), result
    steps = [line for line in result.text.splitlines() if line.startswith("step ")]
    assert steps[-1].startswith("step 4/"), result  # the last lines the run printed (then its Ctrl-C traceback)
    assert "GPUs 5: 0 MiB, 6: 0 MiB" in result.err, result  # the GPU state after the stop
    assert re.search(r"gpuops: STALLED \(exit 8\): run \S+ stalled: no log output.*; last log line: step 4/100 ", result.err), result
    record = ct.abort_record()
    assert record["reason"] == "stall" and record["last_line"].startswith("step 4/100 ")
    ct.assert_run_gone()


def test_stall_in_json_reports_the_gpus(ct: Ct) -> None:
    ct.playbook(trainer("hang", "--steps", "2"), stall=3)
    result = ct.gpuops("launch", "--json")
    assert result.code == 8, result
    events = result.events()
    assert [e["line"] for e in events if e["event"] == "log" and e["line"].startswith("step ")][-1].startswith("step 2/")
    assert any(e["event"] == "stall" and e["stall_timeout"] == 3 for e in events)
    summary = events[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"]) == ("summary", "stalled", 8)
    assert [(g["index"], g["memory_used_mib"]) for g in summary["gpus"]] == [(5, 0), (6, 0)]
    assert summary["last_line"].startswith("step 2/100 ")
    ct.assert_run_gone()


# -- --timeout ----------------------------------------------------------------------------------
def test_launch_timeout_stops_the_run_and_exits_124(ct: Ct) -> None:
    ct.playbook(trainer("steps", "--steps", "100000"))
    result = ct.gpuops("launch", "--timeout", "3")
    assert result.code == 124, result
    assert "--timeout ran out" in result.err
    assert ct.abort_record()["reason"] == "timeout"
    ct.assert_run_gone()


# -- JSON ---------------------------------------------------------------------------------------
def test_json_lines_with_match_events_and_a_summary(ct: Ct) -> None:
    ct.playbook(trainer("fx-interleaved"))
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    events = result.events()
    for e in events:
        assert {"ts", "event", "target"} <= set(e) and e["target"] == "ct200"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", e["ts"])
    run = ct.run_id()
    assert all(e["run"] == run for e in events if e["event"] not in ("preflight_ok", "lock_recovered"))
    matches = [e for e in events if e["event"] == "match"]
    assert matches and matches[0]["rule"] == "fx-tracing-race" and matches[0]["action"] == "abort"
    assert matches[0]["line"].startswith(FX_LINE) and isinstance(matches[0]["line_number"], int)
    summary = events[-1]
    assert summary["event"] == "summary"
    assert (summary["outcome"], summary["exit_code"], summary["rule"]) == ("aborted", 7, "fx-tracing-race")
    assert "Traceback (most recent call last):" in summary["excerpt"] and FX_LINE in summary["excerpt"]
    assert [e["event"] for e in events].count("summary") == 1
    ct.assert_run_gone()


# -- warn rules ---------------------------------------------------------------------------------
def test_warn_rules_report_and_the_run_goes_on(ct: Ct) -> None:
    ct.playbook(
        trainer("sample", "--sample", "recompile_limit", "--then", "exit", "--code", "0"),
        rules=[{"name": "step-two", "pattern": r"^step 2/", "action": "warn"}],
    )
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    events = result.events()
    warned = [(e["rule"], e["action"]) for e in events if e["event"] == "match"]
    assert warned == [("step-two", "warn"), ("recompile-limit", "warn")]
    assert not any(e["event"] in ("abort_start", "aborted") for e in events)
    # The run went on after the warnings: lines after the recompile warning were logged and streamed.
    logged = [e["line"] for e in events if e["event"] == "log"]
    assert any("step 110 loss" in line for line in logged)
    assert (events[-1]["outcome"], events[-1]["exit_code"]) == ("succeeded", 0)
    ct.assert_run_gone()


def test_warn_rules_in_text_output(ct: Ct) -> None:
    ct.playbook(trainer("sample", "--sample", "recompile_limit", "--then", "exit", "--code", "0"))
    result = ct.gpuops("launch")
    assert result.code == 0, result
    assert "WARN: rule 'recompile-limit' matched" in result.err, result
    assert "ABORT" not in result.err


# -- Ctrl-C while launch follows ----------------------------------------------------------------
def test_ctrl_c_while_launch_follows_leaves_the_run_alive(ct: Ct) -> None:
    ct.playbook(trainer("steps", "--steps", "100000"))
    launch = ct.start("launch")
    launch.wait_for(lambda: "step 3/" in launch.out, "the log to stream")
    launch.signal()
    result = launch.finish()
    assert result.code == 130, result
    assert "still alive" in result.err, result
    how = re.search(r"Reattach with: (gpuops logs -f .*)$", result.err, re.M)
    assert how and shlex.split(how.group(1))[1:] == ["logs", "-f", *ct.argv("x")[4:]], result
    assert ct.session_alive()
    assert all(ct.gpu_memory().values())
    stopped = ct.gpuops("stop")
    assert stopped.code == 0, stopped
    ct.assert_run_gone()


def test_ctrl_c_during_the_abort_says_how_to_make_sure_the_run_is_stopped(ct: Ct) -> None:
    ct.playbook(trainer("ignore-int"), grace=6, rules=[{"name": "step-5", "pattern": r"^step 5/"}])
    launch = ct.start("launch")
    launch.wait_for(lambda: "aborting run" in launch.err, "the abort to start")
    launch.signal()  # during the grace: the trainer ignores Ctrl-C
    result = launch.finish()
    assert result.code == 130, result
    assert "still alive" not in result.err, result
    how = re.search(r"interrupted while stopping run \S+; to make sure it is stopped, run: (gpuops stop .*)$", result.err, re.M)
    assert how, result
    stop = subprocess.run([sys.executable, "-m", *shlex.split(how.group(1))], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)  # fmt: skip
    assert stop.returncode == 0, stop.stderr
    ct.assert_run_gone()


def test_a_matchs_line_number_is_the_log_event_it_came_from_also_after_tqdm_bars(ct: Ct) -> None:
    # tqdm ends its bar's lines with \r: the matcher counts each as a line, and so do the log events.
    ct.playbook(trainer("fx-tqdm"))
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    events = result.events()
    logs = [e["line"] for e in events if e["event"] == "log"]
    (match,) = [e for e in events if e["event"] == "match"]
    assert logs[match["line_number"] - 1] == match["line"]
    assert any("it/s" in line for line in logs[: match["line_number"]])  # the bar's updates came as lines
