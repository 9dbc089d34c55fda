"""The playbook's watch section: rules, built-in rule actions, the stall clock and the quiet-failure detectors."""

from __future__ import annotations

from typing import Sequence as Seq

from gpuops.agent.wire import watchfile as wf
from gpuops.config import schema as s
from gpuops.config.playbook_model import CompileAfterWarmup, EnvVar, GpuMemory, RuleSpec, StallAuto, Throughput, Watch
from gpuops.config.yamlpos import Mapping, Node, Scalar
from gpuops.errors import ConfigError, Mark

WATCH_KEYS = (
    "builtin", "builtin_rules", "rules", "stall_timeout", "stall_auto", "sample_interval", "throughput",
    "gpu_memory", "compile_after_warmup", "recompiles", "stacks",
)
RULE_KEYS = ("name", "pattern", "action")
STALL_AUTO_KEYS = ("floor", "factor", "settle", "initial")
THROUGHPUT_KEYS = ("pattern", "min_ratio", "baseline", "settle", "window", "action")
GPU_MEMORY_KEYS = ("max_ratio", "max_swing_mib", "baseline", "settle", "window", "action")
COMPILE_KEYS = ("settle", "action", "cache_dir")
# Detectors report as rules of these names; their actions are set under their own keys.
DETECTORS = {
    "throughput-drop": "watch.throughput",
    "gpu-memory-shift": "watch.gpu_memory",
    "gpu-memory-volatile": "watch.gpu_memory",
    "compile-after-warmup": "watch.compile_after_warmup",
}
SLOW_RULE = "gpuops stops applying a rule that takes too long on a line"


def parse_watch(node: Node | None, env: Seq[EnvVar], warnings: list[str]) -> Watch:
    """The watch section as a Watch; findings that do not stop a run go to warnings."""
    compile_default = _compile_after_warmup(None, env)
    if node is None:
        return Watch(compile_after_warmup=compile_default)
    sec = s.Section(node, "watch", WATCH_KEYS)
    fields: dict[str, object] = {"compile_after_warmup": compile_default}
    if (n := sec.get("builtin")) is not None:
        fields["builtin"] = s.boolean(n)
    if (n := sec.get("builtin_rules")) is not None:
        if fields.get("builtin") is False:
            raise ConfigError(
                sec.key_mark("builtin_rules"),
                "watch.builtin_rules has no effect with watch.builtin: false (no built-in rule runs); "
                "remove one of them",
            )
        fields["builtin_rules"] = _builtin_rules(n)
    if (n := sec.get("rules")) is not None:
        fields["rules"] = _rules(n, warnings)
    fields["stall_timeout"], fields["stall_auto"] = _stall(sec)
    interval_node = sec.get("sample_interval")
    interval = s.seconds(interval_node, zero_ok=False, at_least=0.5) if interval_node else Watch.sample_interval
    fields["sample_interval"] = interval
    sampling = (interval, interval_node.mark if interval_node else None)
    if (n := sec.get("throughput")) is not None:
        fields["throughput"] = _throughput(n, sampling, warnings)
    if (n := sec.get("gpu_memory")) is not None:
        fields["gpu_memory"] = _gpu_memory(n, sampling)
    elif interval_node is not None:
        _check_window(GpuMemory.window, None, "watch.gpu_memory", sampling)
    if (n := sec.get("compile_after_warmup")) is not None:
        fields["compile_after_warmup"] = _compile_after_warmup(n, env)
    if (n := sec.get("recompiles")) is not None:
        fields["recompiles"] = s.boolean(n)
    if (n := sec.get("stacks")) is not None:
        fields["stacks"] = s.choice(n, wf.STACKS_POLICIES, "when to record the training's stacks")
    return Watch(**fields)  # type: ignore[arg-type]


def _builtin_rules(node: Node) -> tuple[tuple[str, str], ...]:
    from gpuops.agent.wire.signatures.matcher import builtin_rules  # stdlib only; compiled only when asked

    names = [rule.name for rule in builtin_rules()]
    actions: list[tuple[str, str]] = []
    for key, value in s.entries(node, "watch.builtin_rules"):
        name = key.text
        if name in DETECTORS:
            raise ConfigError(
                key.mark, f"'{name}' is a detector, not a built-in rule: set its action under {DETECTORS[name]}"
            )
        if name not in names:
            raise ConfigError(
                key.mark, f"unknown built-in rule '{name}' (built-in rules: {', '.join(names)}){s.suggest(name, names)}"
            )
        actions.append((name, s.choice(value, ("abort", "warn", "off"), f"an action for built-in rule '{name}'")))
    return tuple(actions)


def _rules(node: Node, warnings: list[str]) -> tuple[RuleSpec, ...]:
    rules: list[RuleSpec] = []
    seen: dict[str, Mark] = {}
    for index, item in enumerate(s.items(node, "rules (each with name, pattern, action)")):
        sec = s.Section(item, f"watch.rules[{index}]", RULE_KEYS)
        name_node = sec.require("name", "a rule name")
        name = s.name(name_node, "a rule name")
        if name in seen:
            first = seen[name]
            raise ConfigError(
                name_node.mark, f"duplicate rule name '{name}' (first at line {first.line}, column {first.column})"
            )
        seen[name] = name_node.mark
        pattern_node = sec.require("pattern", "a Python regular expression")
        pattern = s.text(pattern_node, "a Python regular expression")
        if not pattern:
            raise ConfigError(pattern_node.mark, f"rule '{name}' has an empty pattern, which would match every line")
        compile_pattern(pattern_node, pattern, f"pattern of rule '{name}'", warnings)
        action_node = sec.get("action")
        action = s.choice(action_node, ("abort", "warn"), "an action") if action_node else "abort"
        rules.append(RuleSpec(name=name, pattern=pattern, action=action))  # type: ignore[arg-type]
    return tuple(rules)


def compile_pattern(node: Node, pattern: str, what: str, warnings: list[str]) -> int:
    """Compile a user's regex (its error points into the pattern); warn if it can backtrack badly. -> groups."""
    import re
    import warnings as python_warnings

    try:
        with python_warnings.catch_warnings():
            python_warnings.simplefilter("ignore")
            regex = re.compile(pattern)
    except re.error as exc:
        where = node.mark_at(exc.pos) if isinstance(node, Scalar) and exc.pos is not None else node.mark
        raise ConfigError(where, f"{what} is not a valid Python regular expression: {exc.msg}") from None
    except (RecursionError, OverflowError, MemoryError):
        raise ConfigError(node.mark, f"{what} is too complex to compile") from None
    from gpuops.config.redos import risky

    why = risky(pattern)
    if why:
        warnings.append(
            f"{node.mark}: {what} can backtrack catastrophically: {why}, so a line that almost matches "
            f"takes exponential time; {SLOW_RULE}"
        )
    return regex.groups


def _stall(sec: s.Section) -> tuple[float, StallAuto | None]:
    """stall_timeout: seconds (0 = off) or auto, tuned by stall_auto."""
    node, auto_node = sec.get("stall_timeout"), sec.get("stall_auto")
    if isinstance(node, Scalar) and node.kind == "str" and node.text == "auto":
        auto = _stall_auto(auto_node) if auto_node is not None else StallAuto()
        return auto.initial, auto
    if sec.given("stall_auto"):
        now = f"stall_timeout is {s.describe(node)}" if node is not None else "stall_timeout is not set"
        raise ConfigError(sec.key_mark("stall_auto"), f"watch.stall_auto applies only with stall_timeout: auto ({now})")
    if node is None:
        return Watch.stall_timeout, None
    try:
        return s.seconds(node, zero_ok=True), None
    except ConfigError:
        hint = s.suggest(node.text, ["auto"]) if isinstance(node, Scalar) and node.kind == "str" else ""
        raise ConfigError(
            node.mark,
            f"expected a number of seconds >= 0, got {s.describe(node)} (0 turns it off; auto learns it from the run)"
            f"{hint}",
        ) from None


def _stall_auto(node: Node) -> StallAuto:
    sec = s.Section(node, "watch.stall_auto", STALL_AUTO_KEYS)
    fields: dict[str, float] = {}
    for key in ("floor", "settle", "initial"):
        if (n := sec.get(key)) is not None:
            fields[key] = s.seconds(n, zero_ok=False)
    if (n := sec.get("factor")) is not None:
        fields["factor"] = s.number(n, "a factor", above=1)
    return StallAuto(**fields)


def _throughput(node: Node, sampling: tuple[float, Mark | None], warnings: list[str]) -> Throughput:
    sec = s.Section(node, "watch.throughput", THROUGHPUT_KEYS)
    pattern_node = sec.require("pattern", "a Python regular expression whose first group is the figure")
    pattern = s.nonempty(pattern_node, "a Python regular expression whose first group is the figure")
    if compile_pattern(pattern_node, pattern, "watch.throughput.pattern", warnings) < 1:
        raise ConfigError(
            pattern_node.mark,
            "watch.throughput.pattern has no group: put the figure in parentheses, e.g. 'tok/s ([0-9.]+)'",
        )
    fields: dict[str, object] = _judging(sec, "watch.throughput", ("warn", "abort"), sampling)
    if (n := sec.get("min_ratio")) is not None:
        fields["min_ratio"] = s.number(n, "a ratio", above=0, below=1)
    return Throughput(pattern=pattern, **fields)  # type: ignore[arg-type]


def _gpu_memory(node: Node, sampling: tuple[float, Mark | None]) -> GpuMemory:
    switch = _on_off(node, "watch.gpu_memory", GPU_MEMORY_KEYS)
    if switch is not None:
        if switch:
            _check_window(GpuMemory.window, None, "watch.gpu_memory", sampling)
        return GpuMemory() if switch else GpuMemory(action="off")
    sec = s.Section(node, "watch.gpu_memory", GPU_MEMORY_KEYS)
    fields = _judging(sec, "watch.gpu_memory", ("warn", "abort", "off"), sampling, unit="MiB")
    if (n := sec.get("max_ratio")) is not None:
        fields["max_ratio"] = s.number(n, "a ratio", above=1)
    if (n := sec.get("max_swing_mib")) is not None:
        fields["max_swing_mib"] = s.integer(n, 1, what="a number of MiB")
    return GpuMemory(**fields)  # type: ignore[arg-type]


#: Each judging detector's default window (watch.json's defaults live in gpuops/agent/wire/watchfile.py).
_DEFAULT_WINDOW = {"watch.throughput": wf.THROUGHPUT["window"], "watch.gpu_memory": wf.GPU_MEMORY["window"]}


def _judging(
    sec: s.Section, where: str, actions: tuple[str, ...], sampling: tuple[float, Mark | None], unit: str = ""
) -> dict[str, object]:
    """baseline, settle, window and action: the keys every baseline detector shares."""
    fields: dict[str, object] = {}
    if (n := sec.get("baseline")) is not None:
        fields["baseline"] = _baseline(n, where, unit)
    for key in ("settle", "window"):
        if (n := sec.get(key)) is not None:
            fields[key] = s.seconds(n, zero_ok=False)
    if (n := sec.get("action")) is not None:
        fields["action"] = s.choice(n, actions, "an action")
    if fields.get("action") != "off":
        window = fields.get("window", _DEFAULT_WINDOW[where])
        _check_window(window, sec.get("window"), where, sampling)  # type: ignore[arg-type]
    return fields


def _baseline(node: Node, where: str, unit: str) -> float | None:
    if isinstance(node, Scalar) and node.kind == "str" and node.text == "last":
        return None
    try:
        return s.number(node, above=0)
    except ConfigError:
        what = f"a number > 0 ({unit})" if unit else "a number > 0"
        raise ConfigError(
            node.mark,
            f"expected last (the last successful run's) or {what} for {where}.baseline, got {s.describe(node)}",
        ) from None


def _check_window(window: float, node: Node | None, where: str, sampling: tuple[float, Mark | None]) -> None:
    """A window must hold two samples at least, or a single odd reading would decide."""
    interval, interval_mark = sampling
    if window >= 2 * interval:
        return
    why = "it must span at least two samples, or one odd sample would decide"
    if node is not None:
        raise ConfigError(
            node.mark,
            f"{where}.window {window:g} s is shorter than 2 x watch.sample_interval ({interval:g} s): {why}",
        )
    raise ConfigError(
        interval_mark,
        f"watch.sample_interval {interval:g} s is more than half of {where}.window (default {window:g} s): {why}; "
        f"set {where}.window to {2 * interval:g} or more",
    )


def _compile_after_warmup(node: Node | None, env: Seq[EnvVar]) -> CompileAfterWarmup:
    cache = next((v.value for v in env if v.name == "TORCHINDUCTOR_CACHE_DIR" and v.value), None)
    switch = _on_off(node, "watch.compile_after_warmup", COMPILE_KEYS) if node is not None else True
    if switch is not None:
        return CompileAfterWarmup(cache_dir=cache, action="warn" if switch else "off")
    assert node is not None
    sec = s.Section(node, "watch.compile_after_warmup", COMPILE_KEYS)
    fields: dict[str, object] = {"cache_dir": cache}
    if (n := sec.get("settle")) is not None:
        fields["settle"] = s.seconds(n, zero_ok=False)
    if (n := sec.get("action")) is not None:
        fields["action"] = s.choice(n, ("warn", "abort", "off"), "an action")
    if (n := sec.get("cache_dir")) is not None:
        fields["cache_dir"] = s.nonempty(n, "a directory (the inductor cache)")
    return CompileAfterWarmup(**fields)  # type: ignore[arg-type]


def _on_off(node: Node, where: str, keys: Seq[str]) -> bool | None:
    """true/false for a detector that is also a mapping; None when it is a mapping."""
    if isinstance(node, Mapping):
        return None
    if isinstance(node, Scalar) and node.kind == "bool":
        return s.boolean(node)
    raise ConfigError(
        node.mark, f"expected a mapping (keys: {', '.join(sorted(keys))}) or false for {where}, got {s.describe(node)}"
    )
