"""The byte-offset follower against a real file through the real target follower (gpuops/agent/watch/follow.py,
shipped to the target's ~/.gpuops/lib as a launch ships it; local transport)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from gpuops.agent.wire.frames import FrameReader
from gpuops.client.door import Door
from gpuops.client.view.follower import Data, Ended, Heartbeat, LogFollower, Reset, WatchdogEvent
from gpuops.transport.local import LocalTransport

RUN = "20261129-000000-abcdef"


@pytest.fixture()
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))
    monkeypatch.delenv("TMUX", raising=False)
    d = tmp_path / ".gpuops" / "runs" / RUN
    d.mkdir(parents=True)
    Door(LocalTransport(), label="local").install()
    return d


def _collect(follower: LogFollower, until: float = 20.0) -> tuple[bytes, list]:
    out = bytearray()
    events = []
    deadline = time.monotonic() + until
    for ev in follower:
        events.append(ev)
        if isinstance(ev, Data):
            out += ev.data
        if isinstance(ev, Ended) or time.monotonic() > deadline:
            break
    follower.close()
    return bytes(out), events


def test_frames_parse_across_any_split() -> None:
    events = b'{"event":"match","rule":"fx-tracing-race","offset":7}\n{"event":"done"}\n'
    payload = (b"D 7 0 5\nhello" + b"H 1.0 5 0.5 0.8 5 watching\n" + b"W 0 %d\n" % len(events) + events
               + b"D 7 5 3\n\n\r\n" + b"E exit 0\n")
    for size in range(1, len(payload) + 1):
        frames = FrameReader()
        got = []
        for i in range(0, len(payload), size):
            got += list(frames.feed(payload[i : i + size]))
        assert [type(e).__name__ for e in got] == ["Data", "Heartbeat", "WatchdogEvent", "WatchdogEvent", "Data", "Ended"]
        assert got[0].data == b"hello" and got[4].data == b"\n\r\n" and got[5].code == 0
        assert (got[1].watchdog_age, got[1].watchdog_offset, got[1].watchdog_state) == (0.8, 5, "watching")
        assert got[2].record["rule"] == "fx-tracing-race" and got[3].offset == got[2].end


def test_once_prints_the_log_as_it_is(run_dir: Path) -> None:
    raw = b"step 1\r\x1b[31mred\x1b[0m\n\xff\xfe invalid utf-8\nno newline at end"
    (run_dir / "log").write_bytes(raw)
    out, events = _collect(LogFollower(Door(LocalTransport()), RUN, "", once=True))
    assert out == raw
    assert isinstance(events[-1], Ended) and events[-1].how == "once"


def test_tail_starts_at_the_last_n_lines(run_dir: Path) -> None:
    (run_dir / "log").write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    out, _ = _collect(LogFollower(Door(LocalTransport()), RUN, "", once=True, tail=3))
    assert out == b"line 97\nline 98\nline 99\n"


def test_waits_for_the_log_then_streams_until_the_exit_code(run_dir: Path) -> None:
    def writer() -> None:
        time.sleep(0.3)
        with open(run_dir / "log", "ab") as fh:
            for i in range(50):
                fh.write(b"step %d\n" % i)
                fh.flush()
        (run_dir / "exit_code").write_text("3\n")

    threading.Thread(target=writer, daemon=True).start()
    out, events = _collect(LogFollower(Door(LocalTransport()), RUN, ""))
    assert out == b"".join(b"step %d\n" % i for i in range(50))
    assert events[-1] == Ended("exit", 3)


def test_truncation_restarts_from_zero(run_dir: Path) -> None:
    log = run_dir / "log"
    log.write_bytes(b"old content that is long\n")
    follower = LogFollower(Door(LocalTransport()), RUN, "")
    seen = bytearray()
    resets = []
    for ev in follower:
        if isinstance(ev, Data):
            seen += ev.data
            if bytes(seen) == b"old content that is long\n":
                log.write_bytes(b"new\n")  # truncate and write less
            if seen.endswith(b"new\n"):
                (run_dir / "exit_code").write_text("0")
        elif isinstance(ev, Reset):
            resets.append(ev.why)
        elif isinstance(ev, Ended):
            break
    follower.close()
    assert resets == ["truncated"]
    assert bytes(seen) == b"old content that is long\nnew\n"


def test_rotation_follows_the_new_file(run_dir: Path) -> None:
    log = run_dir / "log"
    log.write_bytes(b"first file\n")
    follower = LogFollower(Door(LocalTransport()), RUN, "")
    seen = bytearray()
    for ev in follower:
        if isinstance(ev, Data):
            seen += ev.data
            if bytes(seen) == b"first file\n":
                os.rename(log, run_dir / "log.1")
                log.write_bytes(b"second file\n")
            if seen.endswith(b"second file\n"):
                (run_dir / "exit_code").write_text("0")
        elif isinstance(ev, Ended):
            break
    follower.close()
    assert bytes(seen) == b"first file\nsecond file\n"


def test_heartbeats_report_size_and_mtime_for_stall_detection(run_dir: Path) -> None:
    (run_dir / "log").write_bytes(b"x\n")
    old = time.time() - 500
    os.utime(run_dir / "log", (old, old))
    follower = LogFollower(Door(LocalTransport()), RUN, "")
    for ev in follower:
        if isinstance(ev, Heartbeat) and ev.size >= 0:
            assert ev.size == 2
            assert ev.now - ev.mtime >= 499
            break
    follower.close()


def test_a_10mb_line_streams_through(run_dir: Path) -> None:
    big = b"x" * (10 * 1024 * 1024)
    (run_dir / "log").write_bytes(big + b"\nend\n")
    out, _ = _collect(LogFollower(Door(LocalTransport()), RUN, "", once=True))
    assert len(out) == len(big) + 5 and out.endswith(b"\nend\n")


def test_the_watchdogs_events_stream_beside_the_log_and_resume_by_offset(run_dir: Path) -> None:
    import subprocess

    from gpuops.client.view.follower import Reconnecting

    (run_dir / "log").write_bytes(b"step 1\n")
    lines = [b'{"event":"match","rule":"loss-nan","offset":0}\n', b'{"event":"stall","seconds":9}\n']
    (run_dir / "events.jsonl").write_bytes(lines[0])
    follower = LogFollower(Door(LocalTransport()), RUN, "", dead_after=2.0)
    seen, reconnects = [], 0
    for ev in follower:
        if isinstance(ev, WatchdogEvent):
            seen.append(ev.record["event"])
            if len(seen) == 1:
                # The follower on the target dies (a dropped link): the next one resumes at the offsets.
                subprocess.run(["pkill", "-KILL", "-f", f"gpuops_agent follow {RUN}"], check=True)
                with open(run_dir / "events.jsonl", "ab") as fh:
                    fh.write(lines[1])
                (run_dir / "exit_code").write_text("0\n")
        elif isinstance(ev, Reconnecting):
            reconnects += 1
        elif isinstance(ev, Ended):
            break
    follower.close()
    assert seen == ["match", "stall"] and reconnects >= 1
    assert follower.events_offset == len(lines[0]) + len(lines[1])


def test_a_live_watchdog_is_waited_for_before_the_end_is_said(run_dir: Path) -> None:
    import json

    (run_dir / "log").write_bytes(b"done\n")
    (run_dir / "exit_code").write_text("0\n")
    beat = {"ts": time.time(), "state": "watching", "offset": 5, "pid": os.getpid()}  # a live process
    (run_dir / "watchdog.json").write_text(json.dumps(beat))

    def watchdog_finishes() -> None:
        time.sleep(1.5)
        with open(run_dir / "events.jsonl", "ab") as fh:
            fh.write(b'{"event":"done"}\n')
        (run_dir / "watchdog.json").write_text(json.dumps({**beat, "ts": time.time(), "state": "done"}))

    threading.Thread(target=watchdog_finishes, daemon=True).start()
    _, events = _collect(LogFollower(Door(LocalTransport()), RUN, ""))
    kinds = [type(e).__name__ for e in events]
    assert kinds[-2:] == ["WatchdogEvent", "Ended"] and events[-2].record["event"] == "done"


def test_a_follower_that_dies_at_once_is_an_error_not_a_reconnect_loop(run_dir: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuops.errors import RemoteError

    bindir = tmp_path / "bin-without-python"
    bindir.mkdir()
    for tool in ("bash",):
        os.symlink(shutil.which(tool), bindir / tool)
    monkeypatch.setenv("PATH", str(bindir))  # the target's bash finds no python3
    started = time.monotonic()
    with pytest.raises(RemoteError, match="exited with code 127.*python3"):
        _collect(LogFollower(Door(LocalTransport()), RUN, ""))
    assert time.monotonic() - started < 60  # three quick tries, not the 900 s reconnect budget


def test_an_exit_code_file_created_but_not_yet_written_is_no_end(tmp_path: Path) -> None:
    """inotify wakes the follower between the file's creation and its write: that empty file must not
    end the follow with a garbled code (-1); a written one ends it with its code, a garbled one with -1."""
    from gpuops.agent.watch.follow import Follower

    (tmp_path / "log").write_bytes(b"")
    follower = Follower(str(tmp_path), "s", 0, 0, 0, True)
    exit_file = tmp_path / "exit_code"
    assert follower.exit_code() is None
    exit_file.write_bytes(b"")
    assert follower.exit_code() is None
    exit_file.write_bytes(b"0\n")
    assert follower.exit_code() == 0
    exit_file.write_bytes(b"garbled\n")
    assert follower.exit_code() == -1
