"""A new quiet-failure detector is two code files: its judging module and its entry in the list
(gpuops/agent/wire/detector_list.py), as docs/architecture.md's recipe says.

On a copy of the package, a toy detector is added exactly that way (a module under agent/detect/ and one
entry in DETECTORS, nothing else), and gpuops run from the copy validates its keys (a bad value: exit 2
at its line), sends it in watch.json, judges it in the watchdog on the bench (real sshd, the fake CT's
tmux: its rule comes back as a `match` event) and names its rule in `gpuops schema`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench.cli import CtCli

REPO = Path(__file__).resolve().parents[2]
SESSION = "toy"
GPUS = (5,)

TOY_MODULE = '''"""toy-loss-high (watch.toy_loss): the loss the log prints went above a limit (a test's detector)."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from . import judge
from .judge import Finding

LOSS = "toy-loss"


class Detector(judge.Detector):
    """The highest loss figure above the limit, reported once."""

    def __init__(self, settings: Any, run: judge.Run) -> None:
        super().__init__(settings, run)
        self.worst: Optional[float] = None
        self.said = False

    @classmethod
    def metrics(cls, settings: Any) -> Sequence[Tuple[str, str]]:
        return ((LOSS, settings.pattern),)

    def measure(self, t: float, name: str, value: str) -> None:
        if name == LOSS and float(value) > self.settings.above:
            self.worst = max(float(value), self.worst or 0.0)

    def judge(self, t: float) -> List[Finding]:
        if self.worst is None or self.said:
            return []
        self.said = True
        return [Finding("toy-loss-high", self.settings.action, "loss %g is above %g" % (self.worst, self.settings.above),
                        "lower the learning rate", {"measured": self.worst, "above": self.settings.above, "gpu": None})]
'''

TOY_ENTRY = '''    DetectorSpec(
        "toy_loss", "toy_loss", ("toy-loss-high",), doc="the loss went above a limit",
        keys=(
            Key("pattern", "pattern", r"loss ([0-9.]+)", "where the loss is", what="a Python regular expression",
                groups=1, no_group="put the loss in parentheses"),
            Key("above", "number", 10.0, "the limit", what="a loss", above=0),
            Key("action", "action", "warn", "what a loss above it does"),
        )),
'''


@pytest.fixture(scope="module")
def toy_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the gpuops package with the toy detector added as the recipe says: two code files."""
    root = tmp_path_factory.mktemp("toy")
    shutil.copytree(REPO / "gpuops", root / "gpuops", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "gpuops" / "agent" / "detect" / "toy_loss.py").write_text(TOY_MODULE)
    the_list = root / "gpuops" / "agent" / "wire" / "detector_list.py"
    text, added = re.subn(r"(\nDETECTORS: .*?\n)(\)\n)", lambda m: m.group(1) + TOY_ENTRY + m.group(2),
                          the_list.read_text(), count=1, flags=re.S)
    assert added == 1, "DETECTORS' closing parenthesis not found"
    the_list.write_text(text)
    return root


def toy(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """gpuops from the copy (its folder first on the path; run from there, not from the repo)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPS_") or k.startswith("GPUOPS_FAKE")}
    env["PYTHONPATH"] = str(root)
    return subprocess.run([sys.executable, "-m", "gpuops", *args], cwd=root, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=180)


def test_a_toy_detector_added_as_one_module_and_one_entry_is_validated_sent_judged_and_in_the_schema(
        ct: CtCli, toy_package: Path) -> None:
    data = {"name": "toy", "preflight": {"gpus": list(GPUS)},
            "launch": {"session": SESSION, "command": "fake-train --mode steps --steps 40 --interval 0.1"},
            "watch": {"stall_timeout": 60, "sample_interval": 0.5, "toy_loss": {"above": -1}},
            "restart": {"max": 1, "on": ["toy-loss-high"]}}
    bad = ct.write(data)
    result = toy(toy_package, "validate", "-p", str(bad))
    assert result.returncode == 2, result
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if "above" in text)
    assert re.search(rf"{re.escape(str(bad))}:{line}:\d+: expected a loss > 0, got -1", result.stderr), result.stderr
    assert "Traceback" not in result.stderr

    ct.write({**data, "watch": {**data["watch"], "toy_loss": {"above": 2}}})  # step 1's loss is ~3.0
    result = toy(toy_package, *ct.args("launch", "--json"))
    assert result.returncode == 0, result.stderr
    sent = json.loads((ct.run_dir() / "watch.json").read_text())
    assert sent["toy_loss"] == {"pattern": r"loss ([0-9.]+)", "above": 2.0, "action": "warn"}
    events = [json.loads(text) for text in result.stdout.splitlines()]
    (match,) = [e for e in events if e["event"] == "match" and e["rule"] == "toy-loss-high"]
    assert (match["action"], match["by"]) == ("warn", "watchdog") and match["figures"]["measured"] > 2

    schema = json.loads(toy(toy_package, "schema").stdout)
    assert "toy-loss-high" in schema["$defs"]["detector_rule"]["enum"]
    # and the package as shipped knows no toy: the list is the only place that named it
    assert "toy-loss-high" not in subprocess.run([sys.executable, "-m", "gpuops", "schema"], cwd=REPO,
                                                 capture_output=True, text=True, timeout=180).stdout
