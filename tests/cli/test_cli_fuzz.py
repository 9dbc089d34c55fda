"""CLI-level fuzz: random mutations of the shipped YAML files, fed to `gpuops validate` and `launch --dry-run`.

As a user meets them: `python -m gpuops` as a subprocess. Whatever the mutation, gpuops exits 2 with
one clear message on stderr (or 0 when the file is still valid), never a Python traceback, never
exit 1 (a bug), and never hangs (each command runs under a timeout). The dry run connects to
nothing, so the real lab's inventory (10.1.2.6) is safe to use.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from pathlib import Path

import pytest
from bench.cli import Cli, gpuops
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
PAIRS = [
    (REPO / "inventories" / "example.yaml", REPO / "playbooks" / "dflash.yaml"),
    (REPO / "inventories" / "local.yaml", REPO / "playbooks" / "demo.yaml"),
    (REPO / "inventories" / "local.yaml", REPO / "tests" / "data" / "playbooks" / "every-key.yaml"),
]
EVERY_KEY = PAIRS[2][1]
TOKEN = {"GPUOPS_EVERY_KEY_TOKEN": "hf_fuzz_token"}  # every-key.yaml reads it with from_env
# Bits of YAML syntax and values a slip of the keyboard (or a bad merge) puts into a file.
JUNK = [
    ":", ": ", "- ", "-", "{", "}", "[", "]", ",", "&a ", "*a", "<<: *a", "!!python/object:os.system ", "!!binary ",
    "!!int ", "!!str ", "? ", "|", ">", "'", '"', "#", "%YAML 1.1\n", "---\n", "...\n", "\t", "  ", "\n", "\n  ",
    "\n    - ", "~", "null", "true", "yes", "-1", "0", "1e9999", "0x1F", ".nan", "99999999999999999999", "[]", "{}",
    "[1, 2", "a: b: c", "\\", "\ufeff", "\u2028", "\x85", "\x07", "\x00", "é", "🙂", "\r", "\r\n", "=", "@", "`",
    "{{gpu}}", "{gpu", "{nope}", "(?P<", "*+", "$(touch /tmp/gpuops-fuzz-canary)",
    ".inf", "-.inf", ".NaN", "1e999", "-1e999", "nan", "inf", "-inf", "auto", "off", "false", "last", "(\\d+)+x",
]
BYTES = [b"\xff\xfe", b"\xc3(", b"\xe2\x82", b"\x80"]
CLI_TIMEOUT = 60.0  # a hang fails the example instead of blocking the run


@st.composite
def mutated(draw: st.DrawFn, original: bytes) -> bytes:
    """Apply 1-3 random edits to a file's bytes."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["insert", "delete", "replace", "duplicate-line", "swap-lines", "indent", "truncate",
                                     "bytes"]))
        lines = bytes(data).split(b"\n")
        at = draw(st.integers(0, len(data)))
        if kind == "insert":
            data[at:at] = draw(st.sampled_from(JUNK)).encode()
        elif kind == "bytes":
            data[at:at] = draw(st.sampled_from(BYTES))
        elif kind == "delete":
            data[at : at + draw(st.integers(1, 40))] = b""
        elif kind == "replace":
            # A value after `key: ` becomes something else.
            spots = [m.end() for m in re.finditer(rb": ", data)]
            if spots:
                spot = draw(st.sampled_from(spots))
                end = data.find(b"\n", spot)
                end = len(data) if end < 0 else end
                data[spot:end] = draw(st.sampled_from(JUNK + ["-5", "0", "3.5", "[5, 5]", "{a: 1}", "''"])).encode()
        elif kind == "duplicate-line":
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(i, lines[i])
            data = bytearray(b"\n".join(lines))
        elif kind == "swap-lines":
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            data = bytearray(b"\n".join(lines))
        elif kind == "indent":
            i = draw(st.integers(0, len(lines) - 1))
            lines[i] = draw(st.sampled_from([b"", b" ", b"  ", b"   ", b"\t"])) + lines[i].lstrip(b" ")
            data = bytearray(b"\n".join(lines))
        else:
            data = data[:at]
    return bytes(data)


def check(result: Cli, files: list[Path]) -> None:
    """Exit 0, or exit 2 with one clear message on stderr; never a traceback."""
    said = result.text + result.err
    assert "Traceback" not in said and "internal error" not in said, result
    assert result.code in (0, 2), result
    if result.code == 2:
        first = result.err.splitlines()[0] if result.err else ""
        assert first.startswith("gpuops: error: "), result  # one style, click's usage errors too
        where = re.match(r"gpuops: error: (.+?):(\d+):(\d+): \S", first)
        if where:
            # FILE:LINE:COL names one of the files and a line inside it (or just past its end).
            path = Path(where.group(1))
            assert path in files, result
            assert 1 <= int(where.group(2)) <= path.read_bytes().count(b"\n") + 2, result


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_shipped_files_give_a_clear_message_or_pass(data: st.DataObject) -> None:
    inventory_src, playbook_src = data.draw(st.sampled_from(PAIRS), label="files")
    which = data.draw(st.sampled_from(["inventory", "playbook", "both"]), label="mutate")
    with tempfile.TemporaryDirectory(prefix="gpuops-fuzz-") as tmp:
        inventory, playbook = Path(tmp) / inventory_src.name, Path(tmp) / playbook_src.name
        inventory.write_bytes(data.draw(mutated(inventory_src.read_bytes()), label="inventory")
                              if which != "playbook" else inventory_src.read_bytes())
        playbook.write_bytes(data.draw(mutated(playbook_src.read_bytes()), label="playbook")
                             if which != "inventory" else playbook_src.read_bytes())
        env = {"HOME": tmp, **TOKEN}  # no ~/.ssh/config of the developer's in the way
        validated = gpuops("validate", "-i", str(inventory), "-p", str(playbook), timeout=CLI_TIMEOUT, env=env)
        check(validated, [inventory, playbook])
        event(f"validate exit {validated.code}")
        if validated.code == 0:
            assert validated.text.startswith("ok: "), validated
        planned = gpuops("launch", "--dry-run", "-i", str(inventory), "-p", str(playbook), timeout=CLI_TIMEOUT, env=env)
        check(planned, [inventory, playbook])
        if validated.code == 2:
            assert planned.code == 2, planned  # a file validate refuses is never run
        if planned.code == 0:
            assert planned.text.startswith("# gpuops launch --dry-run: target "), planned
    assert not Path("/tmp/gpuops-fuzz-canary").exists()


def test_the_shipped_files_are_valid_and_dry_run() -> None:
    for inventory, playbook in PAIRS:
        validated = gpuops("validate", "-i", str(inventory), "-p", str(playbook), timeout=CLI_TIMEOUT, env=TOKEN)
        assert validated.code == 0, validated
        planned = gpuops("launch", "--dry-run", "-i", str(inventory), "-p", str(playbook), timeout=CLI_TIMEOUT,
                         env=TOKEN)
        assert planned.code == 0 and planned.text.startswith("# gpuops launch --dry-run: target "), planned


# --- numbers that are not a usable number of seconds ------------------------------------------

LOCAL_PAIR = PAIRS[1]
NOT_SECONDS = ["nan", "inf", "-inf", "1e999", "0", "-1"]
SECONDS_OPTIONS = [("launch", "--dry-run", "--timeout"), ("logs", "-f", "--timeout"), ("status", "--watch")]
# `status --watch` takes an optional value: click reads `--watch=-inf` as --watch (2 s) then `-i nf`.
SECONDS_CASES = [(c, v) for c in SECONDS_OPTIONS for v in NOT_SECONDS if (c[-1], v) != ("--watch", "-inf")]


@pytest.mark.parametrize(("command", "value"), SECONDS_CASES)
def test_seconds_options_refuse_non_finite_and_non_positive_numbers(command: tuple[str, ...], value: str) -> None:
    *words, option = command
    inventory, playbook = LOCAL_PAIR
    result = gpuops(*words, f"{option}={value}", "-i", str(inventory), "-p", str(playbook), timeout=CLI_TIMEOUT)
    check(result, [])
    assert result.code == 2, result
    if option == "--watch" and value.startswith("-"):  # the same click rule: "-1" is read as an option
        assert f"gpuops: error: No such option '{value}'" in result.err, result
    else:
        assert f"Invalid value for '{option}': '{value}' is not a positive, finite number of seconds" in result.err, result


# --- non-finite numbers in the YAML: every number of every key, refused where it is written --------

NOT_FINITE = [".nan", ".inf", "-.inf", "1e999", "nan", "-inf"]
NUMBER = re.compile(r"(?<=: )-?[0-9]+(?:\.[0-9]+)?(?=[,}\s])")  # 10.1.2.6 is an address, not a number


def _number_spots(path: Path) -> list[tuple[int, int]]:
    """(line, column) of each number written as a key's value in a file."""
    lines = path.read_text().split("\n")
    return [(n + 1, m.start() + 1) for n, line in enumerate(lines) for m in NUMBER.finditer(line + "\n")]


@pytest.mark.parametrize(("flag", "original", "count"), [("-p", EVERY_KEY, 19), ("-i", PAIRS[0][0], 2)])
def test_every_number_of_every_key_refuses_non_finite_values(tmp_path: Path, flag: str, original: Path,
                                                             count: int) -> None:
    spots = _number_spots(original)
    assert len(spots) == count, spots  # every numeric key the file sets
    lines = original.read_text().split("\n")
    for i, (line, column) in enumerate(spots):
        value = NOT_FINITE[i % len(NOT_FINITE)]
        text = lines[line - 1]
        number = re.compile(r"-?[0-9.]+").match(text, column - 1)
        assert number is not None
        changed = tmp_path / original.name
        changed.write_text("\n".join([*lines[: line - 1], text[: column - 1] + value + text[number.end() :],
                                       *lines[line:]]))
        result = gpuops("validate", flag, str(changed), timeout=CLI_TIMEOUT, env=TOKEN)
        check(result, [changed])
        assert result.code == 2, (value, text, result)
        assert result.err.startswith(f"gpuops: error: {changed}:{line}:{column}: expected "), (value, text, result)


# --- special files for -i and -p ----------------------------------------------------------------


def _fifo(path: Path, data: bytes) -> threading.Thread:
    """A named pipe that a thread fills with data once gpuops opens it."""
    os.mkfifo(path)

    def feed() -> None:
        try:
            with open(path, "wb") as pipe:
                pipe.write(data)
        except BrokenPipeError:  # gpuops stopped reading: it has seen enough
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    return writer


def _release(path: Path, writer: threading.Thread) -> None:
    """Unblock a writer that nobody read from (its open waits for a reader)."""
    if writer.is_alive():
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        os.close(fd)
    writer.join(10)


SPECIAL = {
    "/dev/zero": (2, "gpuops: error: /dev/zero: larger than 1 MiB; "),
    "/dev/urandom": (2, "gpuops: error: /dev/urandom: larger than 1 MiB; "),
    "/dev/null": (2, "gpuops: error: /dev/null:1:1: the file is empty; expected "),
    "directory": (2, "gpuops: error: {path}: is a directory, expected a YAML file"),
    "fifo": (0, "ok: "),
    "fifo-2mib": (2, "gpuops: error: {path}: larger than 1 MiB; "),
}


@pytest.mark.parametrize("special", sorted(SPECIAL))
@pytest.mark.parametrize("flag", ["-i", "-p"])
@pytest.mark.parametrize("command", [("validate",), ("launch", "--dry-run")])
def test_special_files_give_a_clear_message(tmp_path: Path, command: tuple[str, ...], flag: str, special: str) -> None:
    inventory, playbook = LOCAL_PAIR
    own = inventory if flag == "-i" else playbook
    path, writer = Path(special), None
    if special == "directory":
        path = tmp_path / "a-folder.yaml"
        path.mkdir()
    elif special.startswith("fifo"):
        path = tmp_path / "pipe.yaml"
        writer = _fifo(path, own.read_bytes() if special == "fifo" else b"# " + b"x" * (2 << 20))
    files = {"-i": str(path if flag == "-i" else inventory), "-p": str(path if flag == "-p" else playbook)}
    try:
        result = gpuops(*command, "-i", files["-i"], "-p", files["-p"], timeout=CLI_TIMEOUT)
    finally:
        if writer is not None:
            _release(path, writer)
    check(result, [path])
    code, first = SPECIAL[special]
    if special == "directory" and flag == "-i":  # a directory is an Ansible inventory directory: this one is empty
        first = "gpuops: error: {path}: is a directory with no inventory file in it"
    said = result.err if code else result.text
    if code == 0 and command != ("validate",):
        first = "# gpuops launch --dry-run: target "
    assert result.code == code and said.startswith(first.format(path=path)), result
