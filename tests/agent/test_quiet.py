"""Quiet failures caught from outside (issue #12), by the watchdog, on the real-sshd bench: a run's
throughput and GPU memory against the last good run of the same playbook, memory that swings, kernels
compiled after training started; and `gpuops runs` listing the history from another machine.

Figures are REFERENCE.md's (torch 2.11, H200); settle and window are short so a test takes seconds.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench import wait_until
from bench.watchdog import events
from test_watch import GPUS, SESSION, Ct

FAST = {"settle": 2, "window": 3}


class Knobs(str):
    """fake-train's arguments, which `playbook` puts in a file that one fixed command line reads: what
    differs between these runs is the run's doing, not the command's (a baseline needs the same command)."""


def perf(*extra: str, seconds: float = 8) -> str:
    return Knobs(" ".join(["--mode", "perf", "--gpus", ",".join(map(str, GPUS)), "--interval", "0.1",
                           "--duration", str(seconds), *extra]))


def playbook(ct: Ct, command: str, *, throughput: dict | None = None, gpu_memory: Any = None,
             compile_after_warmup: Any = False, **watch: Any) -> Path:
    data = {
        "name": "quiet-test",
        "preflight": {"gpus": list(GPUS)},
        "launch": {"session": SESSION, "command": command},
        "watch": {"stall_timeout": 60, "sample_interval": 0.5,
                  "throughput": {"pattern": r"tok/s (\d+)", **FAST, **(throughput or {})},
                  "gpu_memory": {**FAST, **(gpu_memory or {})} if gpu_memory is not False else False,
                  "compile_after_warmup": compile_after_warmup, **watch},
        "abort": {"grace": 3},
    }
    if isinstance(command, Knobs):
        knobs = ct.tmp / "knobs"
        knobs.write_text(command + "\n")
        data["launch"]["command"] = "fake-train $(cat %s)" % shlex.quote(str(knobs))
    path = ct.tmp / "playbook.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def good_run(ct: Ct, tok: float = 505_695, mib: int = 1443, **kw: Any) -> None:
    """The baseline: a run of the playbook that succeeds (its profile is kept)."""
    playbook(ct, perf("--tok-per-s", str(tok), "--mib", str(mib - 900)), **kw)
    result = ct.gpuops("launch")
    assert result.code == 0, result
    profile = ct.run_dir() / "profile.json"
    wait_until(profile.exists, timeout=30, message="the good run's profile")


def detector_matches(result: Any) -> list[tuple[str, str]]:
    return [(e["rule"], e["action"]) for e in result.events() if e["event"] == "match" and e.get("figures")]


def test_a_5x_throughput_drop_is_stopped_when_the_playbook_says_abort(ct: Ct) -> None:
    good_run(ct)
    playbook(ct, perf("--tok-per-s", "98364", "--mib", "543", seconds=60), throughput={"action": "abort"})
    started = time.monotonic()
    result = ct.gpuops("launch", "--json")
    assert result.code == 7, result
    summary = result.events()[-1]
    assert summary["rule"] == "throughput-drop" and summary["by"] == "watchdog"
    (match,) = [e for e in result.events() if e["event"] == "match" and e["rule"] == "throughput-drop"]
    figures = match["figures"]
    assert figures["baseline"] == pytest.approx(505_695, rel=0.01) and figures["ratio"] == pytest.approx(0.19, abs=0.02)
    assert figures["baseline_run"] and "eager" in match["advice"] and "launch.compile_guard: true" in match["advice"]
    # settle 2 + window 3 + two sample intervals, plus start-up on a loaded machine
    assert time.monotonic() - started < 40
    ct.assert_run_gone()


def test_a_run_within_its_noise_is_left_alone(ct: Ct) -> None:
    good_run(ct)
    playbook(ct, perf("--tok-per-s", "470000", "--mib", "600", "--noise", "5"), throughput={"action": "abort"},
             gpu_memory={"action": "abort"})
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    assert detector_matches(result) == []


def test_gpu_memory_at_another_level_than_the_good_run_is_reported(ct: Ct) -> None:
    good_run(ct)
    playbook(ct, perf("--tok-per-s", "98364", "--mib", str(6249 - 900)))
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result  # warn: reported, the run goes on
    shifts = [e for e in result.events() if e["event"] == "match" and e["rule"] == "gpu-memory-shift"]
    assert sorted(e["figures"]["gpu"] for e in shifts) == sorted(GPUS)
    assert shifts[0]["figures"]["ratio"] == pytest.approx(4.33, abs=0.1)
    assert ("throughput-drop", "warn") in detector_matches(result)


def test_memory_close_to_the_good_run_is_not_a_shift(ct: Ct) -> None:
    good_run(ct)
    playbook(ct, perf("--tok-per-s", "505000", "--mib", str(1500 - 900)))
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    assert detector_matches(result) == []


def test_memory_that_swings_is_reported_without_any_baseline(ct: Ct) -> None:
    playbook(ct, perf("--swing", "1063:4449", "--swing-every", "0.5"), gpu_memory={"max_swing_mib": 2048})
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    rules = [r for r, _ in detector_matches(result)]
    assert "gpu-memory-volatile" in rules
    notes = [e for e in result.events() if e["event"] == "watchdog" and e.get("what") == "note"]
    assert any(n["rule"] == "no-baseline" for n in notes)  # said once: the level detectors cannot judge


def test_kernels_compiled_after_training_started_are_reported_a_warmed_run_is_not(ct: Ct) -> None:
    cache = ct.tmp / "inductor-cache"
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "warm.cubin").write_text("from the warmup\n")
    section = {"settle": 1, "action": "warn", "cache_dir": str(cache)}
    playbook(ct, perf(seconds=8), compile_after_warmup=section, gpu_memory=False)
    warmed = ct.gpuops("launch", "--json")
    assert warmed.code == 0 and detector_matches(warmed) == [], warmed
    playbook(ct, "fake-train " + perf("--cache-dir", shlex.quote(str(cache)), "--cache-files", "53", "--cache-after", "3",
                                      seconds=8),
             compile_after_warmup=section, gpu_memory=False)
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    (match,) = [e for e in result.events() if e["event"] == "match" and e["rule"] == "compile-after-warmup"]
    assert match["figures"]["measured"] == 53 and "warm every shape" in match["advice"]


def test_runs_lists_the_history_with_outcome_code_and_rule_from_another_machine(ct: Ct, tmp_path: Path) -> None:
    good_run(ct)
    playbook(ct, perf("--tok-per-s", "98364", seconds=60), throughput={"action": "abort"})
    assert ct.gpuops("launch").code == 7
    # Another machine: another HOME, no launcher state; only the inventory and the target.
    home = tmp_path / "other-laptop"
    home.mkdir()
    listed = ct.gpuops("runs", "--json", env={"HOME": str(home)})
    assert listed.code == 0, listed
    rows = [e for e in listed.events() if e["event"] == "run"]
    assert [(r["outcome"], r["exit_code"], r["rule"]) for r in rows[:2]] == [("aborted", 7, "throughput-drop"),
                                                                             ("succeeded", 0, None)]
    assert all({"ts", "target", "run", "playbook", "started"} <= set(r) for r in rows)
    assert rows[1]["throughput"]["median"] == pytest.approx(505_695, rel=0.01)
    text = ct.gpuops("runs", env={"HOME": str(home)}).text
    assert "throughput-drop" in text and "succeeded" in text and "506k" in text, text


def test_the_watchdog_keeps_telemetry_while_nobody_is_attached(ct: Ct) -> None:
    playbook(ct, perf("--tok-per-s", "505695", "--mib", "543", seconds=6))
    assert ct.gpuops("launch", "--detach").code == 0
    wait_until(lambda: (ct.run_dir() / "profile.json").exists(), timeout=60, message="the run's profile")
    samples = (ct.run_dir() / "samples.jsonl").read_text().splitlines()
    assert len(samples) >= 4
    profile = yaml.safe_load((ct.run_dir() / "profile.json").read_text())
    assert profile["outcome"] == "succeeded" and profile["gpus"][str(GPUS[0])]["median"] == 1443
    assert [e["event"] for e in events(ct.run_dir())][-1] == "done"


def test_status_shows_each_gpus_memory_over_the_last_minutes_and_throughput_against_the_baseline(ct: Ct) -> None:
    good_run(ct)
    playbook(ct, perf("--tok-per-s", "98364", "--swing", "1063:4449", "--swing-every", "0.5", seconds=120))
    assert ct.gpuops("launch", "--detach").code == 0
    wait_until(lambda: len((ct.run_dir() / "samples.jsonl").read_text().splitlines()) >= 6
               if (ct.run_dir() / "samples.jsonl").exists() else False, timeout=60, message="a few GPU samples")
    text = ct.gpuops("status").text
    gpu_line = next(line for line in text.splitlines() if line.startswith(f"ct200: gpu {GPUS[0]} "))
    assert re.search(r" memory [▁▂▃▄▅▆▇█ ]+ volatile$", gpu_line) and "▁" in gpu_line and "█" in gpu_line, gpu_line
    assert re.search(r"throughput 98,\d{3} = 0\.19x the baseline 505,\d{3} of run \S+", text), text
    (obj,) = ct.gpuops("status", "--json").events()
    gpu = next(g for g in obj["gpus"] if g["index"] == GPUS[0])
    assert gpu["memory_shape"] == "volatile" and min(gpu["memory_history_mib"]) < 1200 < 4000 < max(gpu["memory_history_mib"])
    assert ct.gpuops("stop").code == 0


def test_recompiles_true_gives_the_run_torch_logs_and_its_recompile_lines_count_as_compile_after_warmup(ct: Ct) -> None:
    line = ("V1201 10:25:09.832000 434 torch/_dynamo/guards.py:4760] [0/1] [__recompiles] Recompiling function "
            "flex_attention in /usr/lib/python3/torch/nn/attention/flex_attention.py:1468")
    job = (f'echo "TORCH_LOGS=$TORCH_LOGS"; sleep 3; echo {shlex.quote(line)}; fake-train ' + perf(seconds=4))
    playbook(ct, job, compile_after_warmup={"settle": 1}, gpu_memory=False, recompiles=True,
             throughput={"pattern": r"tok/s (\d+)"})
    result = ct.gpuops("launch", "--json")
    assert result.code == 0, result
    logs = [e["line"] for e in result.events() if e["event"] == "log"]
    assert "TORCH_LOGS=recompiles" in logs
    (match,) = [e for e in result.events() if e["event"] == "match" and e["rule"] == "compile-after-warmup"]
    assert match["figures"]["recompiles"] == 1 and match["figures"]["functions"] == ["flex_attention"]


def test_the_samples_count_the_compute_processes_on_each_gpu(ct: Ct) -> None:
    playbook(ct, perf(seconds=6), gpu_memory=False)
    result = ct.gpuops("launch")
    assert result.code == 0, result
    samples = [yaml.safe_load(line) for line in (ct.run_dir() / "samples.jsonl").read_text().splitlines()]
    counted = [s["p"] for s in samples if "p" in s]
    assert counted and all(c == {str(g): 1 for g in GPUS} for c in counted[1:]), counted  # the trainer, on each GPU


def test_a_slow_run_that_only_warned_is_not_the_next_runs_baseline_and_runs_shows_its_findings(ct: Ct) -> None:
    # issue 19.6: before, the warned run became the baseline and the next equally slow run went unflagged
    good_run(ct)
    for _ in range(2):
        playbook(ct, perf("--tok-per-s", "98364", "--mib", "543"))
        slow = ct.gpuops("launch", "--json")
        assert slow.code == 0, slow  # warn: reported, the run goes on and succeeds
        (match,) = [e for e in slow.events() if e["event"] == "match" and e["rule"] == "throughput-drop"]
        assert match["figures"]["baseline"] == pytest.approx(505_695, rel=0.01)
        wait_until((ct.run_dir() / "profile.json").exists, timeout=30, message="the slow run's profile")
    rows = [e for e in ct.gpuops("runs", "--json").events() if e["event"] == "run"]
    assert [(r["outcome"], r["findings"]) for r in rows[:3]] == [
        ("succeeded", ["throughput-drop"]), ("succeeded", ["throughput-drop"]), ("succeeded", [])]
    assert "throughput-drop" in ct.gpuops("runs").text
    # another batch size is another measure: no comparable baseline, said in a note, no drop
    playbook(ct, "fake-train " + perf("--tok-per-s", "98364", "--mib", "543"))
    other = ct.gpuops("launch", "--json")
    assert other.code == 0 and detector_matches(other) == [], other
    notes = [e for e in other.events() if e["event"] == "watchdog" and e.get("what") == "note"]
    assert any("no comparable baseline" in n.get("message", "") and "another command, env, workdir or GPUs" in n["message"]
               for n in notes), notes


def test_another_runs_warmup_in_the_same_cache_is_not_this_runs_compile(ct: Ct) -> None:
    # issue 19.8: two runs in one container share an inductor cache; the second one's warmup compiled
    # into it while the first trained, and the first reported (or, with abort, stopped on) compile-after-warmup
    cache = ct.tmp / "shared-inductor-cache"
    (cache / "triton").mkdir(parents=True)
    (cache / "triton" / "warm.cubin").write_text("from the first run's warmup\n")
    first = playbook(ct, perf(seconds=40), compile_after_warmup={"settle": 1, "action": "abort"}, gpu_memory=False)
    data = yaml.safe_load(first.read_text())
    data["env"] = {"TORCHINDUCTOR_CACHE_DIR": str(cache)}
    first.write_text(yaml.safe_dump(data, sort_keys=False))
    assert ct.gpuops("launch", "--detach").code == 0
    first_dir = ct.run_dir()
    wait_until(lambda: (first_dir / "samples.jsonl").exists(), timeout=60, message="the first run's samples")
    second = ct.tmp / "second.yaml"
    second.write_text(yaml.safe_dump({
        "name": "other-playbook", "env": {"TORCHINDUCTOR_CACHE_DIR": str(cache)}, "preflight": {"gpus": [7]},
        "warmup": {"gpus": [7], "command": "fake-train --mode perf --gpus {gpu} --interval 0.1 --duration 1.5 "
                   "--cache-dir %s --cache-files 53 --cache-after 0.3" % shlex.quote(str(cache)), "timeout": 60},
        "launch": {"session": "other", "command": "fake-train --mode perf --gpus 7 --interval 0.1 --duration 1"},
        "watch": {"stall_timeout": 60, "compile_after_warmup": False, "gpu_memory": False}}, sort_keys=False))
    other = ct.gpuops("launch", "--json", playbook=second)
    assert other.code == 0, other
    other_run = other.events()[-1]["run"]
    assert len(list((cache / "triton").rglob("kernel_*.cubin"))) == 53

    def verdict() -> list[dict]:
        return [e for e in events(first_dir) if e.get("rule") in ("compile-after-warmup", "cache-shared")]

    wait_until(verdict, timeout=30, message="the first run's watchdog judging the new cache files")
    (note,) = verdict()
    assert note["event"] == "note" and note["rule"] == "cache-shared" and note["figures"]["runs"] == [other_run]
    assert "not counted" in note["message"] and "watch.recompiles" in note["advice"]
    assert not (first_dir / "abort.json").exists()  # the first run trains on
    assert ct.gpuops("stop").code == 0
