"""The compile guard (gpuops/agent/guard) against the strict stand-in torch (tests/standins/torch):
three threads first-calling compiled objects at once fail with the real FX error without it and
all run with it, for every way a trainer compiles; it keeps an existing sitecustomize, costs a
process that never imports torch nothing, and writes its counts into the run directory.

Every case runs in a fresh Python process started as a job's is: the guard's folder first on
PYTHONPATH, GPUOPS_COMPILE_GUARD=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUARD_PATH = REPO / "gpuops" / "agent" / "guard" / "pythonpath"
STANDINS = REPO / "tests" / "standins"
CASES = REPO / "tests" / "agent" / "guard_cases.py"
FX = "Detected that you are using FX to symbolically trace a dynamo-optimized function. This is not supported at the moment."
ALL_CASES = ["functions", "options", "decorator", "module", "module_compile", "nested", "eval", "train"]


def job_env(guard: bool, *front: str, **extra: str) -> dict[str, str]:
    """The environment of a job process: the guard's folder first when on, then `front`, then the stand-in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUOPS_", "PYTHON"))}
    parts = ([str(GUARD_PATH)] if guard else []) + list(front) + [str(STANDINS)]
    env.update(PYTHONPATH=os.pathsep.join(parts), TORCH_STANDIN_COMPILE_SECONDS="0.3", **extra)
    if guard:
        env["GPUOPS_COMPILE_GUARD"] = "1"
    return env


def run_case(case: str, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, str(CASES), case], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ALL_CASES)
def test_three_threads_fail_with_the_fx_error_without_the_guard(case: str) -> None:
    """The stand-in misbehaves as torch 2.11 does: overlapping first calls raise the real error."""
    out = run_case(case, job_env(False))
    assert out["guarded"] is False
    assert out["errors"] and set(out["errors"]) == {FX}


@pytest.mark.parametrize("case", ALL_CASES)
def test_three_threads_all_run_with_the_guard(case: str) -> None:
    out = run_case(case, job_env(True))
    assert out["guarded"] is True and out["torch"].endswith("+standin")
    assert out["errors"] == []
    assert out["counts"]["serialized"] >= 1 and out["counts"]["unguarded"] == 0


def test_a_first_calls_lazy_backward_compile_is_kept_exclusive_until_its_backward_ran() -> None:
    """The H200's module deadlock: a backward compiled lazily outside the first call overlapped another
    thread's forward compile. With the hold, each first call's backward ran before the next first call."""
    out = run_case("train", job_env(True))
    assert out["errors"] == []
    assert out["counts"]["backward_holds"] == 3 and out["counts"]["backward_timeouts"] == 0
    held = run_case("train", job_env(True, GPUOPS_COMPILE_GUARD_BACKWARD_WAIT="0.01"))
    assert held["errors"] and set(held["errors"]) == {FX}  # let go at once: the backward compiles race again


def test_forwards_in_threads_with_the_backward_in_the_main_thread_never_wait_out_the_hold() -> None:
    """parallel_apply's shape: a first call's thread ends before the main thread's backward, so holding the
    exclusive side for it would make every other thread's first call wait the whole backward wait."""
    out = run_case("parallel_apply", job_env(True, GPUOPS_COMPILE_GUARD_BACKWARD_WAIT="60"))
    assert out["errors"] == [] and out["counts"]["serialized"] == 6
    assert out["counts"]["backward_timeouts"] == 0, out["counts"]


def test_ctrl_c_while_waiting_on_the_shared_side_reaches_the_trainers_keyboardinterrupt_handler() -> None:
    env = {**job_env(True), "TORCH_STANDIN_COMPILE_SECONDS": "5"}  # the other thread's first call takes 5 s
    out = run_case("ctrl_c", env)
    assert out["errors"] == ["checkpoint saved"], out


@pytest.mark.parametrize("value", ["300s", "-1", "inf", "five"])
def test_a_malformed_backward_wait_leaves_the_training_running_and_says_so_once(value: str) -> None:
    env = job_env(True, GPUOPS_COMPILE_GUARD_BACKWARD_WAIT=value)
    done = subprocess.run([sys.executable, str(CASES), "train"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["guarded"] is True and out["errors"] == [] and out["counts"]["backward_holds"] == 3
    said = [line for line in done.stderr.splitlines() if "GPUOPS_COMPILE_GUARD_BACKWARD_WAIT" in line]
    assert said == [f"gpuops compile guard: GPUOPS_COMPILE_GUARD_BACKWARD_WAIT={value!r} is not a number of "
                    "seconds; using 300"], done.stderr


def test_each_new_signature_is_one_serialized_first_call_and_waits_are_counted() -> None:
    """functions: 3 objects, 1 signature each; eval: 1 object, 2 signatures (grad on, grad off)."""
    functions, evals = run_case("functions", job_env(True)), run_case("eval", job_env(True))
    assert (functions["counts"]["compiled"], functions["counts"]["serialized"]) == (3, 3)
    assert (evals["counts"]["compiled"], evals["counts"]["serialized"]) == (1, 2)
    assert functions["counts"]["waits"] >= 2 and functions["counts"]["waited_s"] > 0


def test_a_recompile_caused_by_global_state_is_not_serialized_as_the_docs_say() -> None:
    """docs/compile-guard.md: the key does not see global state, so that recompile runs under the
    shared lock and races as before (the guard serialized only the warm-up first calls)."""
    out = run_case("global_state", job_env(True))
    assert out["guarded"] is True and out["counts"]["serialized"] == 3
    assert out["errors"] and set(out["errors"]) == {FX}


def test_the_switch_is_the_variable_as_well_as_the_path() -> None:
    """The folder on PYTHONPATH without GPUOPS_COMPILE_GUARD=1 installs nothing (one process can opt out)."""
    env = job_env(True)
    env["GPUOPS_COMPILE_GUARD"] = "0"
    assert run_case("functions", env)["guarded"] is False


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    probe = "import os, sys, torch; print(os.environ.get('THEIRS'), torch.compile._gpuops_compile_guard, sys.modules['sitecustomize'].__file__)"
    done = subprocess.run([sys.executable, "-c", probe], env=job_env(True, str(site)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    theirs, guarded, module = done.stdout.split()
    assert (theirs, guarded, module) == ("ran", "True", str(site / "sitecustomize.py"))


def test_a_failing_sitecustomize_is_reported_as_python_does_and_the_guard_stays(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise ValueError('broken site')\n")
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.compile._gpuops_compile_guard)"],
                          env=job_env(True, str(site)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "True"
    assert "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nValueError: broken site" in done.stderr


def test_a_process_that_never_imports_torch_loads_no_torch_and_only_the_finder() -> None:
    probe = ("import sys, json\n"
             "finders = [type(f).__name__ for f in sys.meta_path]\n"
             "ours = sorted(m for m in sys.modules if m.startswith('_gpuops'))\n"
             "finder = sys.meta_path[0]\n"
             "print(json.dumps([finders[0], 'torch' in sys.modules, ours, finder.find_spec('json'), "
             "finder.find_spec('torchvision')]))\n")
    done = subprocess.run([sys.executable, "-c", probe], env=job_env(True), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, torch_loaded, ours, json_spec, tv_spec = json.loads(done.stdout)
    assert first == "TorchFinder" and torch_loaded is False
    assert ours == ["_gpuops_agent", "_gpuops_agent.guard", "_gpuops_agent.guard.importhook"]
    assert json_spec is None and tv_spec is None


def test_torch_is_patched_once_imported_and_the_finder_leaves() -> None:
    probe = ("import sys, torch\n"
             "print(torch.compile._gpuops_compile_guard, any(type(f).__name__ == 'TorchFinder' for f in sys.meta_path), "
             "type(torch.__spec__.loader).__name__, torch.compile.__wrapped__.__module__)\n")
    done = subprocess.run([sys.executable, "-c", probe], env=job_env(True), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "SourceFileLoader", "torch"]


def test_the_real_signature_and_its_errors_are_kept() -> None:
    """torch.compile's own checks still speak: mode and options together, a decorator given None."""
    probe = ("import torch\n"
             "for call in (lambda: torch.compile(abs, mode='max-autotune', options={}), lambda: torch.compile()(None)):\n"
             "    try:\n"
             "        call()\n"
             "    except RuntimeError as exc:\n"
             "        print(exc)\n"
             "print(torch.compile(abs, disable=True) is abs)\n")
    done = subprocess.run([sys.executable, "-c", probe], env=job_env(True), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Either mode or options can be specified, but both can't be specified at the same time.",
        "Model can't be None", "True"]


def test_dynamo_skips_the_guards_frames_and_inlines_through_its_wrapper() -> None:
    """An outer compiled function tracing a call of a guarded one must inline the original
    (`_torchdynamo_inline`), and dynamo's frame hook must not trace the guard's own frames."""
    probe = ("import torch\n"
             "from torch._dynamo import eval_frame\n"
             "def f(t):\n    return t + 1\n"
             "g = torch.compile(f)\n"
             "print(g._torchdynamo_inline is f, g.__code__ in eval_frame.SKIPPED, len(eval_frame.SKIPPED) >= 8)\n")
    done = subprocess.run([sys.executable, "-c", probe], env=job_env(True), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]


def test_counts_are_written_into_the_run_directory_and_a_process_that_compiles_nothing_writes_none(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_case("functions", job_env(True, GPUOPS_RUN_DIR=str(run_dir), GPUOPS_PHASE="warmup-5"))
    run_case("nocompile", job_env(True, GPUOPS_RUN_DIR=str(run_dir)))
    files = sorted((run_dir / "compile-guard-counts").iterdir())
    assert len(files) == 1 and files[0].suffix == ".json"
    record = json.loads(files[0].read_text())
    assert (record["compiled"], record["serialized"], record["phase"]) == (3, 3, "warmup-5")
    assert record["waited_s"] > 0 and record["pid"] == int(files[0].stem) and record["schema_version"] == 1
