"""The byte-offset follower against a real file through the real remote follower program (local transport)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpuops.follow import Data, Ended, Heartbeat, LogFollower, Reset, _Frames
from gpuops.transport.local import LocalTransport

RUN = "20261129-000000-abcdef"


@pytest.fixture()
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))
    monkeypatch.delenv("TMUX", raising=False)
    d = tmp_path / ".gpuops" / "runs" / RUN
    d.mkdir(parents=True)
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
    payload = b"D 7 0 5\nhello" + b"H 1.0 5 0.5\n" + b"D 7 5 3\n\n\r\n" + b"E exit 0\n"
    for size in range(1, len(payload) + 1):
        frames = _Frames()
        got = []
        for i in range(0, len(payload), size):
            got += list(frames.feed(payload[i : i + size]))
        assert [type(e).__name__ for e in got] == ["Data", "Heartbeat", "Data", "Ended"]
        assert got[0].data == b"hello" and got[2].data == b"\n\r\n" and got[3].code == 0


def test_once_prints_the_log_as_it_is(run_dir: Path) -> None:
    raw = b"step 1\r\x1b[31mred\x1b[0m\n\xff\xfe invalid utf-8\nno newline at end"
    (run_dir / "log").write_bytes(raw)
    out, events = _collect(LogFollower(LocalTransport(), RUN, "", once=True))
    assert out == raw
    assert isinstance(events[-1], Ended) and events[-1].how == "once"


def test_tail_starts_at_the_last_n_lines(run_dir: Path) -> None:
    (run_dir / "log").write_bytes(b"".join(b"line %d\n" % i for i in range(100)))
    out, _ = _collect(LogFollower(LocalTransport(), RUN, "", once=True, tail=3))
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
    out, events = _collect(LogFollower(LocalTransport(), RUN, ""))
    assert out == b"".join(b"step %d\n" % i for i in range(50))
    assert events[-1] == Ended("exit", 3)


def test_truncation_restarts_from_zero(run_dir: Path) -> None:
    log = run_dir / "log"
    log.write_bytes(b"old content that is long\n")
    follower = LogFollower(LocalTransport(), RUN, "")
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
    follower = LogFollower(LocalTransport(), RUN, "")
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
    follower = LogFollower(LocalTransport(), RUN, "")
    for ev in follower:
        if isinstance(ev, Heartbeat) and ev.size >= 0:
            assert ev.size == 2
            assert ev.now - ev.mtime >= 499
            break
    follower.close()


def test_a_10mb_line_streams_through(run_dir: Path) -> None:
    big = b"x" * (10 * 1024 * 1024)
    (run_dir / "log").write_bytes(big + b"\nend\n")
    out, _ = _collect(LogFollower(LocalTransport(), RUN, "", once=True))
    assert len(out) == len(big) + 5 and out.endswith(b"\nend\n")
