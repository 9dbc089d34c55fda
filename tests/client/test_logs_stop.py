"""`gpuops logs` and `gpuops stop` on a run started elsewhere (`launch --detach`), and the log follower
over real sshd when the connection drops: CT 200 behind real OpenSSH + pct, real tmux, fake trainers."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import yaml
from bench import BIN_DIR, procs, wait_until
from bench.watchdog import remove_watchdog
from test_watch import FX_LINE, GPUS, Ct, excerpt_lines, trainer

from gpuops.client.door import Door
from gpuops.client.view.follower import Data, Ended, LogFollower
from gpuops.config import load_inventory
from gpuops.transport import Pool


def numbers(lines: list[str]) -> list[int]:
    """The numbers of fake-train's `line 000123 ...` lines, in the order seen."""
    return [int(m.group(1)) for line in lines if (m := re.match(r"line (\d{6}) ", line))]


# -- logs --follow from another process ----------------------------------------------------------
def test_detached_run_is_aborted_by_logs_follow_from_another_process(ct: Ct) -> None:
    ct.launch_detached(trainer("fx-thread"))
    assert ct.session_alive()
    result = ct.gpuops("logs", "--follow")
    assert result.code == 7, result
    assert "ABORT: rule 'fx-tracing-race' matched" in result.err, result
    assert FX_LINE in excerpt_lines(result.err)[-1]
    assert result.out.startswith(b"step 1/100 ")  # from the start of the log
    assert ct.abort_record()["rule"] == "fx-tracing-race"
    ct.assert_run_gone()


def test_logs_follow_json_gives_match_events_and_a_summary(ct: Ct) -> None:
    ct.launch_detached(trainer("fx-caught"))
    result = ct.gpuops("logs", "--follow", "--json")
    assert result.code == 7, result
    events = result.events()
    assert all({"ts", "event", "target", "run"} <= set(e) for e in events)
    (match,) = [e for e in events if e["event"] == "match"]
    assert (match["rule"], match["action"]) == ("fx-tracing-race", "abort")
    summary = events[-1]
    assert (summary["event"], summary["outcome"], summary["exit_code"], summary["rule"]) == ("summary", "aborted", 7, "fx-tracing-race")
    # The excerpt starts at the logging call that printed the caught traceback.
    assert summary["excerpt"].splitlines()[:2] == [
        "2026-11-29 10:00:01,234 ERROR [drafter-2] compile failed, falling back to eager",
        "Traceback (most recent call last):",
    ]
    assert FX_LINE in summary["excerpt"].splitlines()[-1]
    ct.assert_run_gone()


def test_logs_follow_no_abort_reports_the_match_and_leaves_the_run_alive(ct: Ct) -> None:
    # --no-abort is about this client: with the run's watchdog gone, it reports and never stops the run.
    go = ct.tmp / "go"
    ct.launch_detached(trainer("fx-caught", "--slow-interval", "0.2", "--go", shlex.quote(str(go))))
    remove_watchdog(ct.run_dir())
    follow = ct.start("logs", "--follow", "--no-abort", "--json")
    follow.wait_for(lambda: '"event": "watchdog_stale"' in follow.out, "the client to watch the run itself")
    go.touch()
    follow.wait_for(lambda: '"event": "match"' in follow.out, "the match to be reported")
    seen = follow.out.count('"event": "log"')
    follow.wait_for(lambda: follow.out.count('"event": "log"') >= seen + 3, "log lines after the match")
    assert ct.session_alive() and all(ct.gpu_memory().values())
    assert not (ct.run_dir() / "abort.json").exists()
    follow.signal()
    result = follow.finish()
    assert result.code == 130, result
    events = result.events()
    assert [e["rule"] for e in events if e["event"] == "match"] == ["fx-tracing-race"]
    assert not any(e["event"] in ("abort_start", "aborted") for e in events)
    assert (events[-1]["outcome"], events[-1]["exit_code"], events[-1]["run_alive"]) == ("interrupted", 130, True)
    assert ct.session_alive()
    assert ct.gpuops("stop").code == 0
    ct.assert_run_gone()


def test_logs_follow_no_abort_reports_a_stall_and_leaves_the_run_alive(ct: Ct) -> None:
    go = ct.tmp / "go"
    ct.launch_detached(trainer("hang", "--steps", "2", "--go", shlex.quote(str(go))), stall=2)
    remove_watchdog(ct.run_dir())
    follow = ct.start("logs", "--follow", "--no-abort", "--json")
    follow.wait_for(lambda: '"event": "watchdog_stale"' in follow.out, "the client to watch the run itself")
    go.touch()
    follow.wait_for(lambda: '"event": "stall"' in follow.out, "the stall to be reported")
    assert follow.proc.poll() is None  # still following
    assert ct.session_alive() and all(ct.gpu_memory().values())
    follow.signal()
    result = follow.finish()
    assert result.code == 130, result
    events = result.events()
    assert not any(e["event"] in ("abort_start", "aborted") for e in events)
    assert [e["event"] for e in events].count("stall") == 1  # said once, not every heartbeat
    assert ct.session_alive() and not (ct.run_dir() / "abort.json").exists()
    assert ct.gpuops("stop").code == 0
    ct.assert_run_gone()


def test_logs_follow_timeout_stops_the_run_and_exits_124(ct: Ct) -> None:
    ct.launch_detached(trainer("steps", "--steps", "100000"))
    result = ct.gpuops("logs", "--follow", "--timeout", "3")
    assert result.code == 124, result
    assert "--timeout ran out" in result.err
    assert ct.abort_record()["reason"] == "timeout"
    ct.assert_run_gone()


def test_ctrl_c_while_following_exits_130_and_says_how_to_reattach(ct: Ct) -> None:
    ct.launch_detached(trainer("steps", "--steps", "100000"))
    follow = ct.start("logs", "--follow")
    follow.wait_for(lambda: "step 3/" in follow.out, "the log to stream")
    follow.signal()
    result = follow.finish()
    assert result.code == 130, result
    assert "still alive" in result.err, result
    how = re.search(r"Reattach with: (gpuops logs -f .*)$", result.err, re.M)
    assert how, result
    assert ct.session_alive() and all(ct.gpu_memory().values())
    # The printed command works: it follows the same run (here with a --timeout, which stops it).
    argv = shlex.split(how.group(1))
    again = subprocess.run([sys.executable, "-m", *argv, "--timeout", "2"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=120)  # fmt: skip
    assert again.returncode == 124, again.stderr.decode()
    ct.assert_run_gone()


# -- logs --follow on a run that already ended ----------------------------------------------------
def test_logs_follow_on_an_ended_run_prints_the_rest_and_exits_with_its_code(ct: Ct) -> None:
    ct.launch_detached(trainer("exit", "--steps", "3", "--code", "3"))
    wait_until(lambda: (ct.run_dir() / "exit_code").exists(), timeout=60, message="the run to end")
    result = ct.gpuops("logs", "--follow")
    assert result.code == 6, result
    assert result.out == ct.log() and result.out.count(b"\n") == 3
    assert "training exited with code 3" in result.err

    ct.launch_detached(trainer("steps", "--steps", "2"))
    wait_until(lambda: (ct.run_dir() / "exit_code").exists(), timeout=60, message="the second run to end")
    result = ct.gpuops("logs", "--follow", "--tail", "1")
    assert (result.code, result.out) == (0, b"step 2/2 loss 2.9842 lr 3e-4\n"), result


def test_logs_follow_on_an_aborted_run_exits_7(ct: Ct) -> None:
    ct.playbook(trainer("fx-thread"))
    assert ct.gpuops("launch").code == 7
    result = ct.gpuops("logs", "--follow")
    assert result.code == 7, result
    assert result.out == ct.log()
    assert "fx-tracing-race" in result.err, result


# -- logs without --follow ------------------------------------------------------------------------
RAW = b"step 1\rstep 2\r\x1b[31mred\x1b[0m\n\xff\xfe not utf-8\n\ttab\nno newline at the end"


def test_logs_prints_the_log_bytes_exactly(ct: Ct) -> None:
    printf = "".join(chr(b) if 0x20 <= b < 0x7F and b not in b"\\%'" else f"\\{b:03o}" for b in RAW)
    ct.launch_detached(f"printf '{printf}'; sleep 600")
    wait_until(lambda: ct.log() == RAW, timeout=60, message="the bytes in the log")
    result = ct.gpuops("logs")
    assert (result.code, result.out) == (0, RAW), result
    assert ct.session_alive()  # printing the log does not touch the run
    assert ct.gpuops("stop").code == 0


def test_logs_tail_prints_the_last_lines(ct: Ct) -> None:
    ct.launch_detached("fake-train --mode numbered --count 50 --width 8; sleep 600")
    wait_until(lambda: ct.log().count(b"\n") == 50, timeout=60, message="50 lines in the log")
    result = ct.gpuops("logs", "--tail", "3")
    assert result.code == 0, result
    assert numbers(result.text.splitlines()) == [48, 49, 50]
    assert result.out == b"".join(ct.log().splitlines(keepends=True)[-3:])
    assert ct.gpuops("stop").code == 0


def test_logs_without_any_run_says_so(ct: Ct) -> None:
    ct.playbook(trainer("steps"))
    result = ct.gpuops("logs")
    assert result.code == 2, result
    assert "no run of 'train' found" in result.err, result


# -- stop ----------------------------------------------------------------------------------------
def test_stop_ends_the_run_and_a_second_stop_finds_none(ct: Ct) -> None:
    run_id = ct.launch_detached(trainer("steps", "--steps", "100000"))
    ct.wait_training()
    result = ct.gpuops("stop")
    assert result.code == 0, result
    assert f"run {run_id} stopped" in result.err, result
    assert ct.abort_record()["reason"] == "stop"
    ct.assert_run_gone()
    again = ct.gpuops("stop")
    assert again.code == 0, again
    assert "no run of 'train' is alive" in again.err, again


def test_stop_with_no_run_ever_started_exits_0(ct: Ct) -> None:
    ct.playbook(trainer("steps"))
    result = ct.gpuops("stop", "--json")
    assert result.code == 0, result
    assert (result.events()[-1]["outcome"], result.events()[-1]["exit_code"]) == ("not-running", 0)


def test_stop_kills_workers_that_left_the_session(ct: Ct) -> None:
    ct.launch_detached(trainer("spawn-orphan", "--steps", "100000"))
    orphans = wait_until(lambda: [p for p in ct.run_processes() if _sid(p) == p], timeout=60, message="the orphan worker")
    ct.wait_training()
    result = ct.gpuops("stop", "--json")
    assert result.code == 0, result
    assert (result.events()[-1]["outcome"], result.events()[-1]["exit_code"]) == ("stopped", 0)
    assert not any(procs.is_alive(p) for p in orphans)
    ct.assert_run_gone()


def _sid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


# -- the follower when the connection drops --------------------------------------------------------
def test_follower_resumes_after_dropped_connections_without_loss_or_repeats(ct: Ct) -> None:
    run_id = "20261129-120000-0f0110"
    run_dir = ct.run_dir(run_id)
    run_dir.mkdir(parents=True)
    count = 3000
    with open(run_dir / "log", "wb") as log:
        writer = subprocess.Popen([str(BIN_DIR / "fake-train"), "--mode", "numbered", "--count", str(count), "--rate", "1000"],
                                  env=ct.fake.env(200), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.DEVNULL)  # fmt: skip
    inventory = load_inventory(str(ct.inventory))
    pool = Pool(inventory)
    transport = pool.target(inventory.targets["ct200"])
    door = Door(transport, label="ct200")
    door.install()  # gpuops' target files, as a launch leaves them
    follower = LogFollower(door, run_id, "")
    got = bytearray()
    drops = [500, 1500]  # drop every connection when this many lines have arrived
    exit_file = run_dir / "exit_code"
    deadline = time.monotonic() + 120
    try:
        for ev in follower:
            if isinstance(ev, Data):
                got += ev.data
                if drops and got.count(b"\n") >= drops[0]:
                    drops.pop(0)
                    # Under load the follower may be between connections at this moment (its last one
                    # closing, the next not yet accepted): drop the next one that exists.
                    wait_until(lambda: ct.sshd.kill_connections() >= 1, timeout=30,
                               message="a connection of the follower to drop")
            elif isinstance(ev, Ended):
                assert (ev.how, ev.code) == ("exit", 0)
                break
            if writer.poll() is not None and not exit_file.exists():
                exit_file.write_text(f"{writer.returncode}\n")  # as run.sh records it
            assert time.monotonic() < deadline, "the follower did not reach the end in time"
    finally:
        follower.close()
        pool.close()
        if writer.poll() is None:
            writer.kill()
        writer.wait()
    assert follower.reconnects >= 2
    assert numbers(got.decode().splitlines()) == list(range(1, count + 1))
    assert bytes(got) == (run_dir / "log").read_bytes()


def test_logs_follow_survives_dropped_connections_and_still_aborts(ct: Ct) -> None:
    count = 4000
    # The FX traceback comes once the test has seen the reconnect (the `go` file): no race with the drop.
    gate = 'until [ -e "$GPUOPS_RUN_DIR/go" ]; do sleep 0.1; done'
    ct.launch_detached(f"fake-train --mode numbered --count {count} --rate 400 --width 16 && {gate} && {trainer('fx-caught', '--steps', '1')}")
    follow = ct.start("logs", "--follow", "--json")
    follow.wait_for(lambda: '"line": "line 000300 ' in follow.out, "300 lines to stream", timeout=90)
    assert ct.sshd.kill_connections() >= 1
    follow.wait_for(lambda: '"event": "reconnected"' in follow.out, "the follower to reconnect", timeout=90)
    (ct.run_dir() / "go").touch()
    result = follow.finish()
    assert result.code == 7, result
    events = result.events()
    assert numbers([e["line"] for e in events if e["event"] == "log"]) == list(range(1, count + 1))
    assert events[-1]["rule"] == "fx-tracing-race"
    ct.assert_run_gone()


# -- logs --follow while the launch is still warming up ------------------------------------------------
def with_warmup(ct: Ct, mode: str) -> None:
    """Add a warmup on GPU 5 that waits for the test's `go` file, so `logs -f` attaches during it."""
    playbook = ct.tmp / "playbook.yaml"
    data = yaml.safe_load(playbook.read_text())
    gate = 'until [ -e "$HOME/.gpuops/runs/$GPUOPS_RUN_ID/go" ]; do sleep 0.1; done'
    data["warmup"] = {"gpus": [5], "command": f"{gate}; fake-warmup --gpu {{gpu}} --duration 0.2 --mode {mode}"}
    playbook.write_text(yaml.safe_dump(data, sort_keys=False))


def test_logs_follow_during_warmup_waits_for_training_then_aborts(ct: Ct) -> None:
    ct.playbook(trainer("fx-thread"))
    with_warmup(ct, "ok")
    launch = ct.start("launch")
    launch.wait_for(lambda: "warmup on GPU 5" in launch.err, "the warmup to start")
    follow = ct.start("logs", "--follow")
    follow.wait_for(lambda: "is being launched (warmup)" in follow.err, "logs -f to wait for the launch")
    assert launch.proc.poll() is None  # attaching did not disturb the launch
    (ct.run_dir() / "go").touch()
    attached, launched = follow.finish(), launch.finish()
    assert attached.code == 7, attached
    assert "rule 'fx-tracing-race' matched" in attached.err, attached
    assert "warmup on GPU 5 done" in launched.err, launched  # the warmup ran to its end
    assert launched.code == 7, launched
    ct.assert_run_gone()


def test_logs_follow_on_a_launch_whose_warmup_fails_exits_5(ct: Ct) -> None:
    ct.playbook(trainer("fx-thread"))
    with_warmup(ct, "fail")
    launch = ct.start("launch")
    launch.wait_for(lambda: "warmup on GPU 5" in launch.err, "the warmup to start")
    follow = ct.start("logs", "--follow")
    follow.wait_for(lambda: "is being launched (warmup)" in follow.err, "logs -f to wait for the launch")
    (ct.run_dir() / "go").touch()
    attached, launched = follow.finish(), launch.finish()
    assert launched.code == 5, launched
    assert attached.code == 5, attached
    assert "never started" in attached.err, attached
    assert not ct.session_alive() and ct.gpu_memory() == dict.fromkeys(GPUS, 0)


WARMUPS_THAT_LOOK_STOPPED = {"echo compiling; exit 86": (86, "compiling"),
                             "echo '@@gpuops stopped'; exit 3": (3, "@@gpuops stopped")}


def test_a_warmup_that_exits_86_or_prints_the_stop_line_is_a_failed_warmup_not_a_stop(ct: Ct) -> None:
    """`stopped` is what `gpuops stop` recorded (abort.json), never the warmup's own exit status or output."""
    playbook = ct.playbook(trainer("steps"))
    for command, (code, line) in WARMUPS_THAT_LOOK_STOPPED.items():
        data = yaml.safe_load(playbook.read_text())
        data["warmup"] = {"gpus": [5], "command": command}
        playbook.write_text(yaml.safe_dump(data, sort_keys=False))
        result = ct.gpuops("launch", "--json")
        assert result.code == 5, (command, result)
        summary = result.events()[-1]
        assert f"warmup on GPU 5 exited with code {code}" in summary["message"], (command, summary["message"])
        assert summary["output_tail"] == [line], (command, summary)
        assert not (ct.run_dir() / "abort.json").exists() and not ct.session_alive(), command
        (row, *_) = ct.gpuops("runs", "--json").events()
        assert (row["outcome"], row["exit_code"]) == ("not-started", 5), (command, row)


def test_a_host_key_unknown_after_a_reconnect_fails_at_once_with_3(ct: Ct) -> None:
    # The follower reconnects after a drop; a host key it does not know then is no transient error
    # to retry for 900 s (it was told apart by the substring "HOST KEY"), but exit 3 at once.
    ct.launch_detached(trainer("steps", "--steps", "100000"))
    follow = ct.start("logs", "--follow")
    follow.wait_for(lambda: "step 3/" in follow.out, "the log to stream")
    Path(ct.sshd.known_hosts).write_text("")  # the key is forgotten (strict policy: unknown keys are refused)
    assert ct.sshd.kill_connections() >= 1
    started = time.monotonic()
    result = follow.finish(timeout=120)
    assert result.code == 3, result
    assert "unknown host key" in result.err, result
    assert time.monotonic() - started < 60
    assert ct.session_alive()  # the run is its watchdog's to guard: a client's lost link stops nothing
