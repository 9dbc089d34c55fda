"""Hostile text in a playbook arrives literally on the target, through ssh + pct exec + bash -c.

Hypothesis writes arbitrary text (quotes, `$( )`, backticks, `;`, newlines, tabs, non-ASCII,
control characters, leading dashes) into an env value, the warmup and launch commands (as an
argument the command quotes for its shell, as a user would), the workdir (a directory of that
name) and a watch rule (re.escape of it, with the text printed into the log). Each example is one
real `gpuops launch` against one module-wide sshd and CT 200: the commands record what they got
(argv, env, cwd) into files, the rule must abort the run on that exact line, and a canary file
that any `$(touch ...)`, backtick or `; touch ...` would create must never appear.

Names a tool cannot take (tmux session names, a ctid, env names) are refused by `gpuops validate`
with FILE:LINE:COL and exit 2; a session name that validates is the tmux session's exact name.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest
from bench import FakeProxmox, SshServer, write_inventory
from bench.cli import CtCli, gpuops
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SESSION = "hostile"
# Records what a command got: its arguments, one env variable and its working directory (as bytes,
# hex-encoded, so any text compares exactly).
DUMP = """\
import json, os, sys
out = sys.argv[1]
data = {"argv": [os.fsencode(a).hex() for a in sys.argv[2:]], "env": os.environb.get(b"HOSTILE", b"").hex(),
        "cwd": os.fsencode(os.getcwd()).hex(), "gpu": os.environ.get("GPUOPS_GPU")}
with open(out, "w") as fh:
    json.dump(data, fh)
"""


class World(CtCli):
    """One sshd and CT 200 for the whole module (hypothesis runs many examples on it)."""

    def __init__(self, sshd: SshServer, fake: FakeProxmox, tmp: Path) -> None:
        super().__init__(fake, write_inventory(tmp / "inventory.yaml", sshd), tmp / "playbook.yaml", session=SESSION)
        self.sshd = sshd
        self.dump = self.fake.home(200) / "dump.py"
        self.dump.write_text(DUMP)
        self.canary = self.fake.root / "canary"  # an absolute path without spaces, seen by host and container

    def recorded(self, name: str) -> dict[str, Any]:
        data = json.loads((self.fake.home(200) / f"{name}.json").read_text())
        return {"argv": [bytes.fromhex(a).decode() for a in data["argv"]], "env": bytes.fromhex(data["env"]).decode(),
                "cwd": bytes.fromhex(data["cwd"]).decode(), "gpu": data["gpu"]}

    def forget(self) -> None:
        for name in ("warmup", "train"):
            (self.fake.home(200) / f"{name}.json").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    sshd = SshServer()
    sshd.start()
    fake = FakeProxmox(sshd.fake_root)
    fake.add_container(200)
    try:
        yield World(sshd, fake, tmp_path_factory.mktemp("hostile"))
    finally:
        sshd.stop()
        fake.cleanup()
        shutil.rmtree(sshd.fake_root, ignore_errors=True)


# -- hostile text ---------------------------------------------------------------------------------
def _pieces(canary: str) -> list[str]:
    return [
        "'", '"', "\\", "$", "`", ";", "&", "|", "\n", "\t", " ", "*", "?", "~", "!", "#", "=", "%", "%s", "{", "}",
        "(", ")", "<", ">", "-", "--", "-e", "-rf /", "--help", "$HOME", "${PATH}", "$1", "$@", "!!", "\\n", "'\\''",
        f"$(touch {canary})", f"`touch {canary}`", f"; touch {canary};", f"&& touch {canary}", f"| touch {canary}",
        f"\ntouch {canary}\n", f"'$(touch {canary})'", f'"`touch {canary}`"', f"'; touch {canary}; '",
        "é", "日本語", "🙂", "\u00a0", "\u2028", "\u0085", "\x01", "\x7f", "\x1b[31m", "\r", "\x0b",
    ]


def hostile(canary: str) -> st.SearchStrategy[str]:
    free = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=4)
    return st.lists(st.one_of(st.sampled_from(_pieces(canary)), free), min_size=1, max_size=7).map("".join)


def dir_name(text: str) -> str:
    """A single directory name holding as much of the text as a path component can."""
    name = text.replace("/", "_")
    if name.strip() in ("", ".", "..", "~"):
        name = "d" + name
    while len(name.encode()) > 200:
        name = name[:-1]
    return name


def line_text(text: str) -> str:
    """The text as one log line: no line ends (\\n, \\r) and no escape sequences (colours are stripped)."""
    return re.sub(r"[\n\r\x1b]", "", text)


def braces(command: str) -> str:
    """A warmup command's literal braces are doubled ({gpu} is the only placeholder)."""
    return command.replace("{", "{{").replace("}", "}}")


EXAMPLES = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])


@EXAMPLES
@given(data=st.data())
def test_hostile_text_arrives_literally_and_runs_nothing(world: World, data: st.DataObject) -> None:
    text = data.draw(hostile(str(world.canary)), label="text")
    workdir = dir_name(text)
    line = "MARK<" + line_text(text) + ">"
    (world.fake.home(200) / workdir).mkdir()
    world.forget()
    py, dump = "python3", shlex.quote(str(world.dump))
    home = world.fake.home(200)
    try:
        world.write({
            "name": "hostile",
            "workdir": workdir,
            "env": {"HOSTILE": text},
            "preflight": {"gpus": [5]},
            "warmup": {"gpus": [5], "command": braces(f"{py} {dump} {home}/warmup.json {shlex.quote(text)}")},
            "launch": {"session": SESSION,
                       "command": f"{py} {dump} {home}/train.json {shlex.quote(text)}; printf '%s\\n' {shlex.quote(line)}"},
            "watch": {"builtin": False, "stall_timeout": 60,
                      "rules": [{"name": "hostile", "pattern": re.escape(line), "action": "abort"}]},
            "abort": {"grace": 2},
        })
        result = world.gpuops("launch", "--json", timeout=120)
        assert result.code == 7, result
        summary = result.events()[-1]
        assert (summary["outcome"], summary["rule"], summary["line"]) == ("aborted", "hostile", line), summary
        cwd = str(home / workdir)
        for name, gpu in (("warmup", "5"), ("train", None)):
            assert world.recorded(name) == {"argv": [text], "env": text, "cwd": cwd, "gpu": gpu}, name
        assert not world.canary.exists(), "a hostile string was executed"
    finally:
        shutil.rmtree(world.fake.home(200) / workdir, ignore_errors=True)
        world.canary.unlink(missing_ok=True)


SESSION_PIECES = ["a", "Z", "0", "-", "_", ":", ".", "/", "\\", "#", "#{", "$", "'", '"', "=", "%", ",", ";", "*",
                  "[", "]", "~", "!", "@", " ", "\t", "é", "\u2028", "\x01", "$(touch x)", "`id`"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(session=st.lists(st.sampled_from(SESSION_PIECES), min_size=1, max_size=6).map("".join))
def test_a_session_name_is_refused_at_validation_or_is_the_sessions_exact_name(world: World, session: str) -> None:
    path = world.write({"name": "hostile-session", "launch": {"session": session, "command": "sleep 600"}},
                       world.playbook.with_name("session.yaml"))
    checked = gpuops("validate", "-i", str(world.inventory), "-p", str(path), timeout=60)
    assert checked.code in (0, 2) and "Traceback" not in checked.err, checked
    if checked.code == 2:
        assert re.search(rf"{re.escape(str(path))}:\d+:\d+: invalid tmux session name .*: \S", checked.err), checked
        return
    started = world.gpuops("launch", "--detach", playbook=path, timeout=60)
    assert started.code == 0, started
    sessions = world.fake.tmux(200, "list-sessions", "-F", "#{session_name}").stdout.splitlines()
    assert session in sessions, sessions
    stopped = world.gpuops("stop", playbook=path, timeout=60)
    assert stopped.code == 0 and f"run {world.state.joinpath('sessions', session).read_text().strip()} stopped" in stopped.err, stopped
    assert session not in world.fake.tmux(200, "list-sessions", "-F", "#{session_name}").stdout.splitlines()


# -- names a tool cannot take -------------------------------------------------------------------
INVENTORY_OK = "hosts:\n  pve1: {address: 127.0.0.1}\ntargets:\n  ct200: {host: pve1, ctid: 200}\n"


@pytest.mark.parametrize(
    ("kind", "text", "where", "words"),
    [
        ("playbook", "launch: {session: 'train:1', command: c}\n", "1:19",
         "invalid tmux session name 'train:1': tmux reads ':' and '.' as window and pane separators"),
        ("playbook", "launch: {session: train.v2, command: c}\n", "1:19",
         "invalid tmux session name 'train.v2': tmux reads ':' and '.'"),
        ("playbook", "launch: {session: 'a#{pane_id}', command: c}\n", "1:19", "it cannot contain '#'"),
        ("playbook", "launch: {session: 'a/b', command: c}\n", "1:19", "it cannot contain '/'"),
        ("playbook", "launch: {session: s, command: c}\nenv:\n  MY-VAR: x\n", "3:3",
         "expected an environment variable name (letters, digits and '_', not starting with a digit), got 'MY-VAR'"),
        ("playbook", "launch: {session: s, command: c}\nenv:\n  A: x\nsecrets: [HF-TOKEN]\n", "4:11",
         "expected an environment variable name"),
        ("inventory", "hosts:\n  pve1: {address: 127.0.0.1}\ntargets:\n  ct200: {host: pve1, ctid: abc}\n", "4:29",
         "expected a container id (an integer 100..999999999), got 'abc'"),
        ("inventory", "hosts:\n  pve1: {address: 127.0.0.1}\ntargets:\n  ct200: {host: pve1, ctid: '200; reboot'}\n", "4:29",
         "expected a container id"),
    ],
    ids=["session-colon", "session-dot", "session-hash", "session-slash", "env-dash", "secret-dash", "ctid-word",
         "ctid-injection"],
)
def test_names_a_tool_cannot_take_are_refused_by_validate(tmp_path: Path, kind: str, text: str, where: str,
                                                         words: str) -> None:
    inventory, playbook = tmp_path / "inventory.yaml", tmp_path / "playbook.yaml"
    inventory.write_text(INVENTORY_OK)
    playbook.write_text("launch: {session: s, command: c}\n")
    (inventory if kind == "inventory" else playbook).write_text(text)
    result = gpuops("validate", "-i", str(inventory), "-p", str(playbook), timeout=60)
    assert result.code == 2, result
    bad = inventory if kind == "inventory" else playbook
    assert result.err.startswith(f"gpuops: error: {bad}:{where}: "), result
    assert words in result.err, result
    assert "Traceback" not in result.err and result.out == b""
