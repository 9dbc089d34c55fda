"""`gpuops status` on the real-sshd bench: text, JSON, GPUs, containers, runs, dead hosts, --watch.

Run as a user runs it (`python -m gpuops status`, piped, so the output is the plain
target-prefixed text); the terminal (rich) view is exercised through a pty by --watch.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench import SYSTEM_PATH, FakeProxmox, LocalEnv, SshServer, jsoncheck, wait_until, write_inventory

REPO = Path(__file__).resolve().parents[2]
GPUOPS_VARS = ("GPUOPS_INVENTORY", "GPUOPS_PLAYBOOK", "GPUOPS_TARGET", "GPUOPS_CONNECT_RETRY_TIME")
TOTAL = 143771  # an H200's memory.total in MiB, as the nvidia-smi stand-in reports it
STATUS_KEYS = {"schema_version", "ts", "event", "target", "host", "ctid", "reachable", "error", "hint", "container",
               "nvidia_smi", "nvidia_smi_error", "gpus", "sessions"}  # fmt: skip
GPU_KEYS = {"index", "memory_used_mib", "memory_total_mib", "utilization_pct", "processes"}
RUN_KEYS = {"id", "session", "state", "exit_code", "command_exit_code", "started_at", "playbook", "seconds_since_log",
            "log_bytes", "abort", "last_match", "stopped_by", "watchdog", "telemetry", "attempts", "max_attempts",
            "compile_guard", "hardware", "host_kernel_log"}  # fmt: skip
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def environ(**changes: str | None) -> dict[str, str]:
    """This process's environment without the developer's GPUOPS_* variables; None removes a variable."""
    env = {k: v for k, v in os.environ.items() if k not in GPUOPS_VARS}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def gpuops(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True, text=True, env=env or environ(), cwd=REPO, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    jsoncheck.check(args, result.stdout)
    return result


def start(*args: str, out: Path) -> subprocess.Popen[bytes]:
    """gpuops in the background, its stdout going to a file (not a terminal)."""
    with out.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-m", "gpuops", *args], stdout=sink, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, cwd=REPO, env=environ())  # fmt: skip


def status_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    result = gpuops("status", "--json", *args, env=env)
    assert "Traceback" not in result.stderr
    return result.returncode, [json.loads(line) for line in result.stdout.splitlines()]


def lines_of(stdout: str, target: str) -> list[str]:
    prefix = f"{target}: "
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


def playbook(tmp_path: Path, name: str, command: str, gpus: str = "[1]") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ntarget: ct200\npreflight: {{gpus: {gpus}}}\n"
        f"launch: {{session: {name}-train, command: {command}}}\n"
        "watch: {stall_timeout: 0}\nabort: {grace: 2}\n"
    )
    return path


# -- text and JSON -----------------------------------------------------------------------------


def test_busy_gpu_shows_its_memory_and_process(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.set_gpu(200, 3, memory_used=5000, utilization=55)
    pid = fake_proxmox.occupy_gpu(200, 5, mib=12000)
    used = fake_proxmox.gpus(200).memory_used(5)
    assert used >= 12000
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert all(line.startswith("ct200: ") for line in lines), lines  # piped: every line names its target
    got = lines_of(result.stdout, "ct200")
    assert got[0] == "reachable via pve1, container 200 running"
    assert f"gpu 3 5000/{TOTAL} MiB util 55% procs -" in got
    assert any(re.fullmatch(rf"gpu 5 {used}/{TOTAL} MiB util \d+% procs {pid}:python3:{used}MiB", g) for g in got), got
    assert f"gpu 0 0/{TOTAL} MiB util 0% procs -" in got
    assert got[-1] == "no gpuops runs"
    assert len([g for g in got if g.startswith("gpu ")]) == 8


def test_memory_without_a_listed_process_is_still_shown(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    """Inside LXC, nvidia-smi may list no process although memory is used (REFERENCE.md)."""
    fake_proxmox.occupy_gpu(200, 2, mib=30000)
    fake_proxmox.gpus(200).hide_compute_apps()
    used = fake_proxmox.gpus(200).memory_used(2)
    result = gpuops("status", "-i", str(write_inventory(tmp_path / "inv.yaml", sshd)))
    assert result.returncode == 0
    got = lines_of(result.stdout, "ct200")
    assert any(re.fullmatch(rf"gpu 2 {used}/{TOTAL} MiB util \d+% procs -", g) for g in got), got


def test_json_is_one_status_object_per_target_with_exact_keys(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    pid = fake_proxmox.occupy_gpu(200, 6, mib=4000)
    used = fake_proxmox.gpus(200).memory_used(6)
    fake_proxmox.add_container(201, running=False)
    inv = write_inventory(tmp_path / "inv.yaml", sshd, extra_targets={
        "ct201": {"host": "pve1", "ctid": 201}, "host": {"host": "pve1"},
    })  # fmt: skip
    code, objs = status_json("-i", str(inv))
    assert code == 0
    assert sorted(o["target"] for o in objs) == ["ct200", "ct201", "host"]  # each as soon as it is read
    for obj in objs:
        assert set(obj) == STATUS_KEYS, set(obj) ^ STATUS_KEYS
        assert obj["event"] == "status" and ISO_UTC.fullmatch(obj["ts"])
        assert obj["reachable"] is True and obj["error"] is None and obj["host"] == "pve1"
    ct200, ct201, host = sorted(objs, key=lambda o: o["target"])
    assert (ct200["ctid"], ct200["container"], ct200["nvidia_smi"]) == (200, "running", "ok")
    assert len(ct200["gpus"]) == 8 and all(set(g) == GPU_KEYS for g in ct200["gpus"])
    assert ct200["gpus"][6] == {
        "index": 6, "memory_used_mib": used, "memory_total_mib": TOTAL,
        "utilization_pct": ct200["gpus"][6]["utilization_pct"],
        "processes": [{"pid": pid, "used_mib": used, "name": "python3"}],
    }  # fmt: skip
    assert ct200["sessions"] == []
    assert (ct201["container"], ct201["gpus"], ct201["nvidia_smi"]) == ("stopped", [], None)
    assert (host["ctid"], host["container"]) == (None, None)
    assert host["gpus"][6]["memory_used_mib"] == 0  # the container's job is not on the host's fake GPUs


# -- containers --------------------------------------------------------------------------------


@pytest.mark.parametrize("pve", ["9.0.10", "8.3.2", "7.4.1"])
def test_a_stopped_container_is_reported_not_failed(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, pve: str
) -> None:
    fake_proxmox.set_pve_version(pve)
    fake_proxmox.stop_container(200)
    result = gpuops("status", "-i", str(write_inventory(tmp_path / "inv.yaml", sshd)))
    assert result.returncode == 0, result
    assert result.stdout == "ct200: reachable via pve1, container 200 stopped\n"
    assert result.stderr == ""


def test_a_missing_container_is_reported(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd, ctid=4242, target="gone")
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 0
    assert result.stdout == "gone: reachable via pve1, container 4242 missing\n"
    code, (obj,) = status_json("-i", str(inv))
    assert obj["container"] == "missing" and obj["reachable"] is True


def test_a_driver_failure_is_shown_once_and_the_rest_still_reported(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    fake_proxmox.gpus(200).unload_driver()
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 0
    got = lines_of(result.stdout, "ct200")
    assert got[0] == "reachable via pve1, container 200 running"
    failed = [g for g in got if g.startswith("nvidia-smi failed: ")]
    assert len(failed) == 1 and failed[0].count("couldn't communicate with the NVIDIA driver") == 1, failed
    assert not any(g.startswith("gpu ") for g in got)
    assert got[-1] == "no gpuops runs"
    _, (obj,) = status_json("-i", str(inv))
    assert obj["nvidia_smi"] == "error" and "NVIDIA driver" in obj["nvidia_smi_error"] and obj["gpus"] == []


# -- reachability ------------------------------------------------------------------------------


def test_one_dead_host_does_not_hide_the_live_one_and_exits_3(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    inv = write_inventory(tmp_path / "inv.yaml", sshd, extra_hosts={
        "pve2": {"address": "127.0.0.1", "port": dead, "identity_file": str(sshd.client_key),
                 "known_hosts": str(sshd.known_hosts)},
    }, extra_targets={"ct300": {"host": "pve2", "ctid": 300}})  # fmt: skip
    result = gpuops("status", "-i", str(inv), env=environ(GPUOPS_CONNECT_RETRY_TIME="2"))
    assert result.returncode == 3, result
    live, down = lines_of(result.stdout, "ct200"), lines_of(result.stdout, "ct300")
    assert live[0] == "reachable via pve1, container 200 running" and len(live) == 10
    assert re.fullmatch(rf"unreachable: pve2: cannot connect to 127\.0\.0\.1:{dead}: connection refused .*", down[0])
    assert "Traceback" not in result.stderr
    code, objs = status_json("-i", str(inv), env=environ(GPUOPS_CONNECT_RETRY_TIME="2"))
    assert code == 3
    by_target = {o["target"]: o for o in objs}
    assert by_target["ct200"]["reachable"] is True and len(by_target["ct200"]["gpus"]) == 8
    assert by_target["ct300"]["reachable"] is False and "connection refused" in by_target["ct300"]["error"]


def test_the_local_target_without_nvidia_smi_is_not_a_failure(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi", path=SYSTEM_PATH):
        pytest.skip("this machine has a real nvidia-smi")
    home = tmp_path / "home"
    home.mkdir()
    env = environ(HOME=str(home), PATH=SYSTEM_PATH, TMUX_TMPDIR=str(tmp_path), TMUX=None)
    result = gpuops("status", "-i", str(REPO / "inventories" / "local.yaml"), env=env)
    assert result.returncode == 0, result
    assert result.stdout == (
        "local: reachable via here\n"
        "local: no nvidia-smi on this target (no GPUs to show)\n"
        "local: no gpuops runs\n"
    )
    result = gpuops("status", "--json", "-i", str(REPO / "inventories" / "local.yaml"), env=env)
    obj = json.loads(result.stdout)
    assert (obj["reachable"], obj["nvidia_smi"], obj["gpus"], obj["ctid"]) == (True, "absent", [], None)


def test_the_local_target_with_gpus(local_env: LocalEnv) -> None:
    local_env.set_gpu(1, memory_used=2048, utilization=30)
    result = gpuops("status", "-i", str(REPO / "inventories" / "local.yaml"))
    assert result.returncode == 0
    assert f"local: gpu 1 2048/{TOTAL} MiB util 30% procs -" in result.stdout.splitlines()


# -- runs --------------------------------------------------------------------------------------


def test_a_running_run_shows_session_run_id_state_and_log_age(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    pb = playbook(tmp_path, "busy", "fake-train --mode steps --gpus 1 --mib 2000 --steps 100000 --interval 0.2")
    launch = gpuops("launch", "--detach", "--yes", "--json", "-i", str(inv), "-p", str(pb))
    assert launch.returncode == 0, launch.stderr
    run_id = json.loads(launch.stdout.splitlines()[-1])["run"]
    try:
        result = gpuops("status", "-i", str(inv), "-p", str(pb))
        assert result.returncode == 0
        got = lines_of(result.stdout, "ct200")
        m = re.fullmatch(rf"session busy-train alive; run {run_id} running; log grew (\d+)s ago; "
                         r"watchdog alive \(heartbeat \d+\.\ds ago\)", got[-1])
        assert m, got
        assert int(m[1]) < 30
        assert any(re.fullmatch(rf"gpu 1 \d+/{TOTAL} MiB util \d+% procs \d+:python3:\d+MiB( memory [▁-█ ]+ flat)?", g)
                   for g in got), got
        code, (obj,) = status_json("-i", str(inv), "-p", str(pb))
        assert set(obj) == STATUS_KEYS | {"run"}  # `run` where a run exists
        assert obj["run"] == run_id
        (session,) = obj["sessions"]
        assert (session["session"], session["alive"], session["launch_in_progress"]) == ("busy-train", True, None)
        run = session["run"]
        assert set(run) == RUN_KEYS
        assert (run["id"], run["state"], run["exit_code"], run["playbook"]) == (run_id, "running", None, "busy")
        assert (run["attempts"], run["max_attempts"]) == (1, 1)  # no restart: section
        assert run["log_bytes"] > 0 and 0 <= run["seconds_since_log"] < 30
        assert ISO_UTC.fullmatch(run["started_at"])
        assert obj["gpus"][1]["memory_used_mib"] >= 2000
    finally:
        assert gpuops("stop", "-i", str(inv), "-p", str(pb)).returncode == 0
    after = lines_of(gpuops("status", "-i", str(inv), "-p", str(pb)).stdout, "ct200")
    stopped = rf"session busy-train not running; run {run_id} aborted \(exit 6(; command exited \d+)?\); log grew \d+s ago; stopped by gpuops stop; watchdog done"
    assert re.fullmatch(stopped, after[-1]), after


def test_a_silent_run_shows_the_log_age_growing(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    pb = playbook(tmp_path, "silent", "fake-train --mode hang --gpus 1 --steps 1")
    assert gpuops("launch", "--detach", "--yes", "-i", str(inv), "-p", str(pb)).returncode == 0
    try:
        def age() -> float | None:
            _, (obj,) = status_json("-i", str(inv), "-p", str(pb))
            run = obj["sessions"][0]["run"]
            assert run["state"] == "running"
            return run["seconds_since_log"] if run["seconds_since_log"] >= 3 else None

        assert wait_until(age, timeout=60, interval=0.5, message="the log age to reach 3 s") >= 3
    finally:
        assert gpuops("stop", "-i", str(inv), "-p", str(pb)).returncode == 0


def test_a_run_aborted_by_a_rule_shows_the_matched_signature(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    pb = playbook(tmp_path, "fx", "fake-train --mode fx-thread --gpus 3 --interval 0.05 --slow-interval 0.05", "[3]")
    launch = gpuops("launch", "--yes", "--timeout", "90", "-i", str(inv), "-p", str(pb))
    assert launch.returncode == 7, launch.stderr
    got = lines_of(gpuops("status", "-i", str(inv), "-p", str(pb)).stdout, "ct200")
    assert re.fullmatch(r"session fx-train not running; run \S+ aborted \(exit 7(; command exited \d+)?\); log grew \d+s ago; "
                        r"matched fx-tracing-race; stopped by the watchdog; watchdog done", got[-1]), got  # fmt: skip
    _, (obj,) = status_json("-i", str(inv), "-p", str(pb))
    run = obj["sessions"][0]["run"]
    assert run["last_match"] == "fx-tracing-race"
    # exit_code is gpuops' code for the run everywhere (status, runs, the launch's exit); the trainer's own
    # status (SIGINT'ed: 130) is command_exit_code.
    runs = [json.loads(line) for line in gpuops("runs", "--json", "-i", str(inv), "-p", str(pb)).stdout.splitlines()]
    (row,) = [r for r in runs if r["run"] == run["id"]]
    assert (run["exit_code"], row["exit_code"]) == (7, 7), (run, row)
    assert run["command_exit_code"] == row["command_exit_code"] and run["command_exit_code"] != 7, (run, row)


# -- --watch -----------------------------------------------------------------------------------


def test_watch_piped_prints_plain_lines_on_every_refresh(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    out = tmp_path / "watch.out"
    proc = start("status", "--watch", "0.3", "-i", str(inv), out=out)
    try:
        wait_until(lambda: "ct200: reachable" in out.read_text(), timeout=60, message="a first refresh")
        fake_proxmox.set_gpu(200, 4, memory_used=7777)
        wait_until(lambda: f"ct200: gpu 4 7777/{TOTAL} MiB" in out.read_text(), timeout=60, message="the new memory")
        assert proc.poll() is None
        assert all(line.startswith("ct200: ") for line in out.read_text().splitlines())
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    assert code == 130
    assert "Traceback" not in proc.stderr.read().decode()
    assert sshd.connection_count() == 1  # every refresh over the same connection


def test_watch_on_a_terminal_refreshes_in_place(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    env = environ(COLUMNS="120", LINES="40", TERM="xterm")
    pid, fd = pty.fork()
    if pid == 0:  # the child: gpuops on a terminal; never returns into pytest
        try:
            os.chdir(REPO)
            os.execve(sys.executable, [sys.executable, "-m", "gpuops", "status", "--watch", "0.3", "-i", str(inv)], env)
        finally:
            os._exit(127)
    seen = bytearray()

    def read_some() -> bytes:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen.extend(os.read(fd, 65536))
            except OSError:
                pass
        return bytes(seen)

    try:
        wait_until(lambda: b"reachable via pve1" in read_some(), timeout=60, message="the first view")
        fake_proxmox.set_gpu(200, 4, memory_used=7777)
        wait_until(lambda: b"7777 MiB" in read_some(), timeout=60, message="the refreshed view")
        assert b"Traceback" not in seen
    finally:
        os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            read_some()
        if done[0] == 0:
            os.kill(pid, signal.SIGKILL)
            done = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(done[1]) == 130
    assert b"Traceback" not in seen


def test_watch_json_prints_an_object_per_refresh(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    out = tmp_path / "watch.jsonl"
    proc = start("status", "--watch", "0.3", "--json", "-i", str(inv), out=out)

    def objects() -> list[dict[str, Any]]:
        return [json.loads(line) for line in out.read_text().splitlines(keepends=True) if line.endswith("\n")]

    try:
        first = wait_until(objects, timeout=60, message="a first object")[0]
        assert set(first) == STATUS_KEYS and first["gpus"][4]["memory_used_mib"] == 0
        fake_proxmox.set_gpu(200, 4, memory_used=7777)
        refreshed = lambda: objects()[-1]["gpus"][4]["memory_used_mib"] == 7777  # noqa: E731
        wait_until(refreshed, timeout=60, message="a refreshed object")
        assert all(o["event"] == "status" and o["target"] == "ct200" for o in objects())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        proc.stderr.close()
    assert sshd.connection_count() == 1


def test_status_without_targets_in_the_inventory_is_a_usage_error(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"here": {"transport": "local"}}, "targets": {}}))
    result = gpuops("status", "-i", str(inv))
    assert result.returncode == 2
    assert "no targets" in result.stderr
