"""How the agent knows a run's training lives (issue 21), against a real tmux: from the pane's pidfd and
its terminal, spawning no tmux while the pane lives.

What a user notices: a session killed by hand while the training ignores SIGHUP (it lives on) ends
the run at once, not at the next tmux check; input typed into the pane wakes no watchdog; a pane
process that exits ends the wait by its pidfd, and the terminal is let go with it (tmux versions
that wait for every holder of a pane's terminal before they end the pane are not kept waiting).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from bench import wait_until

RUN = "20261202-000000-live01"
SESSION = "lv"
# The pane process survives SIGHUP (as run.sh does); the run id is one of its arguments (as run.sh's).
PANE = "trap true HUP; while :; do sleep 0.2; done"


@pytest.fixture
def pane(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, int]]:
    """A run directory whose training has started, and the pid of its pane in a tmux of its own."""
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))
    monkeypatch.delenv("TMUX", raising=False)
    d = tmp_path / RUN
    d.mkdir()
    subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "bash", "-c", PANE, RUN], check=True)
    out = subprocess.run(["tmux", "display-message", "-p", "-t", f"={SESSION}:", "#{pane_pid}"],
                         capture_output=True, text=True, check=True).stdout
    (d / "started").write_text("")
    pid = int(out)
    yield d, pid
    subprocess.run(["tmux", "kill-server"], capture_output=True)
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def session_exists() -> bool:
    return subprocess.run(["tmux", "has-session", "-t", f"={SESSION}"], capture_output=True).returncode == 0


def watching(d: Path):  # noqa: ANN201 - (Liveness, Waker)
    from gpuops.agent.run.liveness import Liveness
    from gpuops.agent.system.wake import Waker

    live = Liveness(str(d), SESSION, RUN)
    assert not live.gone(0.0)  # learns the pane: one tmux call
    assert live.pidfd is not None and live.hangups(), "no pidfd or terminal held for a live pane"
    return live, Waker(str(d), ["log"])


def test_a_killed_session_ends_the_wait_though_its_pane_process_lives_and_typed_input_does_not(pane) -> None:
    d, pid = pane
    live, waker = watching(d)
    calls = live.tmux_calls
    subprocess.run(["tmux", "send-keys", "-t", f"={SESSION}:", "hello", "Enter"], check=True)
    assert waker.wait(0.3, live.fds(), live.hangups()) == [] and waker.timed_out  # input wakes nothing
    assert not live.gone(1e9) and live.tmux_calls == calls  # alive, and tmux was not asked (no backstop)
    subprocess.run(["tmux", "kill-session", "-t", f"={SESSION}"], check=True)
    ready = waker.wait(60, live.fds(), live.hangups())
    assert ready == live.hangups() and not waker.timed_out  # the hangup ended the wait
    live.saw(ready)
    assert os.path.exists(f"/proc/{pid}")  # the pane process ignored SIGHUP and lives on
    assert live.gone(1e9)  # tmux confirms: the session is gone
    live.close()
    waker.close()


def test_a_pane_process_that_exits_ends_the_wait_and_lets_go_of_its_terminal(pane) -> None:
    d, pid = pane
    live, waker = watching(d)
    os.kill(pid, 9)
    ready = waker.wait(60, live.fds(), live.hangups())
    assert ready and live.pidfd in ready  # the pidfd said it ended
    live.saw(ready)
    assert live.hangups() == [] and live.fds() == []
    wait_until(lambda: not session_exists(), timeout=30, message="tmux to end the session")
    assert live.gone(1e9)
    waker.close()
