"""Random damage to the shipped YAML files: every variant loads or fails with one FILE:LINE:COL message."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.config import load_inventory, load_playbook, resolve_target
from gpuops.errors import ConfigError, UsageError

ROOT = Path(__file__).resolve().parents[2]
INVENTORIES = ["inventories/example.yaml", "inventories/local.yaml"]
PLAYBOOKS = ["playbooks/dflash.yaml", "playbooks/demo.yaml", "tests/data/playbooks/every-key.yaml"]
INVENTORY_OF = {PLAYBOOKS[0]: INVENTORIES[0], PLAYBOOKS[1]: INVENTORIES[1], PLAYBOOKS[2]: INVENTORIES[1]}
SHIPPED = {name: (ROOT / name).read_bytes() for name in INVENTORIES + PLAYBOOKS}
ENVIRON = {"GPUOPS_EVERY_KEY_TOKEN": "hf_fuzz_token"}  # every-key.yaml reads it with from_env

TOKENS = [
    ":", ": ", "-", "- ", "[", "]", "{", "}", ",", "\t", "'", '"', "\\", "#", "?", "|", ">", "%", "@", "`",
    "&a ", "*a", "!!str ", "!!int ", "!foo ", "!!python/object:os.system ", "<<: *a", "\n", "\n  ", "\n- ",
    "  ", "~", "null", "yes", "on", "1e999", ".nan", "-1", "0", "99999999999999999999999", "{gpu}", "{x}",
    "{{", "}}", "é", "😀", "\u2028", "\x85", "\ufeff", "\r", "---\n", "...\n", "$(reboot)", ";",
    ".inf", "-.inf", "1e-999", "nan", "inf", "auto", "off", "last", "false", "(\\d+)+", "([0-9.]+)",
]
BYTES = [b"\x00", b"\x07", b"\xff", b"\xc3", b"\xed\xa0\x80"]  # NUL, BEL, non-UTF-8, cut sequence, surrogate

token = st.one_of(
    st.sampled_from(TOKENS).map(lambda t: t.encode()),
    st.sampled_from(BYTES),
    st.text(max_size=4).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
mutation = st.tuples(
    st.sampled_from(["delete", "duplicate", "swap", "insert", "replace", "truncate", "line-dup", "line-drop"]),
    st.floats(0, 1),
    st.integers(1, 8),
    token,
)


def mutate(data: bytes, op: str, where: float, size: int, tok: bytes) -> bytes:
    """One random edit, at a relative position so it stays valid as the file shrinks or grows."""
    i = int(where * len(data))
    if op == "delete":
        return data[:i] + data[i + size :]
    if op == "duplicate":
        return data[: i + size] + data[i:]
    if op == "swap" and i + 1 < len(data):
        return data[:i] + data[i + 1 : i + 2] + data[i : i + 1] + data[i + 2 :]
    if op == "insert":
        return data[:i] + tok + data[i:]
    if op == "replace":
        return data[:i] + tok + data[i + size :]
    if op == "truncate":
        return data[:i]
    lines = data.split(b"\n")
    n = int(where * len(lines)) % len(lines)
    if op == "line-dup":
        return b"\n".join(lines[: n + 1] + lines[n:])
    if op == "line-drop":
        return b"\n".join(lines[:n] + lines[n + 1 :])
    return data


def check(path: Path, data: bytes, load: Callable[[str], object]) -> object | None:
    """Load path; the only allowed failure is a ConfigError/UsageError with a FILE:LINE:COL message."""
    path.write_bytes(data)
    try:
        return load(str(path))
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message, message
        found = re.match(re.escape(str(path)) + r":(\d+):(\d+): \S", message)
        assert found, message
        breaks = sum(data.count(b) for b in (b"\n", b"\r", b"\xc2\x85", "\u2028".encode(), "\u2029".encode()))
        assert 1 <= int(found.group(1)) <= breaks + 2 and int(found.group(2)) >= 1, message
    except UsageError as exc:
        assert "\n" not in str(exc), str(exc)
    return None


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "mutant.yaml"


@pytest.mark.timeout(60)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(list(SHIPPED)), edits=st.lists(mutation, min_size=1, max_size=6))
def test_mutated_files_load_or_fail_cleanly(scratch: Path, name: str, edits: list) -> None:
    data = SHIPPED[name]
    for edit in edits:
        data = mutate(data, *edit)
    if name in INVENTORIES:
        inventory = check(scratch, data, load_inventory)
        if inventory is not None:
            playbook = load_playbook(str(ROOT / PLAYBOOKS[INVENTORIES.index(name)]), environ=ENVIRON)
            _resolve(inventory, playbook)
    else:
        playbook = check(scratch, data, lambda p: load_playbook(p, environ=ENVIRON))
        if playbook is not None:
            inventory = load_inventory(str(ROOT / INVENTORY_OF[name]))
            _resolve(inventory, playbook)


def _resolve(inventory, playbook) -> None:
    for name in (None, "ct200", "local", "nope"):
        try:
            resolve_target(inventory, playbook, name)
        except UsageError:  # ConfigError is a UsageError
            pass


@pytest.mark.timeout(60)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(list(SHIPPED)), edits=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_files_with_the_pure_python_parser(
    monkeypatch: pytest.MonkeyPatch, scratch: Path, name: str, edits: list
) -> None:
    import yaml

    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    data = SHIPPED[name]
    for edit in edits:
        data = mutate(data, *edit)
    check(scratch, data, load_inventory if name in INVENTORIES else lambda p: load_playbook(p, environ=ENVIRON))


HOSTILE = {
    "billion-laughs": "a: &a [x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    + "hosts: *i\n",
    "deep-flow": "hosts: " + "[" * 200_000,
    "deep-block": "hosts:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 500)),
    "deep-dashes": "hosts: " + "- " * 50_000 + "x\n",
    "recursive-anchor": "hosts: &h {a: *h, b: *h}\ntargets: &t [*t]\n",
    "huge-int": "hosts: {h: {}}\ntargets: {t: {host: h, ctid: " + "9" * 100_000 + "}}\n",
    "long-line": "hosts: {h: {address: " + "a" * 1_000_000 + "}}\n",
    "many-keys": "hosts:\n" + "".join(f"  h{i}: {{}}\n" for i in range(20_000)),
    "merge-chain": "hosts:\n  a: &a {user: u}\n" + "".join(f"  h{i}: &h{i} {{<<: *{'a' if i == 0 else f'h{i - 1}'}}}\n" for i in range(300)),
    "jump-chain": "hosts:\n" + "".join(f"  h{i}: {{jump: h{i + 1}}}\n" for i in range(20_000)) + "  h20000: {}\n",
    "long-gpu-list": "hosts: {h: {}}\ntargets: {t: {host: h, gpus: [" + ", ".join(map(str, range(100_000))) + "]}}\n",
    "merge-bomb": "hosts:\n  a0: &a0 {user: u}\n  b0: &b0 {port: 22}\n"
    + "".join(
        f"  a{i}: &a{i} {{<<: [*a{i - 1}, *b{i - 1}]}}\n  b{i}: &b{i} {{<<: [*b{i - 1}, *a{i - 1}]}}\n"
        for i in range(1, 60)
    ),
    "regex-bomb": "launch: {session: s, command: c}\nwatch:\n  rules:\n    - {name: x, pattern: '" + "(" * 300 + "a" + ")*" * 300 + "'}\n",
}


@pytest.mark.timeout(10)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_inputs_fail_fast(tmp_path: Path, name: str) -> None:
    path = tmp_path / "hostile.yaml"
    data = HOSTILE[name].encode()
    check(path, data, load_inventory)
    check(path, data, lambda p: load_playbook(p, environ={}))
