"""A following client (client/view/viewer.py) beside a watchdog that stops and comes back: each match is shown once."""

from __future__ import annotations

import json
import os
import shlex
import signal
from pathlib import Path

import pytest
from bench import FakeProxmox, SshServer, wait_until
from bench.watchdog import events, pids, wait_watching
from test_watch import Ct, make_ct


@pytest.fixture
def ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Ct:
    return make_ct(sshd, fake_proxmox, tmp_path)


def test_a_resumed_watchdog_does_not_make_the_client_show_its_abort_twice(ct: Ct) -> None:
    # issue 19.12: the watchdog froze, `logs -f` took over and aborted on the match; the watchdog came
    # back, found the same line and reported it: the client printed `ABORT:` for it a second time
    go = ct.tmp / "go"
    job = ("trap '' INT; while [ ! -e %s ]; do echo step; sleep 0.2; done; echo BOOM here; "
           "while true; do echo step; sleep 0.2; done" % shlex.quote(str(go)))
    ct.launch_detached(job, rules=[{"name": "boom", "pattern": "BOOM", "action": "abort"}], builtin=False, grace=6)
    frozen = pids(ct.run_id(), "supervise") + [wait_watching(ct.run_dir())]  # its supervisor too: none restarts it
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        follow = ct.start("logs", "-f", "--json")
        follow.wait_for(lambda: '"event": "watchdog_stale"' in follow.out, "the client to take over", timeout=60)
        go.touch()
        follow.wait_for(lambda: (ct.run_dir() / "abort.json").exists(), "the client's claim of the abort")
    finally:
        for pid in reversed(frozen):
            os.kill(pid, signal.SIGCONT)
    wait_until(lambda: any(e.get("event") == "match" for e in events(ct.run_dir())), timeout=30,
               message="the resumed watchdog to find the line")
    result = follow.finish()
    assert result.code == 7, result
    matches = [e for e in map(json.loads, result.out.splitlines()) if e["event"] == "match"]
    assert [(m["rule"], m["action"]) for m in matches] == [("boom", "abort")], matches
    assert ct.abort_record()["by"] == "client"
