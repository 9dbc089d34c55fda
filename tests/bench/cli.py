"""Run the gpuops CLI the way a user or a CI job does: a subprocess, its exit code and both streams."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from bench import jsoncheck, procs
from bench.waiting import wait_until

CLI_TIMEOUT = 180.0  # one gpuops command, on a loaded 2-core machine
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cli:
    """A finished gpuops command: exit code, stdout bytes, stderr text."""

    code: int
    out: bytes
    err: str

    @property
    def text(self) -> str:
        return self.out.decode("utf-8", "replace")

    def events(self) -> list[dict[str, Any]]:
        """--json output: every stdout line must be one JSON object."""
        return [json.loads(line) for line in self.text.splitlines()]

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.text[-4000:]}\n--- stderr\n{self.err[-4000:]}"


def argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuops", *args]


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_") or k.startswith("GPUOPS_FAKE")}
    env.update(extra or {})
    return env


def gpuops(*args: str, timeout: float = CLI_TIMEOUT, env: Mapping[str, str] | None = None) -> Cli:
    """Run `gpuops ARGS` to completion (killed past `timeout`: a hang fails the test, it never blocks it)."""
    result = subprocess.run(argv(*args), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, env=_env(env))
    jsoncheck.check(args, result.stdout)
    return Cli(result.returncode, result.stdout, result.stderr.decode("utf-8", "replace"))


def gpuops_text(*args: str, env: Mapping[str, str] | None = None, timeout: float = CLI_TIMEOUT,
                ) -> subprocess.CompletedProcess[str]:
    """`gpuops ARGS` from the repo root, both streams as text (for tests that read them as strings)."""
    result = subprocess.run(argv(*args), capture_output=True, text=True, env=_env(env), cwd=REPO, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    jsoncheck.check(args, result.stdout)
    return result


class Running:
    """A gpuops command running in the background, its output collected as it comes."""

    def __init__(self, *args: str, env: Mapping[str, str] | None = None) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            argv(*args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(env)
        )
        self._out = bytearray()
        self._err = bytearray()
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._out), daemon=True),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._err), daemon=True),
        ]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: Any, buf: bytearray) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            buf += chunk

    @property
    def out(self) -> str:
        return bytes(self._out).decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return bytes(self._err).decode("utf-8", "replace")

    def wait_for(self, predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        """Wait for `predicate`; fail at once if gpuops exits first."""

        def check() -> Any:
            value = predicate()
            if not value and self.proc.poll() is not None:
                raise AssertionError(f"gpuops exited {self.proc.returncode} before {what}:\n{self.out[-3000:]}\n{self.err[-3000:]}")
            return value

        return wait_until(check, timeout=timeout, message=lambda: f"{what}; stderr so far:\n{self.err[-2000:]}")

    def signal(self, sig: int = signal.SIGINT) -> None:
        """Ctrl-C (SIGINT, as the terminal delivers it) or any other signal to gpuops itself."""
        os.kill(self.proc.pid, sig)

    def finish(self, timeout: float = CLI_TIMEOUT) -> Cli:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            for t in self._threads:
                t.join(timeout=10)
        jsoncheck.check(self.args, bytes(self._out), complete_only=True)
        return Cli(self.proc.returncode, bytes(self._out), self.err)


class CtCli:
    """gpuops pointed at one bench container: its inventory, a playbook path, and what is on the target.

    `session` is the playbook's tmux session; `playbook` the file the commands use unless told.
    """

    def __init__(self, fake: Any, inventory: Path, playbook: Path, *, session: str, vmid: int = 200,
                 target: str = "ct200") -> None:
        self.fake, self.inventory, self.playbook, self.session = fake, inventory, playbook, session
        self.vmid, self.target = vmid, target

    def write(self, data: Mapping[str, Any], path: Path | None = None) -> Path:
        """Write a playbook (YAML from `data`); the default path is the one commands use."""
        path = path or self.playbook
        path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
        return path

    def args(self, command: str, *extra: str, playbook: Path | None = None) -> list[str]:
        args = [command, "-i", str(self.inventory), "-p", str(playbook or self.playbook), "-t", self.target, *extra]
        return args + (["--yes"] if command == "launch" else [])

    def gpuops(self, command: str, *extra: str, playbook: Path | None = None, timeout: float = CLI_TIMEOUT,
               env: Mapping[str, str] | None = None) -> Cli:
        return gpuops(*self.args(command, *extra, playbook=playbook), timeout=timeout, env=env)

    def start(self, command: str, *extra: str, playbook: Path | None = None, env: Mapping[str, str] | None = None) -> Running:
        return Running(*self.args(command, *extra, playbook=playbook), env=env)

    # -- what is on the target -------------------------------------------------------------------
    @property
    def state(self) -> Path:
        return self.fake.home(self.vmid) / ".gpuops"

    def run_id(self) -> str:
        return (self.state / "sessions" / self.session).read_text().strip()

    def run_dir(self, run_id: str | None = None) -> Path:
        return self.state / "runs" / (run_id or self.run_id())

    def run_dirs(self) -> list[Path]:
        runs = self.state / "runs"
        return sorted(runs.iterdir()) if runs.exists() else []

    def sessions(self) -> list[str]:
        """The tmux sessions alive in the container."""
        result = self.fake.tmux(self.vmid, "list-sessions", "-F", "#{session_name}")
        return result.stdout.split() if result.returncode == 0 else []

    def session_alive(self) -> bool:
        return self.fake.tmux(self.vmid, "has-session", "-t", f"={self.session}").returncode == 0

    def run_processes(self, run_id: str | None = None) -> list[int]:
        """Live processes carrying the run's marker (GPUOPS_RUN_ID=<id>) in their environment."""
        marker = (run_id or self.run_id()).encode()
        return procs.find(lambda env: env.get(b"GPUOPS_RUN_ID") == marker)

    def gpu_memory(self, gpus: tuple[int, ...]) -> list[int]:
        fake_gpus = self.fake.gpus(self.vmid)
        return [fake_gpus.memory_used(g) for g in gpus]
