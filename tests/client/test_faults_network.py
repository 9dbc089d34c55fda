"""Network faults while gpuops follows a run: dropped connections, an sshd restart, a 20 s outage,
a silent dead peer, and a host that is down (or never answers) when gpuops starts.

Real sshd, real tmux, `pct exec` into CT 200 (stand-in), `fake-train --mode numbered` writing
`line 000001 ...` lines. The guarantee checked every time: every numbered line arrives exactly
once and in order, and following resumes by itself. Outages use a network namespace of the
test's own (bench.netns): sshd listens on its side of a veth pair, and the link is taken down or
firewalled there; nothing but 127.0.0.1 and that namespace is ever contacted. Where namespaces
are not permitted (or GPUOPS_BENCH_NO_NETNS=1), the 20 s outage freezes sshd on 127.0.0.1
instead (SIGSTOP: TCP stays up, no SSH byte comes back), and the namespace variants skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml
from bench import FakeProxmox, SshServer, jsoncheck, procs, wait_until, write_inventory
from bench.netns import NetNs, NetnsUnavailable

GPUS = (5, 6)
SESSION = "train"
FX_LINE = "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function"
CLI_TIMEOUT = 150.0  # one gpuops command on a loaded 2-core machine
OUTAGE = 20.0  # the "host unreachable for 20 s"
DEAD_PEER_BOUND = 15.0  # the bound for noticing a silent peer
CONNECT_TIMEOUT = 3  # inventory connect_timeout: a silent host costs 3 s per connect attempt, not 10
NUMBERED = re.compile(rb"^line (\d{6}) ", re.M)


# -- running gpuops -----------------------------------------------------------------------------
class Running:
    """A gpuops command in the background; stdout/stderr collected as they come, with arrival times."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._out = bytearray()
        self._err = bytearray()
        self.lines: list[tuple[float, bytes]] = []  # stdout lines and when they arrived
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._out, True), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._err, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any, buf: bytearray, timed: bool) -> None:
        partial = b""
        for chunk in iter(lambda: stream.read1(65536), b""):
            buf += chunk
            if timed:
                now = time.monotonic()
                *whole, partial = (partial + chunk).split(b"\n")
                self.lines += [(now, line) for line in whole]

    @property
    def out(self) -> bytes:
        return bytes(self._out)

    @property
    def err(self) -> str:
        return bytes(self._err).decode("utf-8", "replace")

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for _, line in list(self.lines)]

    def first_event_time(self, kind: str, after: float = 0.0) -> float | None:
        """When (monotonic, as seen here) the first `kind` JSON event arrived at or after `after`."""
        needle = f'"event": "{kind}"'.encode()
        return next((t for t, line in list(self.lines) if t >= after and needle in line), None)

    def numbered_seen(self) -> int:
        """The highest numbered line in the output so far (text or JSON)."""
        found = NUMBERED.findall(self.out.replace(b'"line": "', b"\n"))
        return int(found[-1]) if found else 0

    def wait_for(self, predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        def check() -> Any:
            value = predicate()
            if not value and self.proc.poll() is not None:
                raise AssertionError(f"gpuops exited {self.proc.returncode} before {what}:\n{self}")
            return value

        return wait_until(check, timeout=timeout, message=lambda: f"{what}:\n{self}")

    def finish(self, timeout: float = CLI_TIMEOUT) -> "Running":
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        jsoncheck.check(self.proc.args, self.out, complete_only=True)  # every --json line valid against `gpuops schema`
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        for t in self._threads:
            t.join(timeout=10)

    @property
    def code(self) -> int | None:
        return self.proc.returncode

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        text = self.out.decode("utf-8", "replace")
        return f"exit {self.proc.returncode}\n--- stdout (end)\n{text[-3000:]}\n--- stderr\n{self.err[-4000:]}"


@dataclass
class Ct:
    """CT 200 behind the bench's sshd, the gpuops files for it, and the gpuops commands started."""

    sshd: SshServer
    fake: FakeProxmox
    tmp: Path
    env: dict[str, str]
    running: list[Running] = field(default_factory=list)

    @property
    def inventory(self) -> Path:
        return self.tmp / "inventory.yaml"

    def set_host(self, **keys: Any) -> None:
        """Change keys of the inventory's host entry (pve1)."""
        data = yaml.safe_load(self.inventory.read_text())
        data["hosts"]["pve1"].update(keys)
        self.inventory.write_text(yaml.safe_dump(data, sort_keys=False))

    def playbook(self, command: str) -> Path:
        data = {
            "name": "faults",
            "preflight": {"gpus": list(GPUS)},
            "launch": {"session": SESSION, "command": command},
            "watch": {"builtin": True, "stall_timeout": 0},
            "abort": {"signal": "INT", "grace": 5},
        }
        path = self.tmp / "playbook.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def argv(self, command: str, *args: str) -> list[str]:
        extra = ["--yes"] if command == "launch" else []
        return [sys.executable, "-m", "gpuops", command, "-i", str(self.inventory), "-p", str(self.tmp / "playbook.yaml"),
                "-t", "ct200", *extra, *args]  # fmt: skip

    def start(self, command: str, *args: str, env: dict[str, str] | None = None) -> Running:
        run = Running(self.argv(command, *args), {**self.env, **(env or {})})
        self.running.append(run)
        return run

    def gpuops(self, command: str, *args: str, env: dict[str, str] | None = None) -> Running:
        return self.start(command, *args, env=env).finish()

    def launch_detached(self, command: str) -> str:
        self.playbook(command)
        result = self.gpuops("launch", "--detach")
        assert result.code == 0, result
        return self.run_id()

    # -- what is on the target -------------------------------------------------------------------
    def run_id(self) -> str:
        return (self.fake.home(200) / ".gpuops" / "sessions" / SESSION).read_text().strip()

    def log(self) -> bytes:
        path = self.fake.home(200) / ".gpuops" / "runs" / self.run_id() / "log"
        return path.read_bytes() if path.exists() else b""

    def abort_record(self) -> dict[str, Any]:
        return json.loads((self.fake.home(200) / ".gpuops" / "runs" / self.run_id() / "abort.json").read_text())

    def session_alive(self) -> bool:
        return self.fake.tmux(200, "has-session", "-t", f"={SESSION}").returncode == 0

    def assert_run_gone(self) -> None:
        assert not self.session_alive(), "the tmux session is still alive"
        marker = self.run_id().encode()
        assert procs.find(lambda env: env.get(b"GPUOPS_RUN_ID") == marker) == [], "processes of the run are left"
        gpus = self.fake.gpus(200)
        assert {g: gpus.memory_used(g) for g in GPUS} == dict.fromkeys(GPUS, 0)

    def close(self) -> None:
        """Stop every gpuops command still running: before the namespace goes, nothing may still dial it."""
        for run in self.running:
            run.kill()


def numbered(count: int, rate: float, *then: str) -> str:
    """fake-train writing `line 000001 ...` .. `line <count>` at `rate` lines/s on the run's GPUs."""
    gpus = ",".join(map(str, GPUS))
    return " ".join(["fake-train", "--mode", "numbered", "--gpus", gpus, "--count", str(count), "--rate", str(rate), "--width", "24", *then])


def eager_fallback() -> str:
    """What a trainer does after a drafter thread died of the FX race: slow steps, forever."""
    return f"fake-train --mode steps --gpus {','.join(map(str, GPUS))} --steps 1000000 --interval 0.5"


def numbers(data: bytes) -> list[int]:
    return [int(n) for n in NUMBERED.findall(data)]


def json_log(events: list[dict[str, Any]]) -> bytes:
    return "".join(e["line"] + "\n" for e in events if e["event"] == "log").encode()


def assert_every_line_once(got: list[int], count: int) -> None:
    """1..count, each exactly once, in order: report the first gap or repeat, not a 1000-item diff."""
    for i, n in enumerate(got):
        assert n == i + 1, f"numbered line #{i + 1} is {n} (previous {got[i - 1] if i else None}): a gap or a repeat"
    assert len(got) == count, f"only {len(got)} of {count} numbered lines arrived"


# -- fixtures -----------------------------------------------------------------------------------
def _gpuops_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_") and k not in ("TMUX", "TMUX_PANE")}
    env["HOME"] = str(tmp / "home")  # no ~/.ssh/config of the developer's
    (tmp / "home").mkdir(exist_ok=True)
    return env


def _ct(server: SshServer, tmp: Path) -> Iterator[Ct]:
    fake = FakeProxmox(server.fake_root)
    fake.add_container(200)
    write_inventory(tmp / "inventory.yaml", server)
    ct = Ct(server, fake, tmp, _gpuops_env(tmp))
    ct.set_host(connect_timeout=CONNECT_TIMEOUT)
    try:
        yield ct
    finally:
        ct.close()  # before sshd and the namespace go: no gpuops process may still dial them


def make_ct(sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Iterator[Ct]:
    """CT 200 on the bench sshd at 127.0.0.1 (how tests/conftest.py's `ct` fixture builds this module's Ct)."""
    yield from _ct(sshd, tmp_path)


@lru_cache(maxsize=1)
def netns_unavailable() -> str | None:
    """Why this machine cannot give the tests a network namespace, or None when it can."""
    if os.environ.get("GPUOPS_BENCH_NO_NETNS") == "1":
        return "GPUOPS_BENCH_NO_NETNS=1"
    try:
        NetNs().create().destroy()
    except NetnsUnavailable as exc:
        return str(exc)
    return None


@pytest.fixture
def netns() -> Iterator[NetNs]:
    """A network namespace of this test's own, linked by a veth pair; removed even when the test fails."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(f"needs a network namespace: {reason}")
    with NetNs() as ns:
        yield ns


@pytest.fixture
def far_ct(netns: NetNs, tmp_path: Path) -> Iterator[Ct]:
    """CT 200 on a host the test can cut off: sshd inside `netns`, reached over the veth pair."""
    server = SshServer(host=netns.addr, launcher=netns.exec_argv())
    try:
        server.start()
        yield from _ct(server, tmp_path)
    finally:
        server.stop()
        FakeProxmox(server.fake_root).cleanup()
        if os.environ.get("GPUOPS_BENCH_KEEP") != "1":
            shutil.rmtree(server.fake_root, ignore_errors=True)


def blackhole(request: pytest.FixtureRequest) -> tuple[Ct, NetNs]:
    """The far host and its namespace, for tests that firewall its port (skips without iptables)."""
    ns = request.getfixturevalue("netns")
    ct = request.getfixturevalue("far_ct")
    try:
        ns.block(ct.sshd.port)
        ns.unblock()
    except (NetnsUnavailable, RuntimeError) as exc:
        pytest.skip(f"a blackhole needs a working iptables in the namespace: {exc}")
    return ct, ns


# -- 1. dropped connections ---------------------------------------------------------------------
def test_follow_survives_connections_killed_three_times(ct: Ct) -> None:
    count = 300
    ct.launch_detached(numbered(count, 40))
    before = ct.sshd.connection_count()
    follow = ct.start("logs", "--follow")
    for at in (40, 140, 240):  # early, in the middle, near the end of the run
        follow.wait_for(lambda at=at: follow.numbered_seen() >= at, f"line {at} to stream", timeout=60)
        assert ct.sshd.kill_connections() >= 1
    result = follow.finish()
    assert result.code == 0, result
    assert_every_line_once(numbers(result.out), count)
    assert result.out == ct.log(), "the output differs from the log's bytes"
    assert result.err.count("reconnected; resuming at byte") >= 3, result
    assert ct.sshd.connection_count() - before >= 3  # one per drop (the follow starts on launch's ControlMaster)
    ct.assert_run_gone()


# -- 2. sshd restarted -------------------------------------------------------------------------
def test_follow_survives_an_sshd_restart(ct: Ct) -> None:
    count = 300
    ct.playbook(numbered(count, 40))
    launch = ct.start("launch")
    launch.wait_for(lambda: launch.numbered_seen() >= 100, "line 100 to stream", timeout=90)
    ct.sshd.stop()
    launch.wait_for(lambda: "reconnecting" in launch.err, "gpuops to notice the dropped connection", timeout=30)
    # Down for a while: the run goes on writing (80 lines at 40/s) while gpuops' connects are refused,
    # and gpuops keeps retrying them instead of giving up (exit 3).
    written = max(numbers(ct.log()), default=0)
    wait_until(lambda: max(numbers(ct.log()), default=0) >= written + 80, timeout=60,
               message="the run to write on while sshd is down")
    assert launch.proc.poll() is None, launch
    assert launch.numbered_seen() < written + 80, "lines arrived while sshd was down"
    ct.sshd.start()
    result = launch.finish()
    assert result.code == 0, result
    assert_every_line_once(numbers(result.out), count)
    assert result.out == ct.log()
    assert "reconnected; resuming at byte" in result.err, result
    assert "finished with exit code 0" in result.err, result
    ct.assert_run_gone()


# -- 3. a 20 s outage with a fatal signature written during it ----------------------------------
def test_twenty_second_outage_resumes_and_aborts_on_what_was_written_meanwhile(request: pytest.FixtureRequest) -> None:
    if netns_unavailable():
        ct: Ct = request.getfixturevalue("ct")
        cut, restore = ct.sshd.freeze, ct.sshd.thaw  # the whole host stops answering
    else:
        ct, ns = request.getfixturevalue("far_ct"), request.getfixturevalue("netns")
        cut, restore = ns.link_down, ns.link_up
    count = 300
    ct.playbook(f"{numbered(count, 50, '--then-sample', 'fx_race_thread', '--code', '0')} && {eager_fallback()}")
    launch = ct.start("launch", "--json")
    launch.wait_for(lambda: launch.numbered_seen() >= 40, "line 40 to stream", timeout=90)
    cut()
    cut_at = time.monotonic()
    try:
        # While the host is unreachable the trainer finishes its lines and hits the FX race.
        wait_until(lambda: FX_LINE.encode() in ct.log(), timeout=OUTAGE - 2, message="the FX race in the log")
        assert launch.code is None, launch
        assert launch.numbered_seen() < count, "lines arrived from a host that was cut off"
        time.sleep(max(0.0, cut_at + OUTAGE - time.monotonic()))
    finally:
        restore()
    back = time.monotonic()
    result = launch.finish()
    assert result.code == 7, result
    events = result.events()
    kinds = [e["event"] for e in events]
    assert "reconnecting" in kinds and "reconnected" in kinds, result
    assert (result.first_event_time("reconnected") or 0) >= back  # resumed once the host came back
    assert_every_line_once(numbers(json_log(events)), count)
    summary = events[-1]
    assert (summary["event"], summary["exit_code"], summary["rule"]) == ("summary", 7, "fx-tracing-race"), result
    assert FX_LINE in summary["excerpt"]
    assert ct.abort_record()["rule"] == "fx-tracing-race"
    ct.assert_run_gone()


# -- 4. a silent dead peer ---------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["blackhole", "silent-sshd"])
def test_a_dead_peer_is_noticed_within_15_seconds(request: pytest.FixtureRequest, fault: str) -> None:
    if fault == "blackhole":  # every packet of the connection vanishes
        ct, ns = blackhole(request)
        cut, restore = (lambda: ns.block(ct.sshd.port)), ns.unblock
    else:  # TCP stays up, the connection's sshd answers nothing (paramiko's keepalive never notices)
        ct = request.getfixturevalue("ct")
        cut, restore = (lambda: ct.sshd.freeze(connections_only=True)), ct.sshd.thaw
    count = 320  # 8 s of lines: the run is still writing when the loss is noticed
    ct.launch_detached(numbered(count, 40))
    follow = ct.start("logs", "--follow", "--json")
    follow.wait_for(lambda: follow.numbered_seen() >= 40, "line 40 to stream", timeout=60)
    cut()
    cut_at = time.monotonic()
    try:
        noticed = follow.wait_for(lambda: follow.first_event_time("reconnecting", after=cut_at), "a reconnecting event",
                                  timeout=DEAD_PEER_BOUND + 30)  # fmt: skip
    finally:
        restore()
    assert noticed - cut_at < DEAD_PEER_BOUND, f"the dead peer was noticed after {noticed - cut_at:.1f}s"
    result = follow.finish()
    assert result.code == 0, result
    assert_every_line_once(numbers(json_log(result.events())), count)
    ct.assert_run_gone()


# -- 5. connect time: down at start, or never answering ----------------------------------------
@pytest.mark.parametrize("fault", ["link-down", "sshd-stopped"])
def test_a_host_down_at_start_is_reached_when_it_comes_back(request: pytest.FixtureRequest, fault: str) -> None:
    if fault == "link-down":  # no route to the host: each attempt fails after ARP gives up
        ct, ns = request.getfixturevalue("far_ct"), request.getfixturevalue("netns")
        cut, restore = ns.link_down, ns.link_up
    else:  # connection refused
        ct = request.getfixturevalue("ct")
        cut, restore = ct.sshd.stop, ct.sshd.start
    count = 160
    ct.launch_detached(numbered(count, 20))
    cut()
    try:
        follow = ct.start("logs", "--follow", env={"GPUOPS_CONNECT_RETRY_TIME": "30"})
        # Retried attempts are said on stderr (after the first second); wait for three, then bring the host back.
        follow.wait_for(lambda: max(map(int, re.findall(r"\((\d+) attempts so far\)", follow.err)), default=0) >= 3,
                        "three connect attempts retried", timeout=60)
        assert follow.code is None, follow
        assert follow.out == b""
        assert "cannot connect yet" in follow.err
    finally:
        restore()
    result = follow.finish()
    assert result.code == 0, result
    assert_every_line_once(numbers(result.out), count)
    ct.assert_run_gone()


@pytest.mark.parametrize("fault", ["blackhole", "link-down", "no-banner"])
def test_a_host_that_never_answers_fails_with_exit_3_in_bounded_time(request: pytest.FixtureRequest, fault: str) -> None:
    if fault == "blackhole":  # SYNs vanish: the TCP connect times out
        ct, ns = blackhole(request)
        cut, restore, why = (lambda: ns.block(ct.sshd.port)), ns.unblock, "timed out"
    elif fault == "link-down":  # the host is gone from its network: no route to it (ARP gives up in ~3 s)
        ct, ns = request.getfixturevalue("far_ct"), request.getfixturevalue("netns")
        cut, restore, why = ns.link_down, ns.link_up, "no route to host"
        ct.set_host(connect_timeout=6)  # so that ARP, not the connect timeout, ends each attempt
    else:  # the port accepts (the kernel does) but sshd never says a word
        ct = request.getfixturevalue("ct")
        cut, restore, why = ct.sshd.freeze, ct.sshd.thaw, "no SSH (handshake|banner)"
    ct.playbook(numbered(10, 10))  # never launched: `logs -f` fails on its first connection
    retry = 4.0
    cut()
    try:
        started = time.monotonic()
        result = ct.gpuops("logs", "--follow", env={"GPUOPS_CONNECT_RETRY_TIME": str(retry)})
        took = time.monotonic() - started
    finally:
        restore()
    assert result.code == 3, result
    where = f"{ct.sshd.host}:{ct.sshd.port}"
    assert re.search(rf"cannot connect to {re.escape(where)}: {why}.* \(gave up after {retry:g}s of retries\)", result.err), result
    assert "Traceback" not in result.err
    # The retry budget, then at most one backoff wait (4 s) and one attempt (connect_timeout),
    # plus the CLI's own start-up on a loaded machine.
    attempt = yaml.safe_load(ct.inventory.read_text())["hosts"]["pve1"]["connect_timeout"]
    assert retry <= took < retry + 4 + attempt + 12, f"gave up after {took:.1f}s"
