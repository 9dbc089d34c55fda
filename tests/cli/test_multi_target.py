"""Several targets in one command: `launch`, `logs -f` and `stop` over CT 200 and CT 201 behind the real
sshd, and CT 300 on a second host whose sshd is down (its port closed), with real tmux and the stand-ins.

What a user notices is asserted: each target's result (its run's end, or its error), log lines tagged
with their target, the exit code the worst of theirs, one JSON summary per target last, and on the
target: runs started, stopped or still alive as the command says.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from bench import FakeProxmox, SshServer, write_inventory
from bench.cli import Cli, Running, gpuops
from bench.inventory import host_entry

SESSION = "multi"
GPUS = (5, 6)
FAST_FAIL = {"GPUOPS_CONNECT_RETRY_TIME": "1"}  # the dead host is given up on within seconds


@dataclass
class Fleet:
    """CT 200 and CT 201 on a live host, CT 300 on a host that is down; one playbook for them all."""

    fake: FakeProxmox
    inventory: Path
    playbook: Path
    dir: Path

    def args(self, command: str, *targets: str, extra: tuple[str, ...] = ()) -> list[str]:
        flags = [f for t in targets for f in ("-t", t)]
        return [command, "-i", str(self.inventory), "-p", str(self.playbook), *flags, *extra] + (
            ["--yes"] if command == "launch" else [])

    def run(self, command: str, *targets: str, extra: tuple[str, ...] = (), timeout: float = 180) -> Cli:
        return gpuops(*self.args(command, *targets, extra=extra), env=FAST_FAIL, timeout=timeout)

    def start(self, command: str, *targets: str, extra: tuple[str, ...] = ()) -> Running:
        return Running(*self.args(command, *targets, extra=extra), env=FAST_FAIL)

    def write(self, command: str, **watch: Any) -> None:
        """The playbook: `command` in session `multi` on GPUs 5 and 6 (MODE comes from each container)."""
        data = {"name": "multi-test", "preflight": {"gpus": list(GPUS)},
                "launch": {"session": SESSION, "command": command},
                "watch": {"stall_timeout": 0, **watch}, "abort": {"grace": 3}}
        self.playbook.write_text(yaml.safe_dump(data, sort_keys=False))

    # -- what is on a target ------------------------------------------------------------------------
    def run_id(self, vmid: int) -> str:
        return (self.fake.home(vmid) / ".gpuops" / "sessions" / SESSION).read_text().strip()

    def run_dir(self, vmid: int) -> Path:
        return self.fake.home(vmid) / ".gpuops" / "runs" / self.run_id(vmid)

    def alive(self, vmid: int) -> bool:
        return self.fake.tmux(vmid, "has-session", "-t", f"={SESSION}").returncode == 0

    def memory(self, vmid: int) -> list[int]:
        gpus = self.fake.gpus(vmid)
        return [gpus.memory_used(g) for g in GPUS]


TRAIN = "fake-train --mode \"$MODE\" --gpus 5,6 --interval 0.05 --steps 20 --slow-interval 0.2"


@pytest.fixture
def fleet(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Iterator[Fleet]:
    fake_proxmox.set_env(200, MODE="fx-thread")  # CT 200's run hits the FX race
    fake_proxmox.add_container(201, env={"MODE": "steps"})  # CT 201's finishes well
    down = SshServer()
    down.start()
    down.stop()  # its port is closed: connections are refused
    extra_hosts = {"pve2": host_entry(down)}
    extra_targets = {"ct201": {"host": "pve1", "ctid": 201, "gpus": list(range(8))},
                     "ct300": {"host": "pve2", "ctid": 300, "gpus": list(range(8))}}
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd, extra_hosts=extra_hosts, extra_targets=extra_targets)
    fleet = Fleet(fake_proxmox, inventory, tmp_path / "playbook.yaml", tmp_path)
    fleet.write(TRAIN)
    try:
        yield fleet
    finally:
        shutil.rmtree(down.fake_root, ignore_errors=True)


def summaries(result: Cli) -> list[dict[str, Any]]:
    return [e for e in result.events() if e["event"] == "summary"]


# -- launch ---------------------------------------------------------------------------------------
def test_launch_on_three_targets_runs_the_live_ones_and_reports_the_dead_host(fleet: Fleet) -> None:
    result = fleet.run("launch", "ct200", "ct201", "ct300")
    assert result.code == 7, result  # the worst: CT 200's abort outranks CT 300's connect error (3)
    out = result.text.splitlines()
    assert out and all(line.startswith(("ct200: ", "ct201: ")) for line in out), out[:5]
    assert "ct201: step 20/20 " in result.text and "ct200: step 1/" in result.text
    assert "[ct200] ABORTED (exit 7): " in result.err and "fx-tracing-race" in result.err
    assert "[ct201] succeeded (exit 0): " in result.err
    assert "[ct300] ERROR (exit 3): pve2: cannot connect" in result.err
    assert "gpuops: 3 targets: ct200 aborted (exit 7), ct201 succeeded (exit 0), ct300 error (exit 3); exit 7" in result.err
    assert not [line for line in result.err.splitlines() if "Traceback" in line and "|" not in line]  # but the excerpt
    # On the targets: CT 200's run was stopped by the rule, CT 201's finished, both drained.
    assert json.loads((fleet.run_dir(200) / "abort.json").read_text())["rule"] == "fx-tracing-race"
    assert (fleet.run_dir(201) / "exit_code").read_text().strip() == "0"
    assert not fleet.alive(200) and not fleet.alive(201)
    assert fleet.memory(200) == [0, 0] and fleet.memory(201) == [0, 0]


def test_launch_json_tags_every_event_and_ends_with_one_summary_per_target_the_worst_last(fleet: Fleet) -> None:
    result = fleet.run("launch", "ct200", "ct201", "ct300", extra=("--json",))
    assert result.code == 7, result
    events = result.events()
    assert all(e["target"] in ("ct200", "ct201", "ct300") for e in events)
    last = events[-3:]
    assert [e["event"] for e in last] == ["summary"] * 3 and summaries(result) == last
    assert [(e["target"], e["exit_code"]) for e in last] == [("ct201", 0), ("ct300", 3), ("ct200", 7)]
    assert last[-1]["rule"] == "fx-tracing-race" and last[-1]["run"] == fleet.run_id(200)
    assert last[0]["run"] == fleet.run_id(201) and "run" not in last[1]  # CT 300 never got a run
    assert "cannot connect" in last[1]["error"] and last[1]["hint"]
    logs = {e["target"] for e in events if e["event"] == "log"}
    assert logs == {"ct200", "ct201"}


def test_one_target_keeps_its_log_byte_for_byte(fleet: Fleet) -> None:
    fleet.write("printf 'a\\r\\nb\\rc\\n\\033[1mbold\\033[0m no newline'")
    result = fleet.run("launch", "ct201")
    assert result.code == 0, result
    assert result.out == b"a\r\nb\rc\n\x1b[1mbold\x1b[0m no newline"  # no prefix, nothing changed


def test_several_targets_prefix_every_line_whatever_ends_it(fleet: Fleet) -> None:
    fleet.write("printf 'a\\r\\nb\\rc\\nlast'")
    result = fleet.run("launch", "ct200", "ct201")
    assert result.code == 0, result
    pieces = re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)", result.out)
    assert b"".join(pieces) == result.out  # every line ends, the last one too
    for t in (b"ct200", b"ct201"):
        mine = b"".join(p for p in pieces if p.startswith(t + b": "))
        assert mine == t + b": a\r\n" + t + b": b\r" + t + b": c\n" + t + b": last\n"
    assert len(pieces) == 8  # nothing but those lines
    # `logs` (not following) prints one target's log after the other's, in the order asked for.
    printed = fleet.run("logs", "ct201", "ct200")
    assert printed.code == 0, printed
    assert printed.out == b"".join(t + b": a\r\n" + t + b": b\r" + t + b": c\n" + t + b": last\n" for t in (b"ct201", b"ct200"))


# -- logs -f, stop, Ctrl-C ------------------------------------------------------------------------
GO_TRAIN = "fake-train --mode \"$MODE\" --gpus 5,6 --interval 0.1 --go \"$GO\""


def detach_both(fleet: Fleet, modes: dict[int, str]) -> dict[int, Path]:
    """`launch --detach` on CT 200 and CT 201, each in its MODE, failing once its GO file exists."""
    go = {vmid: fleet.dir / f"go-{vmid}" for vmid in modes}
    for vmid, mode in modes.items():
        fleet.fake.set_env(vmid, MODE=mode, GO=str(go[vmid]))
    fleet.write(GO_TRAIN)
    result = fleet.run("launch", "ct200", "ct201", extra=("--detach",))
    assert result.code == 0, result
    assert "gpuops: 2 targets: ct200 started (exit 0), ct201 started (exit 0); exit 0" in result.err, result
    assert fleet.alive(200) and fleet.alive(201)
    return go


def test_logs_follow_follows_every_target_at_once_and_the_timeout_applies_to_all(fleet: Fleet) -> None:
    go = detach_both(fleet, {200: "fx-thread", 201: "hang"})
    follow = fleet.start("logs", "ct200", "ct201", "ct300", extra=("--follow", "--timeout", "12"))
    follow.wait_for(lambda: "\nct200: step " in follow.out and "\nct201: step " in follow.out, "both logs, tagged")
    follow.wait_for(lambda: "[ct300] ERROR (exit 3)" in follow.err, "the dead host's error, while the others go on")
    go[200].touch()  # CT 200 hits the FX race now; CT 201 goes on until --timeout
    follow.wait_for(lambda: "[ct200] ABORTED (exit 7)" in follow.err, "CT 200's abort")
    assert fleet.alive(201)
    result = follow.finish()
    assert result.code == 7, result
    assert "[ct201] TIMEOUT (exit 124)" in result.err
    assert "ct200 aborted (exit 7), ct201 timeout (exit 124), ct300 error (exit 3); exit 7, the worst" in result.err
    assert all(line.startswith(("ct200: ", "ct201: ")) for line in result.text.splitlines())
    assert json.loads((fleet.run_dir(201) / "abort.json").read_text())["by"] == "timeout"
    assert not fleet.alive(200) and not fleet.alive(201)


def test_stop_all_stops_each_live_run_and_names_the_unreachable_target(fleet: Fleet) -> None:
    detach_both(fleet, {200: "hang", 201: "hang"})
    result = fleet.run("stop", extra=("--all", "--json"))
    assert result.code == 3, result  # both runs stopped; CT 300 could not be reached
    last = summaries(result)
    assert [(e["target"], e["outcome"], e["exit_code"]) for e in last] == [
        ("ct200", "stopped", 0), ("ct201", "stopped", 0), ("ct300", "error", 3)]
    assert result.events()[-3:] == last
    for vmid in (200, 201):
        assert json.loads((fleet.run_dir(vmid) / "abort.json").read_text())["by"] == "stop"
        assert not fleet.alive(vmid) and fleet.memory(vmid) == [0, 0]


def test_ctrl_c_stops_following_every_target_and_leaves_each_run_alive(fleet: Fleet) -> None:
    fleet.fake.set_env(200, MODE="hang", GO=str(fleet.dir / "never"))
    fleet.fake.set_env(201, MODE="hang", GO=str(fleet.dir / "never"))
    fleet.write(GO_TRAIN)
    launch = fleet.start("launch", "ct200", "ct201")
    launch.wait_for(lambda: "\nct200: step " in launch.out and "\nct201: step " in launch.out, "both runs training")
    launch.signal(signal.SIGINT)
    result = launch.finish()
    assert result.code == 130, result
    for t in ("ct200", "ct201"):
        hint = f"Reattach with: gpuops logs -f -i {shlex.quote(str(fleet.inventory))} -p {shlex.quote(str(fleet.playbook))} -t {t}"
        assert f"[{t}] INTERRUPTED (exit 130): interrupted: stopped following; run " in result.err and hint in result.err
    assert fleet.alive(200) and fleet.alive(201)  # the runs go on, guarded by their watchdogs
    assert fleet.run("stop", "ct200", "ct201").code == 0
    assert not fleet.alive(200) and not fleet.alive(201)
