"""`gpuops status` over several targets shows each as soon as it is read (cli/commands/status_cmd.py)."""

from __future__ import annotations

from pathlib import Path

from bench import FakeProxmox, SshServer
from bench.cli import Running
from bench.inventory import silent_host


def test_a_host_that_never_answers_holds_up_only_its_own_status(tmp_path: Path, sshd: SshServer,
                                                                 fake_proxmox: FakeProxmox) -> None:
    # issue 19.12: the reachable target's lines waited behind a black-hole host's connect timeout
    with silent_host(tmp_path / "inv.yaml", sshd, connect_timeout=8) as (inv, _):
        status = Running("status", "-i", str(inv), "-t", "ct300", "-t", "ct200", env={"GPUOPS_CONNECT_RETRY_TIME": "1"})
        status.wait_for(lambda: "ct200: no gpuops runs" in status.out, "the reachable target's status", timeout=90)
        assert status.proc.poll() is None and "ct300:" not in status.out  # shown while the other is still tried
        result = status.finish(timeout=120)
    assert result.code == 3, result
    assert "ct300: unreachable: pve2: cannot connect" in result.text and "ct200: reachable via pve1" in result.text


def test_ctrl_c_behind_a_host_that_never_answers_ends_status_at_once(tmp_path: Path, sshd: SshServer,
                                                                      fake_proxmox: FakeProxmox) -> None:
    # The silent host's probe waits out a 120 s handshake timeout; a thread pool's worker would be waited
    # for at exit, so Ctrl-C took that long. The probes run in daemon threads: Ctrl-C is an exit now.
    import signal

    with silent_host(tmp_path / "inv.yaml", sshd, connect_timeout=120) as (inv, _):
        status = Running("status", "-i", str(inv), "-t", "ct300", "-t", "ct200")
        status.wait_for(lambda: "ct200: no gpuops runs" in status.out, "the reachable target's status", timeout=90)
        status.signal(signal.SIGINT)
        result = status.finish(timeout=60)  # well inside the silent host's 120 s
    assert result.code == 130, result
    assert "ct200: reachable via pve1" in result.text and "interrupted" in result.err and "Traceback" not in result.err
