"""The fault matrix (issue 19): each fault it names, made to happen, and what came of it: the run's
outcome and whether protection was still there (the right verdict, no healthy run killed).

FAULTS is a list of (name, function); each function sets the fault up, lets gpuops meet it and returns
(outcome, protected). Pure rows feed the agent's own code (detectors, baselines, the probe through real
bash, the history tool); bench rows run gpuops against the real-sshd bench. Prints one table.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import redirect_stderr
from pathlib import Path
from typing import Callable, List, Tuple

from benchkit import GPUOPS, ROOT, Row, Site, wait_for

import yaml
from bench import SshServer
from bench.inventory import host_entry, write_inventory
from bench.watchdog import events, pids, wait_watching
from faults_35_joblink import JOBLINK_FAULTS
from faults_35_local import LOCAL_FAULTS
from faults_35_notify import NOTIFY_FAULTS
from faults_35_report import REPORT_FAULTS
from faults_35_stacks import STACKS_FAULTS
from faults_agent import AGENT_FAULTS
from faults_restart import RESTART_FAULTS

from gpuops.agent.detect.detectors import Baseline, Detectors
from gpuops.agent.detect.profile import keep_profile, pick_baseline, run_digest
from gpuops.agent.detect.telemetry import TelemetryLog
from gpuops.agent.run.history import runs as history
from gpuops.agent.wire.watchfile import detectors

Result = Tuple[str, bool]
T0 = 1796120709.83
COMPILED, EAGER, LEVEL = 505695.0, 98364.0, 1443
CONFIG = detectors({k: {} for k in ("throughput", "gpu_memory", "compile_after_warmup")})  # each with its defaults
GOOD = Baseline("20261201-102500-3fa9c2", COMPILED, {5: float(LEVEL)}, "last")


def _simulate(det: Detectors, seconds: int, tp: Callable[[int], float | None], mib: Callable[[int], int]) -> List[str]:
    """A figure a second (or none), a GPU sample and a verdict every 2 s: the rules that fired."""
    found = []
    for tick in range(seconds):
        value = tp(tick)
        if value is not None:
            det.measure(T0 + tick, "throughput", str(value))
        if tick % 2 == 0:
            det.sample(T0 + tick, {5: (mib(tick), 17)})
            found += [f.rule for f in det.judge(T0 + tick)]
    return found


def _run(runs: Path, run_id: str, tp: float, command: str = "python train.py --batch 32") -> Path:
    """A finished run directory: meta, ten minutes of steady samples, exit 0."""
    d = runs / run_id
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"id": run_id, "playbook": "dflash", "target": "ct200",
                                             "command": command, "env": {}, "started_at": "2026-12-01T10:25:00Z"}))
    log = TelemetryLog(str(d))
    for i in range(300):
        log.append(T0 + 2 * i, {5: (LEVEL, 17)}, None, tp)
    (d / "exit_code").write_text("0\n")
    return d


def warned_run_as_baseline() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        keep_profile(str(_run(runs, "20261201-100000-aaaaaa", COMPILED)), settle=0)
        keep_profile(str(_run(runs, "20261201-101000-bbbbbb", EAGER)), settle=0, findings=["throughput-drop"])
        meta = json.loads((runs / "20261201-100000-aaaaaa" / "meta.json").read_text())
        base, _ = pick_baseline(tmp, "dflash", "20261201-102000-cccccc", digest=run_digest(meta), target="ct200")
    found = _simulate(Detectors(CONFIG, base, T0), 300, lambda t: EAGER, lambda t: LEVEL)
    ok = base is not None and base.run == "20261201-100000-aaaaaa" and "throughput-drop" in found
    return f"next slow run judged against {base.run if base else None}: {', '.join(found) or 'nothing'}", ok


def changed_command_no_baseline() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        keep_profile(str(_run(Path(tmp), "20261201-100000-aaaaaa", COMPILED)), settle=0)
        digest = run_digest({"command": "python train.py --batch 64", "env": {}})
        base, why = pick_baseline(tmp, "dflash", "20261201-102000-cccccc", digest=digest, target="ct200")
    found = _simulate(Detectors(CONFIG, base, T0, no_baseline=why), 300, lambda t: EAGER / 2, lambda t: LEVEL)
    return f"batch 32 -> 64: {', '.join(found)} (no comparable baseline)", base is None and found == ["no-baseline"]


def checkpoint_excursion() -> Result:
    one = _simulate(Detectors(CONFIG, GOOD, T0), 600, lambda t: COMPILED, lambda t: LEVEL + 3072 if 300 <= t < 302 else LEVEL)
    eager = _simulate(Detectors(CONFIG, None, T0), 600, lambda t: 79189.0, lambda t: 4449 if int(t / 0.7) % 2 else 1063)
    return (f"+3 GiB for 2 s: {', '.join(one) or 'nothing'}; eager swings: {', '.join(eager)}",
            one == [] and "gpu-memory-volatile" in eager)


def slowdown_fewer_figures() -> Result:
    base = Baseline(GOOD.run, COMPILED, GOOD.gpu_memory, "last", figure_rate=1 / 8)  # a step line every 8 s
    found = _simulate(Detectors(CONFIG, base, T0), 600, lambda t: EAGER if t % 40 == 0 else None, lambda t: LEVEL)
    return f"5x slower, a figure every 40 s (window 30 s): {', '.join(found) or 'nothing'}", found == ["throughput-drop"]


def long_escaped_abort_line() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        d = home / ".gpuops" / "runs" / "20261201-100000-aaaaaa"
        d.mkdir(parents=True)
        (home / ".gpuops" / "sessions").mkdir()
        (home / ".gpuops" / "sessions" / "train").write_text(d.name + "\n")
        (d / "meta.json").write_text("{}")
        (d / "abort.json").write_text(json.dumps({"reason": "match", "rule": "boom", "by": "watchdog",
                                                  "line": "\x00" * 20000 + " BOOM"}))
        from gpuops.agent.wire.marks import parse_probe as read_probe
        out = subprocess.run(["bash", str(ROOT / "gpuops" / "agent" / "sh" / "probe.sh"), "train"], capture_output=True,
                             text=True, env={"HOME": tmp, "PATH": "/usr/bin:/bin", "TMUX_TMPDIR": tmp}).stdout
        run = read_probe(out).sessions["train"].run
    rule = run.abort.get("rule") if run is not None else None
    return f"abort.json of {len(json.dumps(chr(0) * 20000)) // 1024} KiB: status says rule {rule!r}", rule == "boom"


def limit_after_filter() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        for n, playbook in enumerate(["x", "x"] + ["other"] * 20):
            d = Path(tmp) / ".gpuops" / "runs" / ("20261201-1%05d-aaaaaa" % n)
            d.mkdir(parents=True)
            (d / "meta.json").write_text(json.dumps({"playbook": playbook}))
            (d / "profile.json").write_text(json.dumps({"run": d.name, "playbook": playbook, "outcome": "succeeded"}))
        got = history(5, tmp, playbook="x")
    return f"runs -p x --limit 5 behind 20 newer runs of another playbook: {len(got)} runs", len(got) == 2


def interrupted_launch() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / ".gpuops" / "runs" / "20261201-100000-aaaaaa"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"playbook": "x", "phase": "interrupted"}))
        (row,) = history(5, tmp)
    return f"runs: {row['outcome']} exit {row['exit_code']}", row["exit_code"] == 130


def control_bytes() -> Result:
    from gpuops.cli.renderers.render import TextRenderer

    err = io.StringIO()
    with redirect_stderr(err):
        render = TextRenderer()
        render.err = err
        render.say("ABORT: rule 'boom' matched: BOOM \x00\x07\x9b2J")
    said = err.getvalue()
    return "said: " + said.strip(), not any(c in said for c in "\x00\x07\x9b")


def shared_inductor_cache() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        site = Site(Path(tmp))
        try:
            cache = Path(tmp) / "cache"
            (cache / "triton").mkdir(parents=True)
            first = site.playbook("first", "fake-train --mode perf --gpus 5,6 --interval 0.1 --duration 40",
                                  watch={"sample_interval": 0.5, "gpu_memory": False,
                                         "compile_after_warmup": {"settle": 1, "action": "abort"}})
            data = yaml.safe_load(first.read_text())
            data["env"] = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
            first.write_text(yaml.safe_dump(data))
            d = site.run_dir(site.launch_detached(first))
            wait_for(lambda: (d / "samples.jsonl").exists(), 60, "the first run's samples")
            second = Path(tmp) / "second.yaml"
            second.write_text(yaml.safe_dump({
                "name": "second", "target": "ct200", "env": {"TORCHINDUCTOR_CACHE_DIR": str(cache)},
                "preflight": {"gpus": [7]}, "launch": {"session": "other", "command": "true"},
                "warmup": {"gpus": [7], "command": "fake-train --mode perf --gpus 7 --interval 0.1 --duration 1.5 "
                           "--cache-dir %s --cache-files 53 --cache-after 0.3" % shlex.quote(str(cache))},
                "watch": {"stall_timeout": 0, "compile_after_warmup": False, "gpu_memory": False}}))
            if site.gpuops("launch", "--yes", playbook=second).returncode != 0:
                return "the second launch failed", False
            seen = wait_for(lambda: [e["rule"] for e in events(d) if e.get("rule") in ("compile-after-warmup", "cache-shared")],
                            30, "a verdict on the new cache files")
            aborted = (d / "abort.json").exists()
            site.gpuops("stop", playbook=first)
        finally:
            site.close()
    return f"the second run's warmup wrote 53 files: {', '.join(seen)}{'; aborted' if aborted else ''}", (
        seen == ["cache-shared"] and not aborted)


def status_black_hole() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        site, hole = Site(Path(tmp)), SshServer()
        hole.start()
        try:
            inv = write_inventory(Path(tmp) / "two.yaml", site.sshd, extra_hosts={"pve2": host_entry(hole, connect_timeout=8)},
                                  extra_targets={"ct300": {"host": "pve2", "ctid": 300}})
            hole.freeze()
            proc = subprocess.Popen(GPUOPS + ["status", "-i", str(inv), "-t", "ct300", "-t", "ct200"], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env={**os.environ, "GPUOPS_CONNECT_RETRY_TIME": "1"})
            started, first = time.monotonic(), None
            assert proc.stdout is not None
            for line in proc.stdout:
                if first is None and line.startswith(b"ct200:"):
                    first = time.monotonic() - started
            proc.wait()
            total = time.monotonic() - started
        finally:
            hole.stop()
            site.close()
    shown = "never" if first is None else f"{first:.1f}s"
    return f"reachable target shown at {shown}, the black hole given up at {total:.1f}s", (
        first is not None and first < total / 2 and proc.returncode == 3)


def resumed_watchdog() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        site = Site(Path(tmp))
        try:
            go = Path(tmp) / "go"
            job = "trap '' INT; while [ ! -e %s ]; do echo step; sleep 0.2; done; echo BOOM; sleep 60" % shlex.quote(str(go))
            pb = site.playbook("resume", job, gpus=(), rules=[{"name": "boom", "pattern": "BOOM", "action": "abort"}], grace=6)
            run_id = site.launch_detached(pb)
            d = site.run_dir(run_id)
            frozen = pids(run_id, "supervise") + [wait_watching(d)]
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            follow = subprocess.Popen(GPUOPS + ["logs", "-f", "--json", "-i", str(site.inventory), "-p", str(pb)],
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            lines: List[str] = []
            reader = threading.Thread(target=lambda: lines.extend(follow.stdout or ()), daemon=True)
            reader.start()
            try:
                wait_for(lambda: any('"watchdog_stale"' in line for line in lines), 60, "the client to take over")
                go.touch()
                wait_for((d / "abort.json").exists, 60, "the client's claim")
            finally:
                for pid in reversed(frozen):
                    os.kill(pid, signal.SIGCONT)
            follow.wait(timeout=120)
            reader.join(10)
        finally:
            site.close()
    shown = sum(1 for line in lines if line.startswith("{") and json.loads(line)["event"] == "match")
    return f"watchdog frozen, logs -f aborted, watchdog resumed: match shown {shown}x", shown == 1 and follow.returncode == 7


def excursion_way_back() -> Result:
    """+3 GiB for 12 s in a 30 s window: its way back is no jump once its way out left the window."""
    fired = _simulate(Detectors(CONFIG, GOOD, T0), 600, lambda _t: COMPILED,
                      lambda t: LEVEL + 3072 if 300 <= t < 312 else LEVEL)
    return f"+3 GiB for 12 s: {', '.join(fired) or 'nothing'}", fired == []


def eval_pause() -> Result:
    """A 40 s pause every 300 s, the figures unchanged: no throughput-drop."""
    base = Baseline(GOOD.run, COMPILED, GOOD.gpu_memory, "last", figure_rate=1.0)
    fired = _simulate(Detectors(CONFIG, base, T0), 1000, lambda t: None if t % 300 >= 260 else COMPILED, lambda _t: LEVEL)
    return f"40 s pause every 300 s: {', '.join(fired) or 'nothing'}", fired == []


FAULTS: List[Tuple[str, Callable[[], Result]]] = AGENT_FAULTS + [
    ("19.6 a slow run that only warned is the next baseline", warned_run_as_baseline),
    ("19.6 a changed batch size read as a regression", changed_command_no_baseline),
    ("19.6 one checkpoint excursion read as volatility", checkpoint_excursion),
    ("19.7 5x slower leaves fewer figures than a window", slowdown_fewer_figures),
    ("19.8 another run's warmup in the shared inductor cache", shared_inductor_cache),
    ("19.12 a matched line over 64 KiB JSON-escaped", long_escaped_abort_line),
    ("19.12 runs --limit before the playbook filter", limit_after_filter),
    ("19.12 control bytes of the log in abort lines", control_bytes),
    ("19.12 multi-target status behind a black-hole host", status_black_hole),
    ("19.12 an interrupted launch in runs", interrupted_launch),
    ("19.12 a resumed watchdog: ABORT shown twice", resumed_watchdog),
    ("29.8 an excursion whose way out left the window", excursion_way_back),
    ("29.8 a periodic eval pause", eval_pause),
] + RESTART_FAULTS + STACKS_FAULTS + LOCAL_FAULTS + REPORT_FAULTS + JOBLINK_FAULTS + NOTIFY_FAULTS


def matrix(faults: List[Tuple[str, Callable[[], Result]]]) -> List[Tuple[str, str, str]]:
    """(fault, outcome, protected) of each row; a row that breaks is a red row, not a crashed matrix."""
    rows = []
    for name, fault in faults:
        try:
            outcome, protected = fault()
        except Exception as exc:  # noqa: BLE001 - a row that breaks is a red row, not a crashed matrix
            outcome, protected = f"{type(exc).__name__}: {exc}"[:200], False
        rows.append((name, outcome, "yes" if protected else "NO"))
        print(f"{name} | {outcome} | {rows[-1][2]}", flush=True)
    print("\n| fault | outcome | protected |\n|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return rows


def bench_faults(args: object = None) -> List[Row]:
    """run.py's row group: the matrix, and how many faults were survived."""
    rows = matrix(FAULTS)
    green = sum(1 for r in rows if r[2] == "yes")
    return [Row("fault matrix: faults survived", [float(green)], unit="count", target=f"{len(rows)} of {len(rows)}",
                met=green == len(rows), note=", ".join(r[0] for r in rows if r[2] != "yes") or "all green")]


def main(argv: List[str]) -> int:
    """All rows, or those whose name starts with one of argv (`19.1 19.9`)."""
    chosen = [(n, f) for n, f in FAULTS if not argv or any(n.startswith(a + " ") or n.startswith(a + ".") for a in argv)]
    return 0 if all(r[2] == "yes" for r in matrix(chosen)) else 1


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
