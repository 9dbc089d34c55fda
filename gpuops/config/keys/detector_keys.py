"""A detector's section of the playbook's watch (`watch.<detector>`), read as its entry in
gpuops/agent/wire/detector_list.py declares it: each key by its kind, bounds and choices, each bad value a
ConfigError at its FILE:LINE:COL. No detector is named here: a new one is read by its entry alone."""

from __future__ import annotations

from typing import Any

from gpuops.agent.wire.detector_list import DetectorSpec, Key
from gpuops.config import schema as s
from gpuops.config.yamlpos import Mapping, Node, Scalar
from gpuops.errors import ConfigError
from gpuops.position import Mark

SLOW_RULE = "gpuops stops applying a rule that takes too long on a line"
#: Read first after the required keys: the keys every detector judged over a window shares.
SHARED_KINDS = ("baseline", "seconds", "action")


def parse_detector(spec: DetectorSpec, node: Node | None, env: dict[str, str], sampling: tuple[float, Mark | None],
                   warnings: list[str]) -> Any:
    """The detector's settings (None: absent and off by default); `false` turns a switchable one off.
    env: the playbook's env (keys with `env` default to a variable of it); sampling: watch.sample_interval
    and where it is written (a window must span two samples)."""
    where = "watch." + spec.key
    names = [k.name for k in spec.keys]
    if node is None:
        if not spec.default_on:
            return None
        _check_windows(spec, {}, None, where, sampling)
        return spec.defaults(env)
    switch = _on_off(node, where, names) if spec.switch else None
    if switch is not None:
        if switch:
            _check_windows(spec, {}, None, where, sampling)
            return spec.defaults(env)
        return spec.settings(**{**_env_defaults(spec, env), "action": "off"})
    sec = s.Section(node, where, names)
    fields: dict[str, Any] = _env_defaults(spec, env)
    first = [k for k in spec.keys if k.required] + [k for k in spec.keys if not k.required and k.kind in SHARED_KINDS]
    for key in first:
        got = sec.require(key.name, key.what or key.doc) if key.required else sec.get(key.name)
        if got is not None:
            fields[key.name] = value(spec, key, got, where, warnings)
    _check_windows(spec, fields, sec, where, sampling)
    for key in spec.keys:
        if key not in first and (got := sec.get(key.name)) is not None:
            fields[key.name] = value(spec, key, got, where, warnings)
    return spec.settings(**fields)


def _env_defaults(spec: DetectorSpec, env: dict[str, str]) -> dict[str, Any]:
    return {k.name: env[k.env] for k in spec.keys if k.env and env.get(k.env)}


def value(spec: DetectorSpec, key: Key, node: Node, where: str, warnings: list[str]) -> Any:
    """One key's value, read by its kind (wire/detector_list.KINDS)."""
    if key.kind == "seconds":
        return s.seconds(node, zero_ok=False)
    if key.kind == "number":
        return s.number(node, key.what or "a number", above=key.above, below=key.below)
    if key.kind == "integer":
        return s.integer(node, key.least, what=key.what or None)
    if key.kind == "action":
        return s.choice(node, spec.actions, "an action")
    if key.kind == "baseline":
        return _baseline(node, where, key.unit)
    text = s.nonempty(node, key.what or "a string")
    if key.kind == "pattern" and compile_pattern(node, text, f"{where}.{key.name}", warnings) < key.groups:
        raise ConfigError(node.mark, f"{where}.{key.name} has no group: {key.no_group}")
    return text


def _check_windows(spec: DetectorSpec, fields: dict[str, Any], sec: s.Section | None, where: str,
                   sampling: tuple[float, Mark | None]) -> None:
    """Each window of a detector that judges spans two samples at least (its default, where not written)."""
    if fields.get("action") == "off":
        return
    for key in spec.keys:
        if key.window:
            _check_window(fields.get(key.name, key.default), sec.get(key.name) if sec else None, where, sampling)


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


def _on_off(node: Node, where: str, keys: list[str]) -> bool | None:
    """true/false for a detector that is also a mapping; None when it is a mapping."""
    if isinstance(node, Mapping):
        return None
    if isinstance(node, Scalar) and node.kind == "bool":
        return s.boolean(node)
    raise ConfigError(
        node.mark, f"expected a mapping (keys: {', '.join(sorted(keys))}) or false for {where}, got {s.describe(node)}"
    )


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
