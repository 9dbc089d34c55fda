"""docs/ci/*.yml run as the CI systems run them: their shell steps, unchanged, with bash, against the bench.

GitHub Actions: the `run:` steps in order, each a fresh `bash --noprofile --norc -eo pipefail` with
the workflow/job/step env, GITHUB_ENV/GITHUB_PATH carried between steps and `if:` honoured.
GitLab CI: before_script + script in one shell, after_script in another, as the runner does. The
secrets come in as CI provides them (environment variables): the bench's client key, which the
pipeline loads into a real ssh-agent, and the bench's known_hosts line. Only `uses:` steps
(checkout, setup-python, upload-artifact) are not run: the test lays out the workspace instead and
checks that what upload-artifact / artifacts:paths name exists and holds the report.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench import FakeProxmox, SshServer, wait_until
from bench.inventory import host_entry
from test_junit import check_shape

REPO = Path(__file__).resolve().parent.parent
GITHUB = REPO / "docs" / "ci" / "github-actions.yml"
GITLAB = REPO / "docs" / "ci" / "gitlab-ci.yml"
STEP_TIMEOUT = 300
# What stands in for the CI machine's own settings: gpuops is the one installed here (pip finds it
# satisfied, and never goes to an index), and the tests' python comes first on PATH.
OVERRIDES = {"GPUOPS_PIP_SPEC": "gpuops", "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class Ran:
    """What a pipeline run left: each step's exit code, the workspace, the artifacts it names."""

    codes: dict[str, int]
    workspace: Path
    artifacts: list[Path]
    outputs: dict[str, str]
    agent_pid: int | None = None
    step_summary: str = ""
    junit: list[Path] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(self.codes.values())


@dataclass
class Bench:
    sshd: SshServer
    fake: FakeProxmox
    tmp: Path

    def workspace(self, command: str, *, policy: str = "strict") -> Path:
        """The checked-out repository: an inventory that names no key or known_hosts file, and a playbook."""
        ws = self.tmp / "workspace"
        (ws / "inventories").mkdir(parents=True, exist_ok=True)
        (ws / "playbooks").mkdir(exist_ok=True)
        host = {k: v for k, v in host_entry(self.sshd, policy=policy).items() if k not in ("identity_file", "known_hosts")}
        (ws / "inventories" / "lab.yaml").write_text(yaml.safe_dump(
            {"hosts": {"pve1": host}, "targets": {"ct200": {"host": "pve1", "ctid": 200, "gpus": list(range(8))}}}))
        (ws / "playbooks" / "train.yaml").write_text(yaml.safe_dump({
            "name": "ci-train", "preflight": {"gpus": [5, 6]},
            "warmup": {"gpus": [5], "command": "fake-warmup --gpu {gpu} --duration 0.2 --steps 2", "timeout": 60},
            "launch": {"session": "ci-train", "command": command},
            "watch": {"stall_timeout": 60}, "abort": {"grace": 3},
        }, sort_keys=False))  # fmt: skip
        return ws

    def secrets(self) -> dict[str, str]:
        return {"GPUOPS_SSH_KEY": self.sshd.client_key.read_text(), "GPUOPS_KNOWN_HOSTS": self.sshd.known_hosts_line()}

    def base_env(self) -> dict[str, str]:
        home = self.tmp / "home"
        home.mkdir(exist_ok=True)
        keep = ("LANG", "LC_ALL", "TERM", "USER", "LOGNAME", "TMPDIR")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        return {**env, "HOME": str(home), "CI": "true", "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"}

    def stop_run(self) -> None:
        """Detached runs: stop them with the key the tests hold (the pipeline's agent is gone)."""
        from bench.cli import CtCli
        from bench.inventory import write_inventory

        ct = CtCli(self.fake, write_inventory(self.tmp / "stop.yaml", self.sshd), self.tmp / "workspace/playbooks/train.yaml",
                   session="ci-train")
        assert ct.gpuops("stop").code == 0


@pytest.fixture
def bench(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> Bench:
    return Bench(sshd, fake_proxmox, tmp_path)


# -- GitHub Actions -------------------------------------------------------------------------------


def expression(text: str, ctx: dict[str, dict[str, str]]) -> str:
    """The `${{ ... }}` the example uses: secrets.X, inputs.X, 'literal', and `a || b`; anything else fails."""

    def one(found: re.Match[str]) -> str:
        for part in found.group(1).split("||"):
            part = part.strip()
            if re.fullmatch(r"'[^']*'", part):
                value = part[1:-1]
            else:
                scope, _, name = part.partition(".")
                assert scope in ctx and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name), f"keep it simple: ${{{{ {part} }}}}"
                value = ctx[scope].get(name, "")
            if value:
                return value
        return ""

    return _EXPR.sub(one, str(text))


def should_run(condition: str, failed: bool, cancelled: bool = False) -> bool:
    return {"always()": True, "success()": not (failed or cancelled), "failure()": failed and not cancelled,
            "cancelled()": cancelled}[condition]


def shell_step(script: Path, cwd: Path, env: dict[str, str], cancel: Any = None) -> tuple[int, str]:
    """A step's shell: run to its end, or cancelled once `cancel(cwd)` holds, as the runners cancel: `cancel.signals`,
    each followed by its wait (GitHub: Ctrl-C to the step's process, 7.5 s, SIGTERM, 2.5 s), then the process
    tree killed."""
    proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    if cancel is not None:
        wait_until(lambda: cancel(cwd) or proc.poll() is not None, timeout=STEP_TIMEOUT, message="the step to get going")
        for sig, wait in cancel.signals:
            if proc.poll() is None:
                os.kill(proc.pid, sig)
                try:
                    proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    pass
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
    out, _ = proc.communicate(timeout=STEP_TIMEOUT)
    return proc.returncode, out


def github_env_file(path: Path) -> dict[str, str]:
    """GITHUB_ENV: NAME=value lines and NAME<<DELIMITER blocks."""
    out: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    while lines:
        line = lines.pop(0)
        if "<<" in line and "=" not in line.split("<<")[0]:
            name, delimiter = line.split("<<", 1)
            value = []
            while lines and lines[0] != delimiter:
                value.append(lines.pop(0))
            lines.pop(0)
            out[name] = "\n".join(value)
        elif line:
            name, _, value = line.partition("=")
            out[name] = value
    return out


def run_github(bench: Bench, ws: Path, *, inputs: dict[str, str], secrets: dict[str, str], cancel: Any = None) -> Ran:
    flow = yaml.safe_load(GITHUB.read_text())
    assert flow["defaults"]["run"]["shell"] == "bash" and list(flow["jobs"]) == ["train"]
    job = flow["jobs"]["train"]
    temp = bench.tmp / "runner-temp"
    temp.mkdir()
    files = {name: temp / name for name in ("GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
    ctx = {"secrets": secrets, "inputs": inputs}
    env = {**bench.base_env(), "GITHUB_ACTIONS": "true", "RUNNER_TEMP": str(temp), "GITHUB_WORKSPACE": str(ws),
           **{k: str(p) for k, p in files.items()}, **{k: expression(v, ctx) for k, v in flow.get("env", {}).items()},
           **{k: expression(v, ctx) for k, v in job.get("env", {}).items()}, **OVERRIDES}  # fmt: skip
    ran = Ran({}, ws, [], {})
    cancelled = False
    for number, step in enumerate(job["steps"]):
        if not should_run(step.get("if", "success()"), ran.failed, cancelled):
            continue
        if "uses" in step:
            if step["uses"].startswith("actions/upload-artifact@"):
                ran.artifacts.append(ws / step["with"]["path"])
            continue
        assert "${{" not in step["run"], f"step {step['name']!r}: expressions go in env:, the script stays plain shell"
        script = temp / f"step-{number}.sh"
        script.write_text(step["run"])
        extra = files["GITHUB_PATH"].read_text().splitlines() if files["GITHUB_PATH"].exists() else []
        step_env = {**env, **github_env_file(files["GITHUB_ENV"]),
                    **{k: expression(v, ctx) for k, v in step.get("env", {}).items()}}  # fmt: skip
        step_env["PATH"] = ":".join([*reversed(extra), env["PATH"]])
        cut = cancel if step["name"] == "Launch" else None
        code, said = shell_step(script, ws, step_env, cut)
        cancelled = cancelled or cut is not None
        ran.codes[step["name"]] = code
        ran.outputs[step["name"]] = said
    pid = github_env_file(files["GITHUB_ENV"]).get("SSH_AGENT_PID")
    ran.agent_pid = int(pid) if pid else None
    ran.step_summary = files["GITHUB_STEP_SUMMARY"].read_text() if files["GITHUB_STEP_SUMMARY"].exists() else ""
    return ran


# -- GitLab CI ------------------------------------------------------------------------------------


def run_gitlab(bench: Bench, ws: Path, *, variables: dict[str, str], cancel: Any = None) -> Ran:
    ci = yaml.safe_load(GITLAB.read_text())
    job = ci["train"]
    env = {**bench.base_env(), "GITLAB_CI": "true", "CI_PROJECT_DIR": str(ws),
           **{k: str(v) for k, v in ci.get("variables", {}).items()}, **{k: str(v) for k, v in job.get("variables", {}).items()},
           **variables, **OVERRIDES}  # fmt: skip
    ran = Ran({}, ws, [ws / p for p in job["artifacts"]["paths"]], {}, junit=[ws / job["artifacts"]["reports"]["junit"]])
    assert job["artifacts"]["when"] == "always"
    for name, lines in (("script", job["before_script"] + job["script"]), ("after_script", job["after_script"])):
        script = bench.tmp / f"gitlab-{name}.sh"
        script.write_text("\n".join(lines) + "\n")
        if name == "after_script":  # the runner says how the job went
            env["CI_JOB_STATUS"] = "canceled" if cancel else "failed" if ran.codes["script"] else "success"
        code, said = shell_step(script, ws, env, cancel if name == "script" else None)
        if name == "script":
            pid_file = ws / ".gpuops-ssh-agent.pid"
            ran.agent_pid = int(pid_file.read_text()) if pid_file.exists() else None
        ran.codes[name] = code if name == "script" else 0  # after_script never fails a GitLab job
        ran.outputs[name] = said
    return ran


# -- what both leave behind -----------------------------------------------------------------------


def run(ci: str, bench: Bench, ws: Path, mode: str = "follow", secrets: dict[str, str] | None = None,
        cancel: Any = None) -> Ran:
    secrets = bench.secrets() if secrets is None else secrets
    if ci == "github":
        ran = run_github(bench, ws, inputs={"mode": mode}, secrets=secrets, cancel=cancel)
    else:
        ran = run_gitlab(bench, ws, variables={"GPUOPS_MODE": mode, **secrets}, cancel=cancel)
    try:
        if ran.agent_pid:  # the pipeline's own last step stops the agent it started (self-hosted runners keep running)
            wait_until(lambda: not alive(ran.agent_pid), timeout=10, message="the pipeline to stop its ssh-agent")
    finally:
        if ran.agent_pid and alive(ran.agent_pid):
            os.kill(ran.agent_pid, 9)
    return ran


def alive(pid: int | None) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def artifacts(ran: Ran, code: int) -> tuple[ET.Element, dict[str, Any]]:
    """The uploaded folder holds the JUnit report, the run's HTML report, the JSON events and the summary: all
    consistent."""
    (folder,) = ran.artifacts
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["events.jsonl", "report.html", "report.xml", "summary.json"], names
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    assert events and all({"ts", "event", "target"} <= set(e) for e in events)
    summary = events[-1]
    assert summary["event"] == "summary" and summary["exit_code"] == code, summary
    assert json.loads((folder / "summary.json").read_text()) == summary
    for path in ran.junit:
        assert path == folder / "report.xml"
    root = ET.parse(folder / "report.xml").getroot()
    check_shape(root)
    page = (folder / "report.html").read_text()
    if summary.get("run"):  # the run's own page: its id, its outcome, its plots
        assert f"run {summary['run']}" in page and page.count("<svg") == 3, page[:2000]
        assert f"exit {summary['exit_code']}" in page and (summary.get("rule") or "") in page
    return root, summary


def training(root: ET.Element) -> ET.Element:
    case = root.find("testsuite[@name='ct200']/testcase[@name='training']")
    assert case is not None
    return case


def launch_code(ci: str, ran: Ran) -> int:
    return ran.codes["Launch" if ci == "github" else "script"]


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_a_short_run_passes_and_its_report_is_kept(ci: str, bench: Bench) -> None:
    ran = run(ci, bench, bench.workspace("fake-train --mode steps --steps 3 --interval 0.05 --gpus 5,6"))
    assert not ran.failed, ran.outputs
    root, summary = artifacts(ran, 0)
    assert summary["outcome"] == "succeeded"
    suite = root.find("testsuite")  # the XSD gives skipped to the suites, not to <testsuites>
    assert (root.get("tests"), root.get("failures"), root.get("errors"), suite.get("skipped")) == ("3", "0", "0", "0")
    if ci == "github":
        assert ran.step_summary.startswith("### gpuops: succeeded (exit 0)\n"), ran.step_summary


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_an_fx_race_fails_the_job_and_the_report_still_uploads(ci: str, bench: Bench) -> None:
    ran = run(ci, bench, bench.workspace("fake-train --mode fx-thread --interval 0.05 --gpus 5,6"))
    assert launch_code(ci, ran) == 7, ran.outputs
    root, summary = artifacts(ran, 7)
    failure = training(root).find("failure")
    assert failure is not None and failure.get("message") == summary["message"]
    assert "rule: fx-tracing-race" in (failure.text or "")
    if ci == "github":
        assert list(ran.codes.values())[-3:] == [7, 0, 0]  # Launch failed; Summary and Stop ssh-agent still ran
        assert "### gpuops: aborted (exit 7)" in ran.step_summary and "rule `fx-tracing-race`" in ran.step_summary


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_detach_starts_the_run_and_leaves_it_to_the_watchdog(ci: str, bench: Bench) -> None:
    ran = run(ci, bench, bench.workspace("fake-train --mode steps --steps 100000 --interval 0.2 --gpus 5,6"), "detach")
    try:
        assert not ran.failed, ran.outputs
        root, summary = artifacts(ran, 0)
        assert summary["outcome"] == "started"
        skipped = training(root).find("skipped")
        assert skipped is not None and (skipped.get("message") or "").startswith("detached: run ")
        assert bench.fake.tmux(200, "has-session", "-t", "=ci-train").returncode == 0  # still training
    finally:
        bench.stop_run()


def ansible_workspace(bench: Bench, command: str, group_vars: str) -> Path:
    """The same workspace with an Ansible inventory, and a group_vars/all.yml beside it."""
    ws = bench.workspace(command)
    s = bench.sshd
    (ws / "inventories" / "lab.yaml").write_text(yaml.safe_dump({"all": {"hosts": {"ct200": {
        "ansible_host": s.host, "ansible_port": s.port, "ansible_user": s.user, "proxmox_vmid": 200,
        "gpuops_gpus": list(range(8))}}}}))  # fmt: skip
    (ws / "inventories" / "group_vars").mkdir()
    (ws / "inventories" / "group_vars" / "all.yml").write_text(group_vars)
    return ws


@pytest.mark.parametrize("ci", ["github", "gitlab"])
@pytest.mark.parametrize("where", ["inventory", "group_vars"])
def test_an_inventory_that_trusts_new_host_keys_is_refused_before_connecting(ci: str, where: str, bench: Bench) -> None:
    if where == "inventory":
        ws = bench.workspace("fake-train --mode steps", policy="accept-new")
    else:  # not in the inventory file at all: a grep of it passed this, gpuops resolves accept-new
        ws = ansible_workspace(bench, "fake-train --mode steps",
                               "ansible_ssh_common_args: -o StrictHostKeyChecking=accept-new\n")
        assert "accept-new" not in (ws / "inventories" / "lab.yaml").read_text()
    ran = run(ci, bench, ws)
    refused = ran.codes["script"] if ci == "gitlab" else ran.codes["Refuse trusting new host keys in CI"]
    assert refused == 1, ran.outputs
    assert "CI pins host keys, but ct200 would trust a new host key" in "".join(ran.outputs.values())
    assert "Launch" not in ran.codes and bench.sshd.connection_count() == 0


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_an_ansible_inventory_with_strict_group_vars_passes_the_guard(ci: str, bench: Bench) -> None:
    ws = ansible_workspace(bench, "fake-train --mode steps --steps 3 --interval 0.05 --gpus 5,6",
                           "ansible_ssh_common_args: -o StrictHostKeyChecking=yes\n")
    ran = run(ci, bench, ws)
    assert not ran.failed, ran.outputs
    _, summary = artifacts(ran, 0)
    assert summary["outcome"] == "succeeded"


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_a_host_key_not_pinned_is_exit_3_and_nothing_is_trusted(ci: str, bench: Bench) -> None:
    pinned = bench.sshd.known_hosts_line()
    bench.sshd.rotate_host_key()  # the host now shows a key the secret does not hold
    ws = bench.workspace("fake-train --mode steps")
    ran = run(ci, bench, ws, secrets={**bench.secrets(), "GPUOPS_KNOWN_HOSTS": pinned})
    assert launch_code(ci, ran) == 3, ran.outputs
    root, summary = artifacts(ran, 3)
    assert "HOST KEY CHANGED" in summary["error"]
    error = root.find("testsuite/testcase[@name='preflight']/error")
    assert error is not None and error.get("type") == "connect-error"
    assert (bench.tmp / "home/.ssh/known_hosts").read_text() == pinned + "\n"  # unchanged: nothing was trusted
    assert not bench.fake.processes(200)


class Cancel:
    """A job cancelled once the launch follows its training's log, as each runner cancels it."""

    #: GitHub: Ctrl-C to the step's process, SIGTERM 7.5 s later, the tree killed 2.5 s after. GitLab: in the
    #: worst case the job's shell is killed outright (its after_script must stop the run).
    SIGNALS = {"github": ((signal.SIGINT, 7.5), (signal.SIGTERM, 2.5)), "gitlab": ()}

    def __init__(self, ci: str) -> None:
        self.signals = self.SIGNALS[ci]

    def __call__(self, ws: Path) -> bool:
        events = ws / "gpuops-report" / "events.jsonl"
        return events.exists() and '"event": "log"' in events.read_text()


@pytest.mark.parametrize("ci", ["github", "gitlab"])
def test_a_cancelled_job_stops_its_run(ci: str, bench: Bench) -> None:
    """Cancelled mid-run, the job leaves no tmux session and no training process: the next pipeline's preflight
    would find the GPUs busy (exit 4) otherwise."""
    ran = run(ci, bench, bench.workspace("fake-train --mode steps --steps 100000 --interval 0.1 --gpus 5,6"),
              cancel=Cancel(ci))
    try:
        assert bench.fake.tmux(200, "has-session", "-t", "=ci-train").returncode != 0, ran.outputs
        assert not [pid for pid in bench.fake.processes(200) if b"fake-train" in _cmdline(pid)], ran.outputs
        if ci == "github":  # gpuops got the Ctrl-C itself and stopped the run (--stop-on-exit); the cancel step ran too
            assert launch_code(ci, ran) == 130, ran.outputs
            summary = json.loads((ws_events := ran.workspace / "gpuops-report" / "events.jsonl").read_text().splitlines()[-1])
            assert (summary["outcome"], summary["run_alive"]) == ("interrupted", False), ws_events
            assert ran.codes["Stop the run of a cancelled job"] == 0, ran.outputs
        else:  # killed with its shell: after_script's stop did it
            assert "stopped" in ran.outputs["after_script"], ran.outputs
    finally:
        bench.stop_run()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
