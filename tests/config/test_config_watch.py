"""config/keys/watch.py: the watch section's keys load into their dataclasses; each bad value gets its FILE:LINE:COL."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench.cli import gpuops
from bench.playbooks import playbook_error, write_playbook

from gpuops.agent.wire.detector_list import DetectorSettings, by_key
from gpuops.config import load_playbook
from gpuops.config.playbook_model import StallAuto, Watch

LAUNCH = "launch: {session: s, command: c}\n"
# The settings class of each detector (wire/detector_list.py makes them from each one's keys).
Throughput, GpuMemory, CompileAfterWarmup = (by_key(k).settings for k in ("throughput", "gpu_memory",
                                                                         "compile_after_warmup"))


def write(tmp_path: Path, text: str) -> str:
    return write_playbook(tmp_path, LAUNCH, text)


def watch(tmp_path: Path, text: str) -> Watch:
    return load_playbook(write(tmp_path, text), environ={}).watch


def error(tmp_path: Path, text: str) -> str:
    """The message for a bad watch section, without its FILE: prefix (checked here)."""
    return playbook_error(write(tmp_path, text))


def test_defaults_without_a_watch_section(tmp_path: Path) -> None:
    assert watch(tmp_path, "") == Watch(
        builtin=True, rules=(), stall_timeout=900.0, builtin_rules=(), stall_auto=None, sample_interval=2.0,
        detectors=DetectorSettings((("throughput", None), ("gpu_memory", GpuMemory()),
                          ("compile_after_warmup", CompileAfterWarmup()), ("slow_node", by_key("slow_node").settings()),
                          *((k, by_key(k).settings()) for k in ("gpu_xid", "gpu_ecc", "gpu_lost", "gpu_slowdown")))),
        recompiles=False, host_kernel_log="auto",
    )
    assert GpuMemory().action == "warn" and CompileAfterWarmup().action == "warn"  # on by default
    # the GPUs' own health: abort what needs a reset, warn on a slowdown (docs/health.md)
    assert [by_key(k).settings().action for k in ("gpu_xid", "gpu_ecc", "gpu_lost", "gpu_slowdown")] == [
        "abort", "abort", "abort", "warn"]


def test_the_contracts_quiet_failure_keys_load_with_the_values_written(tmp_path: Path) -> None:
    """The contract's quiet-failure example, every value changed from its default: each reaches the Watch."""
    got = watch(tmp_path, r"""
        watch:
          sample_interval: 3
          throughput: {pattern: 'tok/s (\d+)', min_ratio: 0.4, baseline: last, settle: 90, window: 45, action: abort}
          gpu_memory: {max_ratio: 1.8, max_swing_mib: 1024, settle: 75, window: 40, action: abort}
          compile_after_warmup: {settle: 120, action: abort}
        """)
    assert got.sample_interval == 3.0
    assert got.detectors.of("throughput") == Throughput(pattern=r"tok/s (\d+)", min_ratio=0.4, baseline=None, settle=90.0,
                                                        window=45.0, action="abort")
    assert got.detectors.of("gpu_memory") == GpuMemory(max_ratio=1.8, max_swing_mib=1024, settle=75.0, window=40.0,
                                                       action="abort")
    compile_after_warmup = got.detectors.of("compile_after_warmup")
    assert (compile_after_warmup.settle, compile_after_warmup.action) == (120.0, "abort")
    # and none of them is what the section would be without these keys
    default = watch(tmp_path, "watch: {throughput: {pattern: 'tok/s (\\d+)'}}")
    assert got.sample_interval != default.sample_interval
    for key in ("throughput", "gpu_memory", "compile_after_warmup"):
        assert got.detectors.of(key) != default.detectors.of(key), key


def test_every_key_set(tmp_path: Path) -> None:
    got = watch(tmp_path, r"""
        watch:
          builtin_rules: {recompile-limit: abort, cuda-oom: warn, segfault: off}
          stall_timeout: auto
          stall_auto: {floor: 10, factor: 3.5, settle: 20, initial: 600}
          sample_interval: 0.5
          throughput: {pattern: '([0-9.]+) it/s', min_ratio: 0.25, baseline: 1800, settle: 5, window: 1, action: abort}
          gpu_memory: {max_ratio: 2, max_swing_mib: 512, baseline: 40960.5, settle: 1, window: 1, action: abort}
          compile_after_warmup: {settle: 5, action: abort, cache_dir: /scratch/inductor}
          recompiles: true
        """)
    assert got.builtin_rules == (("recompile-limit", "abort"), ("cuda-oom", "warn"), ("segfault", "off"))
    assert (got.stall_timeout, got.stall_auto) == (600.0, StallAuto(floor=10, factor=3.5, settle=20, initial=600))
    assert got.detectors.of("throughput") == Throughput(r"([0-9.]+) it/s", 0.25, 1800.0, 5.0, 1.0, "abort")
    assert got.detectors.of("gpu_memory") == GpuMemory(2.0, 512, 40960.5, 1.0, 1.0, "abort")
    assert got.detectors.of("compile_after_warmup") == CompileAfterWarmup(5.0, "abort", "/scratch/inductor")
    assert got.sample_interval == 0.5 and got.recompiles is True


def test_stall_timeout_auto_alone_takes_the_auto_defaults(tmp_path: Path) -> None:
    got = watch(tmp_path, "watch: {stall_timeout: auto}\n")
    assert (got.stall_timeout, got.stall_auto) == (900.0, StallAuto(30.0, 5.0, 60.0, 900.0))
    assert watch(tmp_path, "watch: {stall_timeout: 120}\n").stall_auto is None


def test_detectors_switched_off_with_false(tmp_path: Path) -> None:
    got = watch(tmp_path, "watch: {gpu_memory: false, compile_after_warmup: false}\n")
    assert got.detectors.of("gpu_memory") == GpuMemory(action="off")
    assert got.detectors.of("compile_after_warmup") == CompileAfterWarmup(action="off")
    assert watch(tmp_path, "watch: {gpu_memory: true}\n").detectors.of("gpu_memory") == GpuMemory()


def test_the_inductor_cache_defaults_to_the_playbooks_torchinductor_cache_dir(tmp_path: Path) -> None:
    from_env = watch(tmp_path, "env: {TORCHINDUCTOR_CACHE_DIR: /cache/ind}\n")
    assert from_env.detectors.of("compile_after_warmup").cache_dir == "/cache/ind"
    explicit = "env: {TORCHINDUCTOR_CACHE_DIR: /cache/ind}\nwatch: {compile_after_warmup: {cache_dir: /mine}}\n"
    assert watch(tmp_path, explicit).detectors.of("compile_after_warmup").cache_dir == "/mine"
    assert watch(tmp_path, "").detectors.of("compile_after_warmup").cache_dir is None  # the target's /tmp/torchinductor_<user>


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("watch: {builtin_rules: {cuda-om: warn}}", "2:25: unknown built-in rule 'cuda-om' (built-in rules: "),
        ("watch: {builtin_rules: {cuda-om: warn}}", "; did you mean 'cuda-oom'?"),
        ("watch: {builtin_rules: {throughput-drop: off}}",
         "2:25: 'throughput-drop' is a detector, not a built-in rule: set its action under watch.throughput"),
        ("watch: {builtin_rules: {cuda-oom: of}}",
         "2:35: expected an action for built-in rule 'cuda-oom': abort | warn | off, got 'of'; did you mean 'off'?"),
        ("watch: {builtin_rules: [cuda-oom]}", "2:24: expected a mapping for watch.builtin_rules, got a list"),
        ("watch: {builtin: false, builtin_rules: {cuda-oom: off}}",
         "2:25: watch.builtin_rules has no effect with watch.builtin: false (no built-in rule runs)"),
        ("watch: {stall_timeout: Auto}",
         "2:24: expected a number of seconds >= 0, got 'Auto' (0 turns it off; auto learns it from the run); "
         "did you mean 'auto'?"),
        ("watch: {stall_auto: {floor: 5}}",
         "2:9: watch.stall_auto applies only with stall_timeout: auto (stall_timeout is not set)"),
        ("watch: {stall_timeout: 0, stall_auto: {}}",
         "2:27: watch.stall_auto applies only with stall_timeout: auto (stall_timeout is 0)"),
        ("watch: {stall_timeout: auto, stall_auto: {factor: 1}}", "2:51: expected a factor > 1, got 1"),
        ("watch: {stall_timeout: auto, stall_auto: {flor: 1}}",
         "2:43: unknown key 'flor' in watch.stall_auto (expected one of: factor, floor, initial, settle); "
         "did you mean 'floor'?"),
        ("watch: {stall_timeout: auto, stall_auto: {initial: 0}}", "2:52: expected a number of seconds > 0, got 0"),
        ("watch: {sample_interval: 0.4}", "2:26: expected a number of seconds >= 0.5, got 0.4"),
        ("watch: {throughput: {pattern: 'tok/s \\d+'}}",
         "2:31: watch.throughput.pattern has no group: put the figure in parentheses, e.g. 'tok/s ([0-9.]+)'"),
        ("watch: {throughput: {pattern: 'tok/s (\\d+'}}",
         "2:38: watch.throughput.pattern is not a valid Python regular expression: missing ), unterminated subpattern"),
        ("watch: {throughput: {min_ratio: 0.5}}",
         "2:21: missing key 'pattern' in watch.throughput (a Python regular expression whose first group is the "
         "figure)"),
        ("watch: {throughput: {pattern: '(x)', min_ratio: 1}}", "2:49: expected a ratio > 0 and < 1, got 1"),
        ("watch: {throughput: {pattern: '(x)', baseline: 0}}",
         "2:48: expected last (the last successful run's) or a number > 0 for watch.throughput.baseline, got 0"),
        ("watch: {throughput: {pattern: '(x)', action: off}}", "2:46: expected an action: warn | abort, got 'off'"),
        ("watch: {throughput: {pattern: '(x)', windw: 3}}",
         "2:38: unknown key 'windw' in watch.throughput (expected one of: action, baseline, min_ratio, pattern, "
         "settle, window); did you mean 'window'?"),
        ("watch: {gpu_memory: no}",
         "2:21: expected a mapping (keys: action, baseline, max_ratio, max_swing_mib, settle, window) or false for "
         "watch.gpu_memory, got 'no'"),
        ("watch: {gpu_memory: {max_ratio: 1}}", "2:33: expected a ratio > 1, got 1"),
        ("watch: {gpu_memory: {max_swing_mib: 1.5}}", "2:37: expected a number of MiB (an integer >= 1), got 1.5"),
        ("watch: {gpu_memory: {baseline: lats}}",
         "2:32: expected last (the last successful run's) or a number > 0 (MiB) for watch.gpu_memory.baseline, "
         "got 'lats'"),
        ("watch: {gpu_memory: {action: abrt}}",
         "2:30: expected an action: warn | abort | off, got 'abrt'; did you mean 'abort'?"),
        ("watch: {compile_after_warmup: {cache_dir: ''}}",
         "2:43: expected a directory (the inductor cache), got an empty string"),
        ("watch: {compile_after_warmup: 1}",
         "2:31: expected a mapping (keys: action, cache_dir, settle) or false for watch.compile_after_warmup, got 1"),
        ("watch: {recompiles: yes}", "2:21: expected true or false, got 'yes'"),
    ],
)
def test_bad_values(tmp_path: Path, text: str, message: str) -> None:
    got = error(tmp_path, text + "\n")
    assert got.startswith(message) or (message.startswith(";") and message in got), got


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1e999", "-1e999", "'30'"])
@pytest.mark.parametrize(
    ("key", "column"),
    [("watch: {sample_interval: %s}", 26), ("watch: {stall_timeout: %s}", 24),
     ("watch: {stall_timeout: auto, stall_auto: {floor: %s}}", 50),
     ("watch: {throughput: {pattern: '(x)', settle: %s}}", 46),
     ("watch: {throughput: {pattern: '(x)', window: %s}}", 46),
     ("watch: {throughput: {pattern: '(x)', min_ratio: %s}}", 49),
     ("watch: {gpu_memory: {baseline: %s}}", 32), ("watch: {gpu_memory: {max_ratio: %s}}", 33),
     ("watch: {compile_after_warmup: {settle: %s}}", 40)],
)
def test_non_finite_and_quoted_numbers_are_refused_at_their_place(
    tmp_path: Path, key: str, column: int, value: str
) -> None:
    got = error(tmp_path, key % value + "\n")
    assert got.startswith(f"2:{column}: expected ") and f"got {value}" in got, got


def test_a_window_must_span_two_samples(tmp_path: Path) -> None:
    assert error(tmp_path, "watch: {sample_interval: 1, gpu_memory: {window: 1.5}}\n") == (
        "2:50: watch.gpu_memory.window 1.5 s is shorter than 2 x watch.sample_interval (1 s): it must span at least "
        "two samples, or one odd sample would decide"
    )
    assert error(tmp_path, "watch:\n  sample_interval: 20\n") == (
        "3:20: watch.sample_interval 20 s is more than half of watch.gpu_memory.window (default 30 s): it must span "
        "at least two samples, or one odd sample would decide; set watch.gpu_memory.window to 40 or more"
    )
    assert error(tmp_path, "watch: {sample_interval: 20, gpu_memory: false, throughput: {pattern: '(x)'}}\n") == (
        "2:26: watch.sample_interval 20 s is more than half of watch.throughput.window (default 30 s): it must span "
        "at least two samples, or one odd sample would decide; set watch.throughput.window to 40 or more"
    )
    off = watch(tmp_path, "watch: {sample_interval: 20, gpu_memory: {window: 5, action: off}}\n")
    assert off.detectors.of("gpu_memory").action == "off"  # a detector that is off judges nothing


def test_risky_patterns_are_validate_warnings_at_the_pattern(tmp_path: Path) -> None:
    pb = write(tmp_path, r"""
        watch:
          rules:
            - name: loss-nan
              pattern: 'loss (nan|inf)\b'
            - name: words
              pattern: '^(\w+\s?)*$'
          throughput:
            pattern: 'tok/s ((\d+)+) x'
        """)
    slow = (
        "so a line that almost matches takes exponential time; gpuops stops applying a rule that takes too long on a line"
    )
    warnings = [
        rf"{pb}:8:16: pattern of rule 'words' can backtrack catastrophically: (\w+\s?)* nests a repeat in a repeat, "
        f"which can split the same text in many ways, {slow}",
        rf"{pb}:10:14: watch.throughput.pattern can backtrack catastrophically: (\d+)+ nests a repeat in a repeat, "
        f"which can split the same text in many ways, {slow}",
    ]
    result = gpuops("validate", "-p", pb)
    assert result.code == 0 and result.err.splitlines() == [f"warning: {w}" for w in warnings], result
    assert result.text.startswith("ok: "), result  # the report on stdout, its warnings on stderr
    as_json = gpuops("validate", "--json", "-p", pb)
    assert as_json.code == 0 and as_json.events()[-1]["warnings"] == warnings, as_json


def test_bad_watch_keys_exit_2_through_validate(tmp_path: Path) -> None:
    pb = write(tmp_path, "watch:\n  gpu_memory:\n    max_swing_mb: 100\n")
    result = gpuops("validate", "-p", pb)
    assert result.code == 2 and result.err.splitlines()[0] == (
        f"gpuops: error: {pb}:4:5: unknown key 'max_swing_mb' in watch.gpu_memory (expected one of: action, "
        "baseline, max_ratio, max_swing_mib, settle, window); did you mean 'max_swing_mib'?"
    ), result
