"""What the text renderer (cli/renderers/render.py) puts on a terminal: gpuops' own words never carry the log's control bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench import FakeProxmox, SshServer
from test_watch import Ct, make_ct


@pytest.fixture
def ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Ct:
    return make_ct(sshd, fake_proxmox, tmp_path)


def test_control_bytes_of_a_matched_line_are_shown_escaped_and_the_log_stays_as_it_is(ct: Ct) -> None:
    # issue 19.12: a NUL, a clear-screen escape and a bell in the matched line reached the terminal raw
    ct.playbook(r"printf 'BOOM \000 cut \033[2J clear \a bell\n'; sleep 30",
                rules=[{"name": "boom", "pattern": "BOOM", "action": "abort"}], builtin=False, grace=2)
    result = ct.gpuops("launch")
    assert result.code == 7, result
    said = [line for line in result.err.splitlines() if "BOOM" in line]
    assert said and any("ABORT" in line for line in said), result.err
    for line in said:  # (the matcher drops the terminal escape sequence itself from the line it reports)
        assert "BOOM \\x00 cut  clear \\x07 bell" in line, line
    assert not any(c in result.err for c in "\x00\x1b\x07"), repr(result.err)
    assert b"BOOM \x00 cut \x1b[2J clear \x07 bell\n" in result.out  # the log's bytes, as they are
