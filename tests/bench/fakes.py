"""A fake Proxmox host on disk, read by the `pct` and `nvidia-smi` stand-ins, and the local-target twin.

Layout under a fake root ($GPUOPS_FAKE_ROOT, a short temp dir):
  pve/nodes/pve1/lxc/<vmid>.conf   the container exists (real: /etc/pve/nodes/<node>/lxc/<vmid>.conf);
                                   `lxc.environment: K=V` lines reach `pct exec`, as in real LXC
  pve/state/<vmid>                 `running` or `stopped`
  pve/version                      pve-manager version the pct stand-in imitates (default 9.0.10)
  ct/<vmid>/home                   the container's HOME (real: /root inside the container)
  ct/<vmid>/tmux                   its TMUX_TMPDIR, so its tmux server is its own
  ct/<vmid>/tmp                    scratch space of the container
  ct/<vmid>/gpus/                  its GPU state (see bench.gpus)
  ct/<vmid>/warmup.log             GPUOPS_FAKE_WARMUP_LOG there: fake-warmup's start/end/drained lines
  host/home, host/tmux, host/gpus, host/warmup.log   the same for the Proxmox host itself
Every process inside a container carries GPUOPS_FAKE_CT=<vmid> and GPUOPS_FAKE_GPUS=<its gpus dir>,
so stopping a container finds and kills all of its processes, as `pct stop` does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench import BENCH_PATH, BIN_DIR, procs
from bench.gpus import FakeGpus
from bench.kmsg import KernelLog
from bench.waiting import wait_until

NODE = "pve1"
DEFAULT_PVE_VERSION = "9.0.10"


def make_root(prefix: str = "gpuops-bench-") -> Path:
    """A fresh fake root under /tmp: short paths keep tmux socket paths under the 107-byte limit."""
    base = "/tmp" if os.access("/tmp", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def host_env(root: Path) -> dict[str, str]:
    """What the SSH session on the fake Proxmox host sees besides sshd's own variables (sshd SetEnv)."""
    return {
        "PATH": BENCH_PATH,
        "HOME": str(root / "host" / "home"),
        "TMUX_TMPDIR": str(root / "host" / "tmux"),
        "GPUOPS_FAKE_ROOT": str(root),
        "GPUOPS_FAKE_GPUS": str(root / "host" / "gpus"),
        "GPUOPS_FAKE_WARMUP_LOG": str(root / "host" / "warmup.log"),
        "GPUOPS_FAKE_KMSG": str(root / "host" / "kmsg"),  # its kernel log (bench.kmsg): unreadable until enabled
    }


# The stand-in host's ~/.bashrc. bash sources it for every `ssh host cmd` (Debian builds bash with
# SSH_SOURCE_BASHRC), as a real host's rc files are. sshd starts the session in the passwd home
# (/root); the fake host's home is elsewhere, so the rc moves there, as a real session starts in home.
HOST_BASHRC = """\
# gpuops test bench: the fake Proxmox host's ~/.bashrc (tests may append to it, e.g. to
# model rc files that prepend to PATH).
cd "$HOME" 2>/dev/null
"""


def ensure_host(root: Path, gpus: int = 8) -> None:
    """Create the host side of a fake root (idempotent)."""
    for sub in ("pve/nodes/" + NODE + "/lxc", "pve/state", "host/home", "host/tmux", "ct"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "host" / "tmux").chmod(0o700)
    bashrc = root / "host" / "home" / ".bashrc"
    if not bashrc.exists():
        bashrc.write_text(HOST_BASHRC)
    version = root / "pve" / "version"
    if not version.exists():
        version.write_text(DEFAULT_PVE_VERSION + "\n")
    host_gpus = FakeGpus(root / "host" / "gpus")
    if not host_gpus.state_file.exists():
        host_gpus.create(gpus)


def container_env(root: Path, vmid: int) -> dict[str, str]:
    """The environment `pct exec <vmid> --keep-env 0` gives a command (kept in step with the pct stand-in).

    lxc-attach --clear-env leaves PATH and container=lxc; HOME, TMUX_TMPDIR and the GPUOPS_FAKE_*
    variables stand in for the container's own /root, /tmp and GPUs.
    """
    ct = root / "ct" / str(vmid)
    env = {
        "PATH": BENCH_PATH,
        "container": "lxc",
        "HOME": str(ct / "home"),
        "TMUX_TMPDIR": str(ct / "tmux"),
        "GPUOPS_FAKE_CT": str(vmid),
        "GPUOPS_FAKE_GPUS": str(ct / "gpus"),
        "GPUOPS_FAKE_WARMUP_LOG": str(ct / "warmup.log"),
    }
    conf = root / "pve" / "nodes" / NODE / "lxc" / f"{vmid}.conf"
    if conf.exists():
        for line in conf.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "lxc.environment":
                name, _, val = value.strip().partition("=")
                env[name] = val
    return env


class FakeProxmox:
    """The fake Proxmox host's containers, GPUs and processes, for tests to shape and inspect.

    `vmid=None` means the host itself (a target without ctid) wherever a vmid is taken.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        ensure_host(self.root)

    # -- containers -----------------------------------------------------------------------
    def conf_path(self, vmid: int) -> Path:
        return self.root / "pve" / "nodes" / NODE / "lxc" / f"{vmid}.conf"

    def ct_dir(self, vmid: int) -> Path:
        return self.root / "ct" / str(vmid)

    def add_container(
        self,
        vmid: int,
        *,
        running: bool = True,
        gpus: int = 8,
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """Create container `vmid` with `gpus` GPUs passed through; `env` becomes lxc.environment lines."""
        ct = self.ct_dir(vmid)
        for sub in ("home", "tmux", "tmp"):
            (ct / sub).mkdir(parents=True, exist_ok=True)
        (ct / "tmux").chmod(0o700)
        FakeGpus(ct / "gpus").create(gpus)
        lines = [
            "arch: amd64",
            "cores: 32",
            f"hostname: {name or f'ct{vmid}'}",
            "memory: 262144",
            f"net0: name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:{vmid // 256 % 256:02X}:{vmid % 256:02X},ip=dhcp,type=veth",
            "ostype: ubuntu",
            f"rootfs: local-zfs:subvol-{vmid}-disk-0,size=200G",
            "swap: 0",
            "lxc.cgroup2.devices.allow: c 195:* rwm",
            "lxc.cgroup2.devices.allow: c 507:* rwm",
        ]
        lines += [f"lxc.mount.entry: /dev/nvidia{i} dev/nvidia{i} none bind,optional,create=file" for i in range(gpus)]
        lines += [f"lxc.environment: {k}={v}" for k, v in (env or {}).items()]
        self.conf_path(vmid).write_text("\n".join(lines) + "\n")
        self._set_state(vmid, "running" if running else "stopped")

    def set_env(self, vmid: int, **env: str) -> None:
        """Add `lxc.environment` entries to the container's config (seen by later `pct exec`)."""
        with self.conf_path(vmid).open("a") as fh:
            for key, value in env.items():
                fh.write(f"lxc.environment: {key}={value}\n")

    def remove_container(self, vmid: int) -> None:
        """Destroy the container: stop it, then delete its config and files."""
        self.stop_container(vmid)
        self.conf_path(vmid).unlink(missing_ok=True)
        (self.root / "pve" / "state" / str(vmid)).unlink(missing_ok=True)
        shutil.rmtree(self.ct_dir(vmid), ignore_errors=True)

    def status(self, vmid: int) -> str:
        """`running`, `stopped`, or `missing`."""
        if not self.conf_path(vmid).exists():
            return "missing"
        state = self.root / "pve" / "state" / str(vmid)
        return state.read_text().strip() if state.exists() else "stopped"

    def _set_state(self, vmid: int, state: str) -> None:
        (self.root / "pve" / "state" / str(vmid)).write_text(state + "\n")

    def stop_container(self, vmid: int) -> list[int]:
        """Like `pct stop`: mark it stopped and kill every process of the container; return their pids."""
        self._set_state(vmid, "stopped")
        killed = procs.sweep(self._matcher(vmid))
        # A stopped container's /tmp is gone: so are its tmux sockets.
        for sub in ("tmux", "tmp"):
            path = self.ct_dir(vmid) / sub
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
                path.mkdir(mode=0o700 if sub == "tmux" else 0o755)
        return killed

    def start_container(self, vmid: int) -> None:
        if not self.conf_path(vmid).exists():
            raise KeyError(f"no container {vmid}")
        self._set_state(vmid, "running")

    def set_pve_version(self, version: str) -> None:
        """Which pct to imitate: 9.x (default, --keep-env defaults to 0), 8.x (defaults to 1),
        or 8.0/7.x (no --keep-env; a stopped CT fails inside lxc-attach)."""
        (self.root / "pve" / "version").write_text(version + "\n")

    # -- what is inside ---------------------------------------------------------------------
    def home(self, vmid: int | None = None) -> Path:
        return self.root / "host" / "home" if vmid is None else self.ct_dir(vmid) / "home"

    def tmux_tmpdir(self, vmid: int | None = None) -> Path:
        return self.root / "host" / "tmux" if vmid is None else self.ct_dir(vmid) / "tmux"

    def gpu_dir(self, vmid: int | None = None) -> Path:
        return self.root / "host" / "gpus" if vmid is None else self.ct_dir(vmid) / "gpus"

    def gpus(self, vmid: int | None = None) -> FakeGpus:
        return FakeGpus(self.gpu_dir(vmid))

    def warmup_log(self, vmid: int | None = None) -> Path:
        return self.root / "host" / "warmup.log" if vmid is None else self.ct_dir(vmid) / "warmup.log"

    @property
    def kernel_log(self) -> KernelLog:
        """The host's kernel log (dmesg, journalctl -k there); containers share it but may not read it."""
        return KernelLog(self.root / "host" / "kmsg")

    def set_gpu(
        self, vmid: int | None, index: int, *, memory_used: int | None = None, utilization: int | None = None
    ) -> None:
        """Give a GPU a baseline load, e.g. another job holding memory on it."""
        self.gpus(vmid).set_gpu(index, memory_used=memory_used, utilization=utilization)

    def env(self, vmid: int | None = None) -> dict[str, str]:
        """The environment a process there starts with (the SSH session's for the host)."""
        if vmid is None:
            return host_env(self.root)
        return container_env(self.root, vmid)

    def _matcher(self, vmid: int | None):
        gpus = str(self.gpu_dir(vmid)).encode()
        if vmid is None:
            return lambda env: env.get(b"GPUOPS_FAKE_GPUS") == gpus and b"GPUOPS_FAKE_CT" not in env
        ct = str(vmid).encode()
        return lambda env: env.get(b"GPUOPS_FAKE_CT") == ct and env.get(b"GPUOPS_FAKE_GPUS") == gpus

    def processes(self, vmid: int | None = None) -> list[int]:
        """Live pids of every process in the container (or started by SSH sessions on the host)."""
        return procs.find(self._matcher(vmid))

    def tmux(self, vmid: int | None, *args: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
        """Run real tmux against that container's own server (never the developer's: TMUX is unset)."""
        env = self.env(vmid)
        return subprocess.run(
            ["tmux", *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def pct(self, *args: str, timeout: float = 30, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run the pct stand-in on the fake host directly (no SSH), e.g. pct("exec", "200", "--", "true")."""
        return subprocess.run(
            [str(BIN_DIR / "pct"), *args],
            env=host_env(self.root),
            cwd=self.home(None),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )

    def occupy_gpu(self, vmid: int | None, index: int, *, mib: int = 20000, busy: bool = True) -> int:
        """Start a process there that holds `mib` MiB on GPU `index` (another job); return its pid.

        It stays until killed or the container stops; nvidia-smi lists it as a compute app.
        """
        argv = [str(BIN_DIR / "fake-train"), "--mode", "hold", "--gpus", str(index), "--mib", str(mib)]
        if not busy:
            argv.append("--idle")
        proc = subprocess.Popen(
            argv,
            env=self.env(vmid),
            cwd=self.home(vmid),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        entry = self.gpu_dir(vmid) / "procs" / f"{proc.pid}.json"
        wait_until(lambda: entry.exists() or proc.poll() is not None, message=f"fake job on GPU {index} to start")
        if proc.poll() is not None:
            raise RuntimeError(f"fake job on GPU {index} exited with {proc.returncode}")
        return proc.pid

    def cleanup(self) -> list[int]:
        """Kill every process that belongs to this fake root (containers, host sessions, tmux servers)."""
        return procs.sweep(procs.mentioning(str(self.root)))


class LocalEnv:
    """The local (no SSH) target's stand-in world: its own HOME, tmux server dir and GPUs."""

    def __init__(self, root: str | os.PathLike[str], gpus: int = 8) -> None:
        self.root = Path(root)
        self.home = self.root / "home"
        self.tmux_tmpdir = self.root / "tmux"
        self.gpu_dir = self.root / "gpus"
        self.warmup_log = self.root / "warmup.log"
        self.kernel_log = KernelLog(self.root / "kmsg")  # this machine is its own host: its kernel log
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmux_tmpdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.gpus = FakeGpus(self.gpu_dir)
        if not self.gpus.state_file.exists():
            self.gpus.create(gpus)

    def environ(self, base_path: str | None = None) -> dict[str, str]:
        """Variables to set: the bench's bin dir first on PATH, isolated HOME/TMUX_TMPDIR, fake GPUs."""
        path = base_path if base_path is not None else os.environ.get("PATH", "")
        return {
            "PATH": f"{BIN_DIR}:{path}" if path else str(BIN_DIR),
            "HOME": str(self.home),
            "TMUX_TMPDIR": str(self.tmux_tmpdir),
            "GPUOPS_FAKE_GPUS": str(self.gpu_dir),
            "GPUOPS_FAKE_WARMUP_LOG": str(self.warmup_log),
            "GPUOPS_FAKE_KMSG": str(self.kernel_log.path),
        }

    def set_gpu(self, index: int, *, memory_used: int | None = None, utilization: int | None = None) -> None:
        self.gpus.set_gpu(index, memory_used=memory_used, utilization=utilization)

    def tmux(self, *args: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "TMUX"}
        env.update(self.environ())
        return subprocess.run(
            ["tmux", *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def processes(self) -> list[int]:
        return procs.find(procs.mentioning(str(self.root)))

    def cleanup(self) -> list[int]:
        return procs.sweep(procs.mentioning(str(self.root)))
