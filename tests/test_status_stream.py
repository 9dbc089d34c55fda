"""`gpuops status` over several targets shows each as soon as it is read (cli/status_cmd.py)."""

from __future__ import annotations

from pathlib import Path

from bench import FakeProxmox, SshServer, write_inventory
from bench.cli import Running
from bench.inventory import host_entry


def test_a_host_that_never_answers_holds_up_only_its_own_status(tmp_path: Path, sshd: SshServer,
                                                                 fake_proxmox: FakeProxmox) -> None:
    # issue 19.12: the reachable target's lines waited behind a black-hole host's connect timeout
    hole = SshServer()
    hole.start()
    try:
        inv = write_inventory(tmp_path / "inv.yaml", sshd, extra_hosts={"pve2": host_entry(hole, connect_timeout=8)},
                              extra_targets={"ct300": {"host": "pve2", "ctid": 300}})
        hole.freeze()  # the kernel accepts the connection, sshd never says a word
        status = Running("status", "-i", str(inv), "-t", "ct300", "-t", "ct200", env={"GPUOPS_CONNECT_RETRY_TIME": "1"})
        status.wait_for(lambda: "ct200: no gpuops runs" in status.out, "the reachable target's status", timeout=90)
        assert status.proc.poll() is None and "ct300:" not in status.out  # shown while the other is still tried
        result = status.finish(timeout=120)
    finally:
        hole.stop()
    assert result.code == 3, result
    assert "ct300: unreachable: pve2: cannot connect" in result.text and "ct200: reachable via pve1" in result.text


def test_ctrl_c_behind_a_host_that_never_answers_ends_status_at_once(tmp_path: Path, sshd: SshServer,
                                                                      fake_proxmox: FakeProxmox) -> None:
    # The silent host's probe waits out a 120 s handshake timeout; a thread pool's worker would be waited
    # for at exit, so Ctrl-C took that long. The probes run in daemon threads: Ctrl-C is an exit now.
    import signal

    hole = SshServer()
    hole.start()
    try:
        inv = write_inventory(tmp_path / "inv.yaml", sshd, extra_hosts={"pve2": host_entry(hole, connect_timeout=120)},
                              extra_targets={"ct300": {"host": "pve2", "ctid": 300}})
        hole.freeze()
        status = Running("status", "-i", str(inv), "-t", "ct300", "-t", "ct200")
        status.wait_for(lambda: "ct200: no gpuops runs" in status.out, "the reachable target's status", timeout=90)
        status.signal(signal.SIGINT)
        result = status.finish(timeout=60)  # well inside the silent host's 120 s
    finally:
        hole.stop()
    assert result.code == 130, result
    assert "ct200: reachable via pve1" in result.text and "interrupted" in result.err and "Traceback" not in result.err
