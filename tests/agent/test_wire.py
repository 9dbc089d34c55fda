"""Each agent tool's reply, read by its one parser in gpuops/agent/wire/protocol.py, on the tool's real output.

The tools run here for real (bash, flock, the shipped package as `python3 -m gpuops.agent`); only
nvidia-smi and pct are the bench's stand-ins.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench.fakes import FakeProxmox, make_root

from gpuops.agent.wire import marks
from gpuops.agent.wire import protocol as p
from gpuops.transport.base import Result
from gpuops.transport.pct import parse_pct_exec, parse_pct_status

REPO = Path(__file__).resolve().parents[2]
SH = REPO / "gpuops" / "agent" / "sh"
PCT_EXEC = REPO / "gpuops" / "transport" / "pct_exec.sh"
RUN_ID = "20261201-101500-abc123"


@pytest.fixture
def fake() -> FakeProxmox:
    fake = FakeProxmox(make_root("gpuops-wire-"))
    fake.add_container(200, gpus=2)
    fake.add_container(201, running=False)
    yield fake
    fake.cleanup()


def tool(fake: FakeProxmox, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """One agent tool, run inside container 200's environment (its HOME, GPUs, tmux dir)."""
    return subprocess.run(list(argv), env=fake.env(200), input=stdin, capture_output=True, text=True, timeout=60,
                          cwd=REPO)


def agent(fake: FakeProxmox, *argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**fake.env(200), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "gpuops.agent", *argv], env=env, input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def make_run(fake: FakeProxmox, session: str = "train", **records: str) -> Path:
    """A run directory with the given records, pointed to by its session."""
    g = fake.home(200) / ".gpuops"
    d = g / "runs" / RUN_ID
    d.mkdir(parents=True)
    (g / "sessions").mkdir(exist_ok=True)
    (g / "sessions" / session).write_text(RUN_ID)
    for name, text in records.items():
        (d / name).write_text(text)
    return d


def test_probe_reply_carries_gpus_tools_and_each_record_of_the_run(fake: FakeProxmox) -> None:
    make_run(fake, **{p.META: json.dumps({"phase": "running", "gpus": [0]}), p.EXIT_CODE: "3\n",
                      p.ABORT: json.dumps({"reason": "stall"}), p.LOG: "hello\n"})
    done = tool(fake, "bash", str(SH / "probe.sh"), "train", "other")
    assert done.returncode == 0, done.stderr
    reply = marks.parse_probe(done.stdout)
    assert reply.smi and reply.gpus_rc == 0 and reply.apps_rc == 0
    assert len(reply.gpus_text.splitlines()) == 2  # one CSV row a GPU of the container
    assert reply.tmux and reply.python is not None and len(reply.python) == 3  # the target's python3
    assert set(reply.sessions) == {"train", "other"}
    assert reply.sessions["other"].run is None
    run = reply.sessions["train"].run
    assert run is not None and run.run_id == RUN_ID
    assert (run.meta["phase"], run.exit_code, run.abort, run.log_size) == ("running", 3, {"reason": "stall"}, 6)
    assert reply.now is not None and abs(reply.now - run.log_mtime) < 3600


def test_probe_without_nvidia_smi_says_so(fake: FakeProxmox, tmp_path: Path) -> None:
    env = {**fake.env(200), "PATH": "/usr/bin:/bin"}
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in env["PATH"].split(":")):
        pytest.skip("a real nvidia-smi is on /usr/bin here")
    done = subprocess.run(["bash", str(SH / "probe.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert marks.parse_probe(done.stdout).smi_found is False


def test_lock_reply_takes_the_lock_and_a_second_launch_is_told_who_holds_it(fake: FakeProxmox) -> None:
    env = fake.env(200)
    first = subprocess.Popen(["bash", str(SH / "lock.sh"), "train", "alice@laptop", "0"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        out = b""
        assert first.stdout is not None
        while marks.LOCKED_OK_LINE not in out:
            chunk = first.stdout.read1(4096)
            assert chunk, out
            out += chunk
        said = marks.parse_lock(out.decode())
        assert not said.refused and said.stale is None
        assert "train" in marks.parse_probe(out.decode()).sessions  # the probe taken under the lock
        second = tool(fake, "bash", str(SH / "lock.sh"), "train", "bob@desk", "1")
        busy = marks.parse_lock(second.stdout)
        assert busy.refused and busy.busy == "alice@laptop", second.stdout
        third = tool(fake, "bash", str(SH / "lock.sh"), "eval", "bob@desk", "0")
        held = marks.parse_lock(third.stdout)
        assert held.refused and held.gpu_held == ("0", "launch: session train: alice@laptop"), third.stdout
    finally:
        assert first.stdin is not None
        first.stdin.write(b"release\n")
        first.stdin.close()
        first.wait(30)


def test_kill_marked_reply_lists_no_survivor_once_the_run_is_killed(fake: FakeProxmox) -> None:
    env = {**fake.env(200), "GPUOPS_RUN_ID": RUN_ID}
    victim = subprocess.Popen(["bash", "-c", "trap '' TERM; while :; do sleep 1; done"], env=env)
    try:
        done = tool(fake, "bash", str(SH / "kill_marked.sh"), RUN_ID, "1")
        assert marks.parse_kill_marked(done.stdout) == [], done.stdout
        assert victim.wait(30) == -9  # TERM ignored, so KILL it was
        again = tool(fake, "bash", str(SH / "kill_marked.sh"), RUN_ID)
        assert (again.stdout, marks.parse_kill_marked(again.stdout)) == (marks.mark("killed", "0") + "\n", [])
    finally:
        victim.kill()
        victim.wait()


def test_kill_marked_reply_names_the_survivors() -> None:
    assert marks.parse_kill_marked(marks.mark("survivors", "12 345 ") + "\n") == [12, 345]


def test_start_reply_says_stopped_when_gpuops_stop_came_first(fake: FakeProxmox) -> None:
    make_run(fake, **{p.WATCH: json.dumps({"session": "train"}), p.ABORT: json.dumps({"reason": "stop"})})
    done = agent(fake, "start", RUN_ID)
    assert done.returncode == marks.STOPPED_EXIT, done.stderr
    said = marks.parse_start(done.stdout)
    assert said.stopped and not said.started and said.watchdog_failed is None


def test_abort_reply_reports_the_abort_that_was_there_first_and_its_result(fake: FakeProxmox) -> None:
    first = {"reason": "stall", "by": "watchdog"}
    result = {"survivors": [], "gpus": [{"index": 0}], "seconds": 1.5}
    make_run(fake, **{p.ABORT: json.dumps(first), p.ABORT_DONE: json.dumps(result)})
    done = agent(fake, "abort", RUN_ID, "client", stdin=json.dumps({"reason": "stop"}))
    assert done.returncode == 0, done.stderr
    said = marks.parse_abort(done.stdout)
    assert said.claimed is None and said.already is not None and said.already["reason"] == "stall"
    assert said.done is not None and (said.done["seconds"], said.done["gpus"]) == (1.5, [{"index": 0}])


def test_pct_exec_reply_is_none_in_a_running_container_and_pct_status_after_a_failed_exec(fake: FakeProxmox) -> None:
    env = {**fake.env(None), "PATH": str(REPO / "tests" / "standins" / "bin") + ":" + fake.env(None)["PATH"]}

    def run(ct: str) -> str:
        return subprocess.run(["bash", str(PCT_EXEC), ct, "echo", "inside"], env=env, capture_output=True,
                              text=True, timeout=60, cwd=fake.home(None)).stdout

    ran = run("200")
    assert (ran, parse_pct_exec(ran)) == ("inside\n", None)
    failed = parse_pct_exec(run("201"))
    assert failed is not None and failed.exec_rc != 0
    said = Result(failed.status_rc, failed.status_said.encode(), b"")
    assert parse_pct_status(said) == "stopped", failed


def test_one_state_vocabulary_keeps_the_words_users_see() -> None:
    """status's `state`, runs' `outcome` and profile.json's `outcome` come from one enum, and print,
    compare and serialise as the same words as before."""
    words = {"warming", "running", "aborting", "exited", "succeeded", "failed", "aborted", "stalled", "timeout",
             "stopped", "lost", "not-started", "interrupted",
             "restarting",  # restarting: an attempt ended and the watchdog starts the next (playbook restart:)
             "hardware"}  # hardware: a GPU of the run failed (docs/health.md)
    assert {s.value for s in p.RunState} == words
    for state in p.RunState:
        assert (str(state), f"{state}", json.dumps(state), state == state.value) == (
            state.value, state.value, json.dumps(state.value), True)
        assert {state.value: 1}[state] == 1 and state.is_terminal() != state.is_live()
    assert {s for s in p.RunState if s.is_live()} == {"warming", "running", "aborting", "restarting"}


@pytest.mark.parametrize(("exit_text", "abort", "alive", "want"), [
    (None, None, True, ("running", None)),
    ("0\n", None, False, ("succeeded", 0)),
    ("3", None, False, ("failed", 6)),
    (None, None, False, ("lost", 6)),
    ("0", {"reason": "stall"}, False, ("stalled", 8)),
    ("130", {"reason": "stop"}, False, ("stopped", 6)),
    (None, {"reason": "timeout"}, False, ("timeout", 124)),
    (None, {"reason": "match", "rule": "nccl-timeout"}, True, ("aborted", 7)),
])
def test_the_one_outcome_mapping_gives_the_contract_exit_codes(exit_text, abort, alive, want) -> None:
    from gpuops.agent.wire.records import outcome
    from gpuops.errors import ExitCode

    state, code = outcome(exit_text, abort, alive)
    assert (state, code) == want and isinstance(state, p.RunState)
    assert code in (None, ExitCode.OK, ExitCode.TRAINING_FAILED, ExitCode.ABORTED, ExitCode.STALLED, ExitCode.TIMEOUT)
    assert state.is_terminal() == (code is not None)


def test_the_agents_exit_codes_are_the_contracts() -> None:
    from gpuops.errors import ExitCode

    assert (p.ExitCode.OK, p.ExitCode.CONNECT, p.ExitCode.WARMUP, p.ExitCode.TRAINING_FAILED, p.ExitCode.ABORTED,
            p.ExitCode.STALLED, p.ExitCode.TIMEOUT, p.ExitCode.INTERRUPTED) == (
        ExitCode.OK, ExitCode.CONNECT, ExitCode.WARMUP, ExitCode.TRAINING_FAILED, ExitCode.ABORTED, ExitCode.STALLED,
        ExitCode.TIMEOUT, ExitCode.INTERRUPTED)


def test_a_won_abort_writes_versioned_records_and_reads_an_older_runs_watch_json(fake: FakeProxmox) -> None:
    """abort.json and abort-done.json carry schema_version; a watch.json without one (an older run) still
    gives the run's settings, the defaults filling what it lacks."""
    d = make_run(fake, **{p.WATCH: json.dumps({"session": "gone-session", "gpus": []})})
    done = agent(fake, "abort", RUN_ID, "client", stdin=json.dumps({"reason": "stop"}))
    assert done.returncode == 0, done.stderr
    said = marks.parse_abort(done.stdout)
    assert said.claimed is not None and said.claimed["reason"] == "stop" and said.done is not None
    for name in (p.ABORT, p.ABORT_DONE):
        assert json.loads((d / name).read_text())["schema_version"] == p.SCHEMA_VERSION, name
    assert said.claimed["schema_version"] == p.SCHEMA_VERSION


def test_watch_json_defaults_are_spelled_once() -> None:
    """The abort's grace, its signal, the stall timeout, the sample interval and the drain's memory
    threshold come from gpuops/agent/wire/watchfile.py (a detector's window from its entry in
    gpuops/agent/wire/detector_list.py); no other module spells them as a literal default."""
    import re

    from gpuops.agent.wire import watchfile
    from gpuops.config import playbook_model as model

    literals = [r"""["']grace["'],\s*30\b""", r"grace:\s*float\s*=\s*30", r"""["']signal["'],\s*["']INT""",
                r"""sample_interval["']\)\s*or\s*2""", r"""["']timeout["'],\s*900""", r"stall_timeout:\s*float\s*=\s*9",
                r"""max_memory_used_mib["'],\s*500""", r"max_memory_used_mib:\s*int\s*=\s*5", r"signal:\s*str\s*=\s*[\"']",
                r"""["']window["'],\s*30"""]
    found = [f"{path.relative_to(REPO)}: {pattern}" for path in sorted((REPO / "gpuops").rglob("*.py"))
             if path.name not in ("watchfile.py", "detector_list.py")
             for pattern in literals if re.search(pattern, path.read_text())]
    assert found == []
    assert (model.Abort().grace, model.Abort().signal, model.Watch().stall_timeout, model.Watch().sample_interval) == (
        watchfile.ABORT_GRACE, watchfile.ABORT_SIGNAL, watchfile.STALL_TIMEOUT, watchfile.SAMPLE_INTERVAL)
    older = watchfile.parse({})  # a watch.json without the keys
    assert (older.abort.signal, older.abort.grace) == ("INT", 30.0) and (older.stall.timeout, older.stall.auto) == (900.0, None)


def test_every_json_object_the_cli_prints_carries_the_schema_version() -> None:
    import io

    from gpuops.cli.renderers.render import JsonRenderer
    from gpuops.client.events import Event, Outcome

    out = io.StringIO()
    renderer = JsonRenderer(out)
    renderer.event(Event("started", "ct200", RUN_ID, {"session": "train"}))
    renderer.outcome(Outcome("succeeded", 0, "done", {"run": RUN_ID}))
    objs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [o["event"] for o in objs] == ["started", "summary"]
    assert all(o["schema_version"] == p.SCHEMA_VERSION for o in objs)


def test_an_older_gpuops_watch_json_reads_into_the_typed_config_with_defaults_for_what_it_lacks() -> None:
    """A run launched by an earlier gpuops is still watched after an upgrade: its watch.json (the real H200
    runs', written before restarts, stacks, notifications and the schema version) is read once into the
    typed config; what it lacks gets its default, and composing it again gives the same record."""
    from gpuops.agent.wire import watchfile

    old = json.loads((REPO / "tests/data/real_h200/watchdog/eager/watch.json").read_text())
    assert not {"schema_version", "restart", "stacks", "notify"} & set(old)
    cfg = watchfile.parse(old)
    assert (cfg.session, cfg.gpus, cfg.abort.grace, cfg.stall.timeout, cfg.sample_interval) == ("real-eager", (0,), 15.0,
                                                                                                300.0, 1.0)
    assert (cfg.restart, cfg.max_attempts, cfg.stacks, cfg.notify, cfg.job) == (None, 1, "on_stall", (), None)
    throughput = cfg.detectors.of("throughput")
    assert (throughput.pattern, throughput.action, throughput.window) == (r"tok/s (\d+)", "abort", 10.0)
    assert watchfile.compose(cfg) == {**old, "schema_version": p.SCHEMA_VERSION, "restart": None, "stacks": "on_stall",
                            "notify": [], "metrics": {"textfile": None, "pushgateway": None, "secret": False,
                                                      "keep_ended": watchfile.METRICS_KEEP_ENDED},
                            "slow_node": None,
                            "gpu_xid": None, "gpu_ecc": None, "gpu_lost": None, "gpu_slowdown": None}
