"""A new notification channel kind is two code files: its sender's module and its entry in the list
(gpuops/agent/wire/channel_list.py), as docs/architecture.md's recipe says.

On a copy of the package, a toy kind is added exactly that way (a module under agent/notify/ and one entry
in CHANNELS, nothing else), and gpuops run from the copy validates its keys (a bad value: exit 2 at its
line), sends the channel in watch.json with its kind named, has the watchdog's sender deliver a run's
notification through it on the bench (real sshd, the fake CT's tmux: the line reaches the toy's file),
tries it with notify-test and names the kind in `gpuops schema`. And a watch.json an older gpuops wrote,
whose channels name no kind, still reads into typed channels.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench import wait_until
from bench.cli import CtCli
from test_detector_list import REPO, toy

SESSION = "toych"
GPUS = (5,)

TOY_MODULE = '''"""The `toyfile` channel kind (a test's): each notification's line appended to a file on the target."""

from __future__ import annotations

from typing import Any, Dict

from . import deliver


class Sender(deliver.Sender):
    """One try: the tag, what happened and the line, appended."""

    def send(self, payload: Dict[str, Any], attempt: deliver.Try) -> deliver.Answer:
        with open(self.settings.toyfile, "a", encoding="utf-8") as fh:
            fh.write("%s %s %s\\n" % (self.settings.tag, payload["what"], payload["text"]))
        return {"ok": True}
'''

TOY_ENTRY = '''    ChannelSpec(
        "toyfile", "toyfile", what="a file on the target", doc="each line appended to a file",
        keys=(
            Key("toyfile", "text", doc="the file", what="a file on the target"),
            Key("tag", "choice", "note", "the line's first word", choices=("note", "alert"), what="a tag"),
        )),
'''


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the gpuops package with the toy kind added as the recipe says: two code files."""
    root = tmp_path_factory.mktemp("toych")
    shutil.copytree(REPO / "gpuops", root / "gpuops", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "gpuops" / "agent" / "notify" / "toyfile.py").write_text(TOY_MODULE)
    the_list = root / "gpuops" / "agent" / "wire" / "channel_list.py"
    text, added = re.subn(r"(\nCHANNELS: .*?\n)(\)\n)", lambda m: m.group(1) + TOY_ENTRY + m.group(2),
                          the_list.read_text(), count=1, flags=re.S)
    assert added == 1, "CHANNELS' closing parenthesis not found"
    the_list.write_text(text)
    return root


def test_a_toy_channel_kind_added_as_one_module_and_one_entry_is_validated_sent_delivered_and_in_the_schema(
        ct: CtCli, toy_package: Path, tmp_path: Path) -> None:
    notes = tmp_path / "toy-notes"
    data = {"name": "toych", "preflight": {"gpus": list(GPUS)},
            "launch": {"session": SESSION, "command": "fake-train --mode steps --steps 3 --interval 0.1"},
            "watch": {"stall_timeout": 60},
            "notify": [{"on": ["ended"], "toyfile": str(notes), "tag": "urgent"}]}
    bad = ct.write(data)
    result = toy(toy_package, "validate", "-p", str(bad))
    assert result.returncode == 2, result
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if "urgent" in text)
    said = rf"{re.escape(str(bad))}:{line}:\d+: expected a tag: note \| alert, got 'urgent'"
    assert re.search(said, result.stderr), result.stderr
    assert "Traceback" not in result.stderr

    ct.write({**data, "notify": [{"on": ["ended"], "toyfile": str(notes), "tag": "alert"}]})
    result = toy(toy_package, *ct.args("launch", "--json"))
    assert result.returncode == 0, result.stderr
    run_id = ct.run_id()
    sent = json.loads((ct.run_dir() / "watch.json").read_text())
    assert sent["notify"] == [{"kind": "toyfile", "on": ["ended"], "toyfile": str(notes), "tag": "alert"}]
    # The watchdog's detached sender delivers `ended` through the toy's class, found by its kind's name.
    wait_until(lambda: notes.exists() and "ended" in notes.read_text(), timeout=30, message="the toy's notification")
    tag, what, said = notes.read_text().splitlines()[0].split(" ", 2)
    assert (tag, what) == ("alert", "ended") and "SUCCEEDED" in said and run_id in said
    wait_until(lambda: any(json.loads(x).get("via") == "toyfile" for x in (ct.run_dir() / "events.jsonl").read_text()
                           .splitlines() if '"notify_sent"' in x), timeout=30, message="the toy's notify_sent event")

    tried = toy(toy_package, *ct.args("notify-test"))
    assert tried.returncode == 0, tried
    assert "notified (test) through toyfile channel 1: taken" in tried.stderr, tried.stderr
    assert notes.read_text().splitlines()[-1].startswith("alert test gpuops: test notification")

    schema = json.loads(toy(toy_package, "schema").stdout)
    assert "toyfile" in schema["$defs"]["notify_sent"]["properties"]["via"]["enum"]
    # and the package as shipped knows no toy: the list is the only place that named it
    shipped = json.loads(subprocess.run([sys.executable, "-m", "gpuops", "schema"], cwd=REPO, capture_output=True,
                                        text=True, timeout=180).stdout)
    assert shipped["$defs"]["notify_sent"]["properties"]["via"]["enum"] == ["webhook", "command"]


def test_an_older_gpuops_watch_json_reads_its_channels_with_their_kinds_named() -> None:
    """A run launched before channels named their kind is still notified after an upgrade: each of its
    watch.json's channels (every key of both kinds, the other's null) reads as its kind, typed, and is written
    back with `kind` and its own keys only."""
    from gpuops.agent.wire import watchfile

    old = {"notify": [
        {"on": ["aborted", "ended"], "webhook": "https://hooks.example.org/T0/s3cr3t", "secret": True,
         "format": "slack", "command": None},
        {"on": ["ended"], "webhook": None, "secret": False, "format": "json", "command": "echo ended"}]}
    hook, command = watchfile.parse(old).notify
    assert (hook.kind, hook.on, hook.settings.webhook, hook.settings.format, hook.settings.secret) == (
        "webhook", ("aborted", "ended"), "https://hooks.example.org/T0/s3cr3t", "slack", True)
    assert (command.kind, command.on, command.settings.command) == ("command", ("ended",), "echo ended")
    assert hook.shown == "webhook ***" and "s3cr3t" not in repr(hook)
    assert [watchfile.channel_record(c) for c in (hook, command)] == [
        {"kind": "webhook", "on": ["aborted", "ended"], "webhook": "https://hooks.example.org/T0/s3cr3t",
         "format": "slack", "secret": True},
        {"kind": "command", "on": ["ended"], "command": "echo ended"}]
