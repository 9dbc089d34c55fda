"""Shared fixtures: a real sshd on 127.0.0.1 as the fake Proxmox host, its containers, the local twin, and `ct`.

Helpers live in tests/bench (importable as `bench` from any test module). The tests live in a folder per area of
the package (tests/agent/, cli/, client/, config/, transport/; tests/real/: the real GPU machine's records), each
on sys.path, so a test module imports another's helpers by its name wherever each lives. Every test that uses
the bench (a real sshd, tmux, the stand-ins) is marked `bench`, so `pytest -m "not bench"` runs the pure units
alone.
"""

from __future__ import annotations

import inspect
import os
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bench import TEST_AREAS, FakeProxmox, LocalEnv, SshServer, write_inventory
from bench.cli import CtCli
from bench.fakes import make_root

sys.path.extend(str(area) for area in TEST_AREAS if str(area) not in sys.path)

# A bench test starts processes: a real sshd, tmux servers, fake Proxmox roots, network namespaces, the gpuops
# command, bash. A unit runs in this process. Fixtures that start the bench (a test using any of them, directly or
# through another fixture, is a bench test):
BENCH_FIXTURES = frozenset({"sshd", "bastion", "hop_b", "fake_proxmox", "local_proxmox", "local_env", "ct",
                            "far_ct", "netns"})
# What a test (or a helper or fixture of its module that it calls) names when it starts processes itself.
PROCESS_NAMES = frozenset({"SshServer", "FakeProxmox", "LocalEnv", "NetNs", "CtCli", "Running", "gpuops",
                           "gpuops_text", "procs", "subprocess", "getfixturevalue"})


def _names(code: types.CodeType) -> set[str]:
    """Every global or attribute name a function's code (its lambdas and inner functions too) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _ours(obj: Any) -> bool:
    """Defined in a test module or this conftest (not in gpuops, pytest or the bench package)."""
    return (getattr(obj, "__module__", None) or "").startswith(("test_", "conftest"))


def _starts_processes(fn: Any, seen: set[int]) -> bool:
    """Whether `fn`, or a function or class of a test module that it names, names something that starts processes."""
    fn = getattr(getattr(fn, "hypothesis", None), "inner_test", None) or inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or id(fn) in seen:
        return False
    seen.add(id(fn))
    names = _names(code)
    if names & PROCESS_NAMES:
        return True
    for obj in (fn.__globals__.get(n) for n in names):
        if isinstance(obj, type) and _ours(obj):
            if any(_starts_processes(m, seen) for m in vars(obj).values() if isinstance(m, types.FunctionType)):
                return True
        elif isinstance(obj, types.FunctionType) and _ours(obj) and _starts_processes(obj, seen):
            return True
    return False


def _is_bench(item: pytest.Item) -> bool:
    if BENCH_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    info = getattr(item, "_fixtureinfo", None)
    fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs if _ours(d.func)]
    seen: set[int] = set()
    return any(_starts_processes(fn, seen) for fn in [getattr(item, "function", None), *fixtures] if fn is not None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that starts processes `bench`: `python3 -m pytest -m "not bench"` runs the units alone."""
    for item in items:
        if _is_bench(item):
            item.add_marker(pytest.mark.bench)


def _keep() -> bool:
    """GPUOPS_BENCH_KEEP=1 leaves fake roots on disk for a post-mortem."""
    return os.environ.get("GPUOPS_BENCH_KEEP") == "1"


def _server() -> Iterator[SshServer]:
    server = SshServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
        FakeProxmox(server.fake_root).cleanup()
        if not _keep():
            shutil.rmtree(server.fake_root, ignore_errors=True)


@pytest.fixture
def sshd() -> Iterator[SshServer]:
    """A fresh real sshd (fresh keys, fake root) per test; stopped and swept even when the test fails."""
    yield from _server()


@pytest.fixture
def bastion() -> Iterator[SshServer]:
    """A second real sshd on 127.0.0.1, used as the jump host."""
    yield from _server()


@pytest.fixture
def hop_b() -> Iterator[SshServer]:
    """A second jump host, for ProxyJump chains of two hops."""
    yield from _server()


@pytest.fixture
def fake_proxmox(sshd: SshServer) -> FakeProxmox:
    """The sshd's fake Proxmox host, with CT 200 (running, 8 GPUs) already created."""
    fake = FakeProxmox(sshd.fake_root)
    fake.add_container(200)
    return fake


@pytest.fixture
def local_proxmox(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeProxmox]:
    """This process made the fake Proxmox host (no SSH): `pct` runs locally, CT 200 exists and runs.

    For PctTransport over a LocalTransport: the environment is what an SSH session there gets.
    """
    fake = FakeProxmox(make_root())
    fake.add_container(200)
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("TMUX_PANE", raising=False)
    for key, value in fake.env(None).items():
        monkeypatch.setenv(key, value)
    try:
        yield fake
    finally:
        fake.cleanup()
        if not _keep():
            shutil.rmtree(fake.root, ignore_errors=True)


@pytest.fixture
def local_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalEnv]:
    """For the local transport: stand-ins first on PATH, own HOME, own tmux server dir, fake GPUs.

    TMUX is unset so tmux honours TMUX_TMPDIR and never touches the developer's sessions.
    """
    env = LocalEnv(make_root("gpuops-local-"))
    monkeypatch.delenv("TMUX", raising=False)
    monkeypatch.delenv("TMUX_PANE", raising=False)
    for key, value in env.environ().items():
        monkeypatch.setenv(key, value)
    try:
        yield env
    finally:
        env.cleanup()
        if not _keep():
            shutil.rmtree(env.root, ignore_errors=True)


@pytest.fixture
def ct(request: pytest.FixtureRequest, sshd: SshServer, fake_proxmox: FakeProxmox, tmp_path: Path) -> Iterator[Any]:
    """CT 200 (running, 8 GPUs) on the bench sshd, as the test module drives it: the module's `Ct` (else
    bench.cli.CtCli), built by `make_ct(sshd, fake_proxmox, tmp_path)` of the module that defines that class
    when it has one (a generator when it must clean up), else with the module's SESSION, files in tmp_path."""
    cls = getattr(request.module, "Ct", CtCli)
    make = getattr(sys.modules[cls.__module__], "make_ct", None)
    if make is not None:
        made = make(sshd, fake_proxmox, tmp_path)
    else:
        made = cls(fake_proxmox, write_inventory(tmp_path / "inventory.yaml", sshd), tmp_path / "playbook.yaml",
                   session=request.module.SESSION)
    if inspect.isgenerator(made):
        yield from made
    else:
        yield made
