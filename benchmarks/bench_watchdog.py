"""The watchdog on the bench: how fast it stops a detached run nobody follows, against a following
client doing the same; and whether a watchdog SIGKILLed around the race still stops the run once.

Both start the run with `gpuops launch --detach` and make fake-train write the FX race when the
benchmark says (`--go FILE`). The moment the race is written is the log's mtime when the FX line is
first seen (polled every millisecond; the kernel stamps the write, so a late poll changes nothing);
the run is stopped when abort-done.json is written (session gone, processes reaped, GPUs drained),
and `session_gone_at` in it says when its tmux session went.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchkit import GPUOPS, Row, Site, wait_for

from bench.watchdog import events, heartbeat, remove_watchdog, wait_watching

FX = b"Detected that you are using FX to symbolically trace"


def _trainer(go: Path) -> str:
    return f"fake-train --mode fx-thread --gpus 5,6 --interval 0.02 --go {go}"


def _trace_written(log: Path, start: int, timeout: float = 30.0) -> float:
    """When the FX line landed in the log: its mtime once the line is seen (or the poll's clock, if earlier)."""
    deadline = time.monotonic() + timeout
    seen = b""
    with open(log, "rb") as fh:
        fh.seek(start)
        while time.monotonic() < deadline:
            chunk = fh.read()
            if chunk:
                seen = seen[-len(FX):] + chunk
                if FX in seen:
                    return min(time.time(), os.fstat(fh.fileno()).st_mtime)
            time.sleep(0.001)
    raise RuntimeError("the FX line never reached the log")


def _stopped(d: Path, timeout: float = 60.0) -> tuple[float, float, dict[str, Any]]:
    """(session gone, GPUs drained, abort.json) once the abort sequence wrote abort-done.json."""
    done = d / "abort-done.json"
    wait_for(done.exists, timeout, "abort-done.json")
    record = json.loads(done.read_text())
    claim = json.loads((d / "abort.json").read_text())
    claim["drained"] = all(g.get("memory_used_mib") == 0 for g in record.get("gpus") or [{}])
    return float(record["session_gone_at"]), done.stat().st_mtime, claim


def _race(site: Site, d: Path, go: Path) -> tuple[float, float, dict[str, Any]]:
    """Write the race now; (seconds to session gone, seconds to drained, abort.json)."""
    start = (d / "log").stat().st_size
    go.touch()
    written = _trace_written(d / "log", start)
    gone, drained, record = _stopped(d)
    return gone - written, drained - written, record


def _ready(site: Site, playbook: Path) -> Path:
    """A detached run whose watchdog watches and whose trainer holds its GPUs."""
    d = site.run_dir(site.launch_detached(playbook))
    wait_watching(d)
    wait_for(site.gpu_pids, 60, "the trainer's GPU memory")
    return d


def _watchdog_trial(site: Site, i: int, watch: dict[str, Any] | None = None) -> tuple[float, float, str, bool]:
    go = site.tmp / f"go-wd-{i}{'-m' if watch else ''}"
    d = _ready(site, site.playbook("race", _trainer(go), watch=watch))
    gone, drained, record = _race(site, d, go)
    wait_for(lambda: heartbeat(d).get("state") == "done", 60, "the watchdog to finish")
    return gone, drained, str(record.get("by")), bool(record["drained"])


class _Follower:
    """`gpuops logs -f --json` in the background; says when it watches the run itself."""

    def __init__(self, site: Site, playbook: Path) -> None:
        argv = GPUOPS + ["logs", "-f", "--json", "-i", str(site.inventory), "-p", str(playbook)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self.watching = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if b'"watchdog_stale"' in line:
                self.watching.set()

    def finish(self) -> int:
        code = self.proc.wait(timeout=60)
        self.reader.join(10)
        return code


def _client_trial(site: Site, i: int) -> tuple[float, float, str, bool]:
    go = site.tmp / f"go-client-{i}"
    playbook = site.playbook("race", _trainer(go))
    d = _ready(site, playbook)
    remove_watchdog(d)
    follower = _Follower(site, playbook)
    if not follower.watching.wait(60):
        raise RuntimeError("logs -f never took over watching")
    gone, drained, record = _race(site, d, go)
    follower.finish()
    return gone, drained, str(record.get("by")), bool(record["drained"])


def bench_wd_abort(args: Any) -> list[Row]:
    """Row 1: the watchdog stopping a detached run, beside a following client with the watchdog taken away."""
    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")))
    try:
        wd_gone, wd_drained, cl_gone, cl_drained = [], [], [], []
        by: list[str] = []
        zero = 0
        for i in range(args.abort_runs):  # interleaved: load changes hit both alike
            gone, drained, who, ok = _watchdog_trial(site, i)
            wd_gone.append(gone), wd_drained.append(drained), by.append(who)
            zero += ok
            gone, drained, who, ok = _client_trial(site, i)
            cl_gone.append(gone), cl_drained.append(drained), by.append(who)
            zero += ok
        med = statistics.median
        counts = {who: by.count(who) for who in sorted(set(by))}
        return [Row(f"watchdog abort, detached (no client): FX trace -> session gone + GPUs drained ({len(wd_drained)} runs)",
                    wd_drained, baseline_name="logs -f aborting (watchdog removed)", baseline=cl_drained,
                    target="median <= 0.15 s, max <= 1 s", met=med(wd_drained) <= 0.15 and max(wd_drained) <= 1.0,
                    note=f"session gone after {med(wd_gone) * 1000:.0f} ms median, {max(wd_gone) * 1000:.0f} ms max "
                         f"(client: {med(cl_gone) * 1000:.0f} / {max(cl_gone) * 1000:.0f} ms); "
                         f"abort.json by: {counts}; GPUs at 0 MiB in abort-done.json in {zero}/{len(by)} runs")]
    finally:
        site.close()


def bench_wd_abort_metrics(args: Any) -> list[Row]:
    """The watchdog's abort with its metrics places failing (watch.metrics.textfile a folder under a file, so every
    write fails; a Pushgateway that accepts connections and never answers), beside the same abort without metrics,
    interleaved: a failing metrics place must not slow the abort."""
    import socket

    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")))
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    blocker = site.tmp / "not-a-folder"
    blocker.write_text("a file\n")
    metrics = {"metrics": {"textfile": str(blocker / "textfile"), "pushgateway": f"http://127.0.0.1:{silent.getsockname()[1]}",
                           "keep_ended": 0}}
    try:
        failing, plain = [], []
        for i in range(args.abort_runs):
            failing.append(_watchdog_trial(site, i, metrics)[1])
            plain.append(_watchdog_trial(site, i)[1])
        med = statistics.median
        return [Row(f"watchdog abort with failing metrics places: FX trace -> GPUs drained ({len(failing)} runs)", failing,
                    baseline_name="the same abort without metrics", baseline=plain,
                    target="median within 20% of the baseline", met=med(failing) <= 1.2 * med(plain) + 0.01,
                    note="textfile: a folder under a regular file (every write fails); Pushgateway: accepts, never answers")]
    finally:
        silent.close()
        site.close()


# -- the watchdog killed around the race ------------------------------------------------------


def _killer_trainer(go: Path) -> str:
    """fake-train under a shell that counts every SIGINT the run gets and keeps the session up
    through the grace (so a second abort's Ctrl-C would be counted, not lost with the trainer)."""
    return (f"trap 'echo INT >> \"$GPUOPS_RUN_DIR/sigint\"' INT; {_trainer(go)}; "
            "while :; do sleep 0.05; done")


def _kill_now(d: Path) -> tuple[int, float]:
    """SIGKILL the watchdog that beats now; (its pid, when)."""
    pid = int(heartbeat(d)["pid"])
    at = time.time()
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
    return pid, at


def _back_after(d: Path, killed: int, at: float, timeout: float = 30.0) -> float | None:
    """Seconds from the kill to the next watchdog's first heartbeat (None: the run ended, none came)."""
    def new_beat() -> float | None:
        resumed = [e["ts"] for e in events(d) if e.get("event") == "watchdog_resumed" and e["ts"] >= at - 0.01]
        if resumed:
            return min(resumed)
        beat = heartbeat(d)
        return float(beat["ts"]) if beat.get("pid") not in (None, killed) else None

    try:
        return wait_for(new_beat, timeout, "the new watchdog's heartbeat") - at
    except RuntimeError:
        return None


def _kill_trial(site: Site, i: int, rnd: random.Random) -> dict[str, Any]:
    go = site.tmp / f"go-kill-{i}"
    rules = [{"name": "every-step", "pattern": r"^step \d+/", "action": "warn"}]
    d = _ready(site, site.playbook("kill", _killer_trainer(go), rules=rules, grace=1))
    time.sleep(rnd.uniform(0.3, 1.0))  # step lines (and warn matches) pile up before the kill
    delta = rnd.uniform(-0.6, 1.2)  # the race this long after the kill (negative: before it)
    if delta < 0:
        go.touch()
        time.sleep(-delta)
    killed, at = _kill_now(d)
    if delta >= 0:
        time.sleep(delta)
        go.touch()
    back = _back_after(d, killed, at)
    _stopped(d)
    wait_for(lambda: heartbeat(d).get("state") == "done", 60, "the watchdog to finish")
    evs = events(d)
    matches = [(e.get("rule"), e.get("offset")) for e in evs if e.get("event") == "match"]
    record = json.loads((d / "abort.json").read_text())
    sigint = d / "sigint"
    return {"delta": delta, "back": back, "caught": record.get("by") == "watchdog" and record.get("rule") == "fx-tracing-race",
            "duplicates": len(matches) - len(set(matches)), "abort_starts": sum(e.get("event") == "abort_start" for e in evs),
            "completions": sum(e.get("event") == "abort_completed" for e in evs),
            "sigints": len(sigint.read_text().split()) if sigint.exists() else 0}


def bench_wd_kill(args: Any) -> list[Row]:
    """Row 3: the watchdog SIGKILLed once in each of N runs, the race at a random moment around the kill."""
    site = Site(Path(tempfile.mkdtemp(prefix="gpuops-bench-")))
    rnd = random.Random(args.seed)
    try:
        trials = [_kill_trial(site, i, rnd) for i in range(args.kill_runs)]
    finally:
        site.close()
    n = len(trials)
    caught = sum(t["caught"] for t in trials)
    dups = sum(t["duplicates"] for t in trials)
    starts = sum(t["abort_starts"] > 1 for t in trials)
    signals = sum(t["sigints"] > 1 for t in trials)
    completed = sum(t["sigints"] > 1 and t["completions"] > 0 for t in trials)
    doubles = sum(t["abort_starts"] > 1 or t["sigints"] > 1 for t in trials)
    backs = [t["back"] for t in trials if t["back"] is not None]
    before = sum(t["delta"] < 0 for t in trials)
    detail = "; ".join(f"{t['delta']:+.2f}s:{'ok' if t['caught'] else 'MISSED'}/{t['sigints']}INT"
                       f"{'/completed' if t['completions'] else ''}" for t in trials)
    return [
        Row(f"watchdog SIGKILLed, race at a random moment ({n} runs): races caught", [float(caught)], unit="count",
            target=f"{n}/{n} caught, 0 duplicate matches, 0 double aborts",
            met=caught == n and dups == 0 and doubles == 0,
            note=f"{caught}/{n} caught by the watchdog (fx-tracing-race); {dups} duplicate match reports (same rule+offset); "
                 f"a second abort_start in {starts} runs, a second SIGINT in {signals} ({completed} of them after the "
                 f"watchdog was killed mid-abort and its successor completed it: abort_completed); "
                 f"race before the kill in {before} runs. "
                 f"Per run (race - kill: caught/SIGINTs the run got): {detail}"),
        Row("watchdog SIGKILLed: kill -> new watchdog's first heartbeat", backs, target="< 5 s",
            met=bool(backs) and max(backs) < 5.0, note=f"{len(backs)} restarts measured (supervisor delay 0.2 s)"),
    ]
