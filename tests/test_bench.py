"""The bench itself: real sshd behaves as OpenSSH does, the stand-ins as pct, nvidia-smi and trainers do."""

from __future__ import annotations

import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from bench import BENCH_PATH, BIN_DIR, FakeProxmox, LocalEnv, SshServer, wait_until, write_inventory
from bench.gpus import FIRST_UUID


def run_local(argv: list[str], env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def smi(fake: FakeProxmox, vmid: int | None, *args: str) -> subprocess.CompletedProcess[str]:
    return run_local([str(BIN_DIR / "nvidia-smi"), *args], fake.env(vmid))


# -- sshd --------------------------------------------------------------------------------------
def test_ssh_with_key_and_known_hosts(sshd: SshServer) -> None:
    result = sshd.ssh("echo hello")
    assert (result.returncode, result.stdout) == (0, "hello\n"), result.stderr
    line = sshd.known_hosts.read_text().strip()
    assert re.fullmatch(rf"\[127\.0\.0\.1\]:{sshd.port} ssh-ed25519 AAAA\S+", line)
    assert re.fullmatch(r"SHA256:[A-Za-z0-9+/]{43}", sshd.host_key_fingerprint)


def test_ssh_refuses_a_key_it_does_not_know(sshd: SshServer, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    argv = sshd.ssh_argv()
    argv[argv.index(str(sshd.client_key))] = str(other)
    result = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 255
    assert "Permission denied (publickey)" in result.stderr


def test_ssh_refuses_a_host_missing_from_known_hosts(sshd: SshServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    result = sshd.ssh("true", options=["-o", f"UserKnownHostsFile={empty}"])
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr


def test_session_has_the_standins_first_and_its_own_home(sshd: SshServer) -> None:
    result = sshd.ssh('command -v pct nvidia-smi tmux python3; echo "$PATH"; echo "$HOME"; pwd; echo "${TMUX-unset}"')
    assert result.returncode == 0, result.stderr
    pct, smi_path, tmux, python3, path, home, cwd, tmux_var = result.stdout.splitlines()
    assert (pct, smi_path) == (str(BIN_DIR / "pct"), str(BIN_DIR / "nvidia-smi"))
    assert path == BENCH_PATH
    assert Path(tmux).name == "tmux" and Path(python3).name == "python3"
    assert home == cwd == str(sshd.fake_root / "host" / "home")
    assert tmux_var == "unset"


def test_connection_count_counts_each_ssh_client(sshd: SshServer) -> None:
    before = sshd.connection_count()
    for _ in range(2):
        assert sshd.ssh("true").returncode == 0
    assert sshd.connection_count() == before + 2


def test_kill_connections_drops_a_live_client(sshd: SshServer) -> None:
    before = sshd.connection_count()
    client = subprocess.Popen(
        sshd.ssh_argv() + ["echo up; sleep 60"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert client.stdout is not None
        assert client.stdout.readline() == "up\n"
        assert sshd.connection_count() == before + 1
        assert sshd.kill_connections() == 1
        assert client.wait(timeout=15) == 255
    finally:
        client.kill()
        client.wait()
    assert sshd.ssh("echo still listening").stdout == "still listening\n"


def test_restart_keeps_port_and_keys(sshd: SshServer) -> None:
    port, fingerprint = sshd.port, sshd.host_key_fingerprint
    sshd.restart()
    assert (sshd.port, sshd.host_key_fingerprint) == (port, fingerprint)
    assert sshd.ssh("true").returncode == 0


def test_rotated_host_key_is_refused_by_the_real_client(sshd: SshServer) -> None:
    old = sshd.host_key_fingerprint
    sshd.rotate_host_key()
    assert sshd.host_key_fingerprint != old
    result = sshd.ssh("true")
    assert result.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr
    assert "Host key verification failed" in result.stderr


def test_write_inventory_points_at_the_server(sshd: SshServer, tmp_path: Path) -> None:
    path = write_inventory(tmp_path / "inv.yaml", sshd, gpus=[5, 6, 7], extra_targets={"host": {"host": "pve1"}})
    data = yaml.safe_load(path.read_text())
    assert data["hosts"]["pve1"] == {
        "address": "127.0.0.1",
        "user": sshd.user,
        "port": sshd.port,
        "identity_file": str(sshd.client_key),
        "known_hosts": str(sshd.known_hosts),
        "host_key_policy": "strict",
    }
    assert data["targets"] == {"ct200": {"host": "pve1", "ctid": 200, "gpus": [5, 6, 7]}, "host": {"host": "pve1"}}


# -- pct ---------------------------------------------------------------------------------------
def test_pct_exec_over_ssh_runs_in_the_container_with_a_clean_environment(
    sshd: SshServer, fake_proxmox: FakeProxmox
) -> None:
    script = 'echo "$HOME"; pwd; printenv FOO || echo "FOO unset"; echo "$container"'
    result = sshd.ssh(f"export FOO=from-ssh; pct exec 200 -- bash -c {shlex.quote(script)}")
    assert result.returncode == 0, result.stderr
    home = str(fake_proxmox.home(200))
    assert result.stdout.splitlines() == [home, home, "FOO unset", "lxc"]


def test_pct_exec_environment_matches_the_bench_model(fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.set_env(200, EXTRA="1")
    result = fake_proxmox.pct("exec", "200", "--", "env", "-0")
    env = dict(item.split("=", 1) for item in result.stdout.split("\0") if item)
    assert env == fake_proxmox.env(200)
    assert env["EXTRA"] == "1" and env["PATH"] == BENCH_PATH


def test_pct_exec_passes_argv_without_a_shell(fake_proxmox: FakeProxmox) -> None:
    result = fake_proxmox.pct("exec", "200", "--", "printf", "<%s>\n", "a b", "$HOME", "*")
    assert result.stdout == "<a b>\n<$HOME>\n<*>\n"
    assert fake_proxmox.pct("exec", "200", "--", "cat", input="from stdin\n").stdout == "from stdin\n"


def test_pct_exec_keep_env_on_pve8_passes_the_session_environment(sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.set_pve_version("8.3.2")
    result = sshd.ssh("export FOO=from-ssh; pct exec 200 -- bash -c 'printenv FOO; echo $PATH; echo $HOME'")
    assert result.stdout.splitlines() == ["from-ssh", f"{BIN_DIR}:/sbin:/bin:/usr/sbin:/usr/bin", str(fake_proxmox.home(200))]
    result = sshd.ssh("export FOO=from-ssh; pct exec 200 --keep-env 0 -- bash -c 'printenv FOO || echo unset'")
    assert result.stdout == "unset\n"


def test_pct_errors_over_ssh(sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.add_container(201, running=False)
    result = sshd.ssh("pct exec 201 -- true")
    assert (result.returncode, result.stdout, result.stderr) == (255, "", "container '201' not running!\n")
    result = sshd.ssh("pct exec 999 -- true")
    assert (result.returncode, result.stderr) == (2, "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n")
    result = sshd.ssh("pct exec 200")
    assert result.returncode == 255
    assert re.fullmatch(r"missing command at /usr/share/perl5/PVE/CLI/pct\.pm line \d+\.\n", result.stderr)


@pytest.mark.parametrize(
    ("args", "code", "stderr"),
    [
        (["exec", "abc", "--", "true"], 255,
         "400 Parameter verification failed.\nvmid: type check ('integer') failed - got 'abc'\n"
         "pct exec <vmid> [<extra-args>] [OPTIONS]\n"),
        (["exec", "42", "--", "true"], 255,
         "400 Parameter verification failed.\nvmid: value must have a minimum value of 100\n"
         "pct exec <vmid> [<extra-args>] [OPTIONS]\n"),
        (["exec"], 255, "400 not enough arguments\npct exec <vmid> [<extra-args>] [OPTIONS]\n"),
        (["exec", "200", "ls", "-la"], 255,
         "Unknown option: la\n400 unable to parse option\npct exec <vmid> [<extra-args>] [OPTIONS]\n"),
        (["status"], 255, "400 not enough arguments\npct status <vmid> [OPTIONS]\n"),
        (["status", "200", "201"], 255, "400 too many arguments\npct status <vmid> [OPTIONS]\n"),
        (["status", "999"], 2, "Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n"),
    ],
)  # fmt: skip
def test_pct_rejects_malformed_calls_like_pve(fake_proxmox: FakeProxmox, args: list[str], code: int, stderr: str) -> None:
    result = fake_proxmox.pct(*args)
    assert (result.returncode, result.stdout, result.stderr) == (code, "", stderr)


def test_pct_unknown_command(fake_proxmox: FakeProxmox) -> None:
    result = fake_proxmox.pct("st", "200")  # ambiguous prefix: start, status, stop
    assert result.returncode == 255
    assert result.stderr.startswith("ERROR: unknown command 'pct st'\nUSAGE: pct <COMMAND> [ARGS] [OPTIONS]\n")
    assert "       pct exec <vmid> [<extra-args>] [OPTIONS]\n" in result.stderr
    assert fake_proxmox.pct("stat", "200").stdout == "status: running\n"  # a unique prefix is expanded


def test_pct_exec_exit_status_is_the_commands(fake_proxmox: FakeProxmox) -> None:
    assert fake_proxmox.pct("exec", "200", "--", "sh", "-c", "exit 7").returncode == 7
    assert fake_proxmox.pct("exec", "200", "--", "sh", "-c", "kill -TERM $$").returncode == 128 + signal.SIGTERM
    missing = fake_proxmox.pct("exec", "200", "--", "no-such-tool", "x")
    assert missing.returncode == 127
    assert missing.stderr.endswith('No such file or directory - Failed to exec "no-such-tool"\n')
    assert missing.stderr.startswith("lxc-attach: 200: ../src/lxc/attach.c: lxc_attach_run_command:")


def test_pct_before_keep_env_fails_inside_lxc_attach(fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.set_pve_version("7.4-19")
    fake_proxmox.add_container(201, running=False)
    result = fake_proxmox.pct("exec", "201", "--", "true")
    assert result.returncode == 1
    assert "get_attach_context: 405 Connection refused - Failed to get init pid" in result.stderr
    result = fake_proxmox.pct("exec", "200", "--keep-env", "0", "--", "true")
    assert (result.returncode, result.stderr.splitlines()[:2]) == (255, ["Unknown option: keep-env", "400 unable to parse option"])


def test_pct_status_and_list(sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.add_container(105, running=False, name="builder")
    result = sshd.ssh("pct status 200; pct status 105; pct list")
    assert result.returncode == 0, result.stderr
    fmt = "%-10s %-10s %-12s %-20s\n"
    assert result.stdout == (
        "status: running\nstatus: stopped\n"
        + fmt % ("VMID", "Status", "Lock", "Name") + fmt % (105, "stopped", "", "builder") + fmt % (200, "running", "", "ct200")
    )  # fmt: skip


def test_pct_list_prints_nothing_without_containers(fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.remove_container(200)
    assert (fake_proxmox.pct("list").returncode, fake_proxmox.pct("list").stdout) == (0, "")


# -- nvidia-smi ----------------------------------------------------------------------------------
def test_nvidia_smi_formats_as_reference(fake_proxmox: FakeProxmox) -> None:
    full = smi(fake_proxmox, 200, "--query-gpu=index,name,uuid,memory.used,memory.total,utilization.gpu",
               "--format=csv,noheader")  # fmt: skip
    assert full.stdout.splitlines()[0] == f"0, NVIDIA H200, {FIRST_UUID}, 0 MiB, 143771 MiB, 0 %"
    assert len(full.stdout.splitlines()) == 8
    nounits = smi(fake_proxmox, 200, "--query-gpu=index,memory.used,memory.total,utilization.gpu",
                  "--format=csv,noheader,nounits", "-i", "0")  # fmt: skip
    assert nounits.stdout == "0, 0, 143771, 0\n"
    header = smi(fake_proxmox, 200, "--query-gpu=index,memory.used", "--format=csv", "-i", "0")
    assert header.stdout == "index, memory.used [MiB]\n0, 0 MiB\n"
    header_nounits = smi(fake_proxmox, 200, "--query-gpu=memory.used,utilization.gpu", "--format=csv,nounits", "-i", "0")
    assert header_nounits.stdout == "memory.used [MiB], utilization.gpu [%]\n0, 0\n"
    listing = smi(fake_proxmox, 200, "-L")
    assert listing.stdout.splitlines()[0] == f"GPU 0: NVIDIA H200 (UUID: {FIRST_UUID})"


def test_nvidia_smi_compute_apps_empty_then_a_live_trainer(fake_proxmox: FakeProxmox) -> None:
    query = ("--query-compute-apps=pid,gpu_uuid,used_memory,process_name", "--format=csv,noheader")
    assert (smi(fake_proxmox, 200, *query).returncode, smi(fake_proxmox, 200, *query).stdout) == (0, "")
    trainer = subprocess.Popen(
        [str(BIN_DIR / "fake-train"), "--mode", "hold", "--gpus", "5", "--mib", "100"],
        env=fake_proxmox.env(200), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        gpus = fake_proxmox.gpus(200)
        wait_until(lambda: gpus.memory_used(5) == 1000, message="the trainer's memory to show")
        uuid = gpus.state()["gpus"][5]["uuid"]
        assert smi(fake_proxmox, 200, *query).stdout == f"{trainer.pid}, {uuid}, 1000 MiB, python3\n"
        util = smi(fake_proxmox, 200, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "5")
        assert util.stdout == "97\n"
        gpus.hide_compute_apps()
        assert smi(fake_proxmox, 200, *query).stdout == ""  # LXC: memory used, no process listed
        assert gpus.memory_used(5) == 1000
    finally:
        trainer.kill()
        trainer.wait()
    assert fake_proxmox.gpus(200).memory_used(5) == 0  # a killed process no longer counts


def test_nvidia_smi_errors(fake_proxmox: FakeProxmox) -> None:
    bad = smi(fake_proxmox, 200, "--query-gpu=index,xyz", "--format=csv")
    assert (bad.returncode, bad.stdout, bad.stderr) == (2, 'Field "xyz" is not a valid field to query.\n\n', "")
    unknown = smi(fake_proxmox, 200, "--bogus")
    assert (unknown.returncode, unknown.stdout) == (2, "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h' for help.\n")
    combo = smi(fake_proxmox, 200, "--query-gpu=index")
    assert (combo.returncode, combo.stdout) == (2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
    # Read off the real tool (tests/data/real_h200/nvidia-smi-loop.txt):
    two = smi(fake_proxmox, 200, "--query-gpu=index", "--query-compute-apps=pid", "--format=csv")
    assert (two.returncode, two.stdout) == (2, "Only one --query-* switch can be used at a time.\n")
    zero = smi(fake_proxmox, 200, "--query-gpu=index", "--format=csv,noheader", "-lms", "0")
    assert (zero.returncode, zero.stdout) == (
        2, "Provided [-l(ms) | --loop(-ms)=] value is incorrect. Loop frequency must be greater than 0.\n\n")


def test_nvidia_smi_loop_mode_prints_every_interval_until_stopped(fake_proxmox: FakeProxmox) -> None:
    import subprocess as sp

    from bench import BIN_DIR

    env = {**fake_proxmox.env(200), "PATH": f"{BIN_DIR}:/usr/bin:/bin"}
    proc = sp.Popen([str(BIN_DIR / "nvidia-smi"), "--query-gpu=index,memory.used,utilization.gpu",
                     "--format=csv,noheader,nounits", "-i", "5,6", "-lms", "100"], stdout=sp.PIPE, text=True, env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(6)]
    finally:
        proc.kill()
        proc.wait()
    assert lines == ["5, 0, 0\n", "6, 0, 0\n"] * 3
    assert smi(fake_proxmox, 200, "--query-gpu=index", "--format=csv", "-i", "9").returncode == 6
    fake_proxmox.gpus(200).unload_driver()
    none = smi(fake_proxmox, 200, "--query-gpu=index", "--format=csv")
    assert none.returncode == 9
    assert none.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_nvidia_smi_baseline_load_and_selection(fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.set_gpu(200, 6, memory_used=40000, utilization=55)
    out = smi(fake_proxmox, 200, "--query-gpu=index,memory.used,memory.free,utilization.gpu",
              "--format=csv,noheader,nounits", "-i", "7,6")  # fmt: skip
    assert out.stdout == "6, 40000, 103771, 55\n7, 0, 143771, 0\n"
    assert fake_proxmox.gpus(None).memory_used(6) == 0  # the host's GPU state is its own


def test_nvidia_smi_over_ssh_is_fast_enough_to_poll(sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    result = sshd.ssh("pct exec 200 -- nvidia-smi --query-gpu=index --format=csv,noheader | wc -l")
    assert result.stdout == "8\n"
    times = []
    for _ in range(5):
        start = time.monotonic()
        smi(fake_proxmox, 200, "--query-gpu=index,memory.used,utilization.gpu", "--format=csv,noheader")
        times.append(time.monotonic() - start)
    assert statistics.median(times) < 0.5  # ~30 ms here; generous for a loaded CI machine


# -- workloads -------------------------------------------------------------------------------------
def test_fx_trainer_keeps_running_after_the_error(fake_proxmox: FakeProxmox, tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with log.open("wb") as fh:
        trainer = subprocess.Popen(
            [str(BIN_DIR / "fake-train"), "--mode", "fx-thread", "--interval", "0", "--slow-interval", "0.05"],
            env=fake_proxmox.env(200), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_until(lambda: log.read_text().count("step ") >= 8, message="eager-fallback steps after the error")
        text = log.read_text()
        assert "RuntimeError: Detected that you are using FX to symbolically trace a dynamo-optimized function" in text
        assert text.index("RuntimeError: Detected") < text.rindex("step ")
        assert trainer.poll() is None
    finally:
        trainer.send_signal(signal.SIGINT)
        assert trainer.wait(timeout=15) == -signal.SIGINT  # KeyboardInterrupt, as Python dies of Ctrl-C
    assert log.read_text().rstrip().endswith("KeyboardInterrupt")


def test_trainer_in_container_tmux_dies_with_the_container(fake_proxmox: FakeProxmox) -> None:
    cmd = "fake-train --mode ignore-int --gpus 5,6 --interval 0.05 > $HOME/train.log 2>&1"
    started = fake_proxmox.pct("exec", "200", "--", "tmux", "new-session", "-d", "-s", "train", cmd)
    assert started.returncode == 0, started.stderr
    assert fake_proxmox.tmux(200, "has-session", "-t", "train").returncode == 0
    assert (fake_proxmox.tmux_tmpdir(200) / f"tmux-{os.getuid()}" / "default").is_socket()
    gpus = fake_proxmox.gpus(200)
    wait_until(lambda: gpus.memory_used(5) > 0 and gpus.memory_used(6) > 0, message="trainer memory")
    log = fake_proxmox.home(200) / "train.log"
    # The pty delivers SIGINT before send-keys returns; steps logged after that prove it was ignored.
    fake_proxmox.tmux(200, "send-keys", "-t", "train", "C-c")
    seen = log.read_text().count("step ")
    wait_until(lambda: log.read_text().count("step ") >= seen + 3, message="steps after Ctrl-C")
    killed = fake_proxmox.stop_container(200)
    assert killed and fake_proxmox.processes(200) == []
    assert (gpus.memory_used(5), gpus.memory_used(6)) == (0, 0)
    assert fake_proxmox.pct("status", "200").stdout == "status: stopped\n"


def test_spawned_orphan_leaves_the_session_but_not_the_container(fake_proxmox: FakeProxmox) -> None:
    result = fake_proxmox.pct("exec", "200", "--", "fake-train", "--mode", "spawn-orphan", "--steps", "1", "--gpus", "3")
    assert result.returncode == 0
    gpus = fake_proxmox.gpus(200)
    assert gpus.memory_used(3) > 0
    (orphan,) = fake_proxmox.processes(200)
    assert os.getsid(orphan) == orphan  # its own session: not reachable through a tmux session or pgid
    fake_proxmox.stop_container(200)
    assert gpus.memory_used(3) == 0


def test_warmups_log_start_end_and_drain(fake_proxmox: FakeProxmox) -> None:
    for gpu in (5, 6):
        ok = fake_proxmox.pct("exec", "200", "--", "fake-warmup", "--gpu", str(gpu), "--duration", "0.1")
        assert ok.returncode == 0 and f"[warmup gpu{gpu}] compiling flex_attention 10/10" in ok.stdout
    fail = fake_proxmox.pct("exec", "200", "--", "fake-warmup", "--gpu", "7", "--duration", "0.1", "--mode", "fail")
    assert fail.returncode == 1 and "torch._inductor.exc.InductorError" in fail.stdout
    events = [line.split()[:2] for line in fake_proxmox.warmup_log(200).read_text().splitlines()]
    assert events == [[e, g] for g in ("5", "6", "7") for e in ("start", "end", "drained")]


def test_lingering_warmup_drains_late(fake_proxmox: FakeProxmox) -> None:
    gpus = fake_proxmox.gpus(200)
    result = fake_proxmox.pct("exec", "200", "--", "fake-warmup", "--gpu", "4", "--duration", "0.1",
                              "--mode", "linger", "--linger", "1.5")  # fmt: skip
    assert result.returncode == 0
    assert gpus.memory_used(4) > 0  # the process is gone, its memory is not
    wait_until(lambda: gpus.memory_used(4) == 0, message="the lingering memory to drain")
    assert fake_proxmox.warmup_log(200).read_text().splitlines()[-1].startswith("drained 4 ")


def test_numbered_lines_are_fixed_width_and_complete(fake_proxmox: FakeProxmox) -> None:
    result = fake_proxmox.pct("exec", "200", "--", "fake-train", "--mode", "numbered", "--count", "500", "--width", "32")
    lines = result.stdout.splitlines()
    assert [int(line.split()[1]) for line in lines] == list(range(1, 501))
    assert {len(line) for line in lines} == {len("line 000001 ") + 32}


def test_quit_and_missing_driver(fake_proxmox: FakeProxmox) -> None:
    quit_ = fake_proxmox.pct("exec", "200", "--", "fake-train", "--mode", "quit")
    assert (quit_.returncode, quit_.stdout, quit_.stderr) == (0, "", "")
    fake_proxmox.gpus(200).unload_driver()
    broken = fake_proxmox.pct("exec", "200", "--", "fake-train", "--mode", "steps")
    assert broken.returncode == 1 and "RuntimeError: Found no NVIDIA driver on your system" in broken.stdout


# -- local target ----------------------------------------------------------------------------------
def test_local_env_isolates_tmux_home_and_gpus(local_env: LocalEnv) -> None:
    assert "TMUX" not in os.environ
    assert os.environ["PATH"].split(":")[0] == str(BIN_DIR)
    assert os.environ["HOME"] == str(local_env.home)
    started = subprocess.run(["tmux", "new-session", "-d", "-s", "bench", "sleep 60"], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    assert (local_env.tmux_tmpdir / f"tmux-{os.getuid()}" / "default").is_socket()
    assert local_env.tmux("list-sessions", "-F", "#{session_name}").stdout == "bench\n"
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True)
    assert out.stdout.splitlines() == [str(i) for i in range(8)]
    assert local_env.processes()  # the tmux server, found by its environment


def test_local_proxmox_runs_pct_without_ssh(local_proxmox: FakeProxmox) -> None:
    out = subprocess.run(["pct", "exec", "200", "--", "nvidia-smi", "-L", "-i", "0"], capture_output=True, text=True)
    assert out.stdout == f"GPU 0: NVIDIA H200 (UUID: {FIRST_UUID})\n"
    assert os.environ["GPUOPS_FAKE_ROOT"] == str(local_proxmox.root)


@pytest.mark.parametrize("script", ["run.py", "bench_scan.py"])
def test_the_benchmark_scripts_start_as_the_readme_runs_them(script: str) -> None:
    """`python3 benchmarks/X.py --help` from a fresh interpreter: each script's imports (benchkit first, which puts
    the bench and the tests' modules on sys.path) resolve, as BENCHMARKS.md's commands need."""
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, str(root / "benchmarks" / script), "--help"], capture_output=True, text=True,
                       timeout=120, cwd=root)
    assert r.returncode == 0 and "usage" in r.stdout.lower(), r.stderr[-2000:]
