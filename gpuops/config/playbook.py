"""Playbook files: one training job, validated with file:line:col errors."""

from __future__ import annotations

import os
from typing import Mapping as Env

from gpuops.config import schema as s
from gpuops.config.keys.notify_keys import parse_notify
from gpuops.config.keys.restart_keys import parse_restart
from gpuops.config.keys.torchrun_keys import parse_nodes, parse_torchrun
from gpuops.config.keys.watch import parse_watch
from gpuops.config.playbook_model import (
    HEALTH_MODES,
    SECRET_NAME,
    Abort,
    EnvVar,
    Launch,
    Playbook,
    Preflight,
    Warmup,
)
from gpuops.config.yamlpos import Node, Scalar, load
from gpuops.errors import ConfigError
from gpuops.position import Mark

PLAYBOOK_KEYS = ("name", "target", "workdir", "env", "secrets", "preflight", "warmup", "launch", "watch", "abort",
                 "restart", "notify")
PREFLIGHT_KEYS = ("gpus", "max_memory_used_mib", "max_utilization_pct", "allow_processes", "health", "xid_window")
WARMUP_KEYS = ("gpus", "command", "timeout", "drain_timeout")
LAUNCH_KEYS = ("session", "command", "compile_guard", "nodes", "torchrun")
ABORT_KEYS = ("signal", "grace")
ENV_VALUE_KEYS = ("value", "from_env", "secret")
MAX_ENV_STRING = 131072  # Linux's MAX_ARG_STRLEN: execve refuses a longer NAME=value (its NUL counted)
MAX_ENV_TOTAL = 1 << 20  # all of env: ARG_MAX (often 2 MiB) also holds the target's own environment
MASK_MIN = 3  # the client masks secrets of at least this many characters (masking 'a' mangles every line)
SESSION_MAX = 100  # tmux takes more; gpuops names files after it (~/.gpuops/locks/<session>.holder)
# Signals that stop a process by default, by their portable names.
SIGNALS = ("INT", "TERM", "HUP", "QUIT", "KILL", "USR1", "USR2", "ABRT", "ALRM", "PIPE")


def load_playbook(path: str, *, environ: Env[str, str] = os.environ, need_env: bool = True) -> Playbook:
    """Read and validate a playbook; from_env values are read from environ now.

    need_env=False is for commands that only look at a run (logs, stop, status), which may run on
    another machine than the launcher's, without its from_env variables, and for validate (a CI
    lint without the secrets): an unset variable gives "" and EnvVar.from_env names it.
    """
    root = load(path)
    if root is None:
        raise ConfigError(Mark(path, 1, 1), "the file is empty; expected a playbook (launch: is required)")
    warnings: list[str] = []
    top = s.Section(root, "the playbook", PLAYBOOK_KEYS)
    name_node = top.get("name")
    target_node = top.get("target")
    env = _env(top, environ, need_env, warnings)
    playbook = Playbook(
        path=os.path.abspath(path),
        name=s.name(name_node, "a playbook name") if name_node else _stem(path),
        target=s.name(target_node, "a target name") if target_node else None,
        target_mark=target_node.mark if target_node else None,
        workdir=_workdir(top),
        env=env,
        preflight=_preflight(top.get("preflight")),
        warmup=_warmup(top.get("warmup")),
        launch=_launch(top.require("launch", "a mapping with session and command")),
        watch=(watch := parse_watch(top.get("watch"), env, warnings, environ, need_env)),
        abort=_abort(top.get("abort")),
        restart=parse_restart(top.get("restart"), watch, warnings),
        notify=parse_notify(top.get("notify"), environ, need_env),
        warnings=tuple(warnings),
    )
    if target_node is not None and playbook.launch.nodes:
        raise ConfigError(target_node.mark, "target beside launch.nodes: a job over launch.nodes runs on its nodes "
                          "and `target:` would be ignored; remove one of them")
    return playbook


def _workdir(top: s.Section) -> str | None:
    """The workdir; a plain `~` (YAML's null) is the home directory, as a user writing it means, not unset."""
    node = top.get("workdir")
    if node is not None:
        return s.nonempty(node, "a directory")
    written = top.written("workdir")
    if isinstance(written, Scalar) and written.style is None and written.text == "~":
        return "~"
    return None


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _identifier(node: Node, what: str) -> str:
    if isinstance(node, Scalar) and s.IDENTIFIER.match(node.text):
        return node.text
    raise ConfigError(
        node.mark, f"expected {what} (letters, digits and '_', not starting with a digit), got {s.describe(node)}"
    )


def _env(top: s.Section, environ: Env[str, str], need_env: bool, warnings: list[str]) -> tuple[EnvVar, ...]:
    listed: dict[str, Mark] = {}
    secrets_node = top.get("secrets")
    for item in s.items(secrets_node, "env variable names") if secrets_node else ():
        var = _identifier(item, "an environment variable name")
        if var in listed:
            raise ConfigError(item.mark, f"'{var}' is listed twice in secrets")
        listed[var] = item.mark
    variables: list[EnvVar] = []
    total = 0
    env_node = top.get("env")
    for key, node in s.entries(env_node, "env") if env_node else ():
        var = _identifier(key, "an environment variable name")
        value, secret, source, where = _env_value(var, node, environ, need_env)
        if secret is False and var in listed:
            raise ConfigError(key.mark, f"env '{var}' says secret: false but is listed in secrets")
        if secret is None:
            secret = var in listed or SECRET_NAME.search(var) is not None
        total += _env_size(var, value, source, where)
        if total > MAX_ENV_TOTAL:
            raise ConfigError(
                key.mark,
                f"env '{var}' brings the environment to {total} bytes (NAME=value strings), over gpuops' limit of "
                "1 MiB in all: Linux starts no program whose environment and arguments pass ARG_MAX (often 2 MiB), "
                "and the target adds its own",
            )
        if secret and 0 < len(value) < MASK_MIN:
            warnings.append(
                f"{key.mark}: secret env '{var}' is shorter than {MASK_MIN} characters: "
                "gpuops cannot mask it in its output"
            )
        variables.append(EnvVar(var, value, secret, source))
    names = {v.name for v in variables}
    for var, mark in listed.items():
        if var not in names:
            raise ConfigError(mark, f"secrets lists '{var}', which is not set in env{s.suggest(var, names)}")
    return tuple(variables)


def _env_size(var: str, value: str, source: str | None, where: Mark) -> int:
    """Bytes NAME=value takes in a process's environment, its NUL included; refused past MAX_ARG_STRLEN."""
    size = len(var) + len(value.encode("utf-8")) + 2
    if size > MAX_ENV_STRING:
        what = f"environment variable '{source}' (read by env '{var}' with from_env)" if source else f"env '{var}'"
        raise ConfigError(
            where,
            f"{what} is too large to pass: {var}=value is {size - 1} bytes, and Linux refuses any single "
            f"environment string over {MAX_ENV_STRING} bytes, its NUL included (MAX_ARG_STRLEN), so the job "
            "could never start with it",
        )
    return size


def _env_value(
    var: str, node: Node, environ: Env[str, str], need_env: bool = True
) -> tuple[str, bool | None, str | None, Mark]:
    """The value, the explicit secret flag (None: decided by name and the secrets list), the
    local variable it comes from (from_env), if any, and where the value is written."""
    what = f"a string or number for env '{var}'"
    if isinstance(node, Scalar):
        if node.kind == "null":
            raise ConfigError(node.mark, f"env '{var}' has no value; write \"\" for an empty string")
        return s.text(node, what), None, None, node.mark
    sec = s.Section(node, f"env '{var}'", ENV_VALUE_KEYS)
    secret_node = sec.get("secret")
    secret = s.boolean(secret_node) if secret_node else None
    value_node, from_node = sec.get("value"), sec.get("from_env")
    if value_node is not None and from_node is not None:
        raise ConfigError(sec.key_mark("from_env"), f"env '{var}' takes 'value' or 'from_env', not both")
    if from_node is not None:
        source = _identifier(from_node, "an environment variable name")
        if source not in environ and not need_env:
            return "", True if secret is None else secret, source, from_node.mark
        if source not in environ:
            raise ConfigError(
                from_node.mark, f"environment variable '{source}' is not set (env '{var}' reads it with from_env)"
            )
        value = environ[source]
        if not _is_utf8(value):  # os.environ keeps undecodable bytes as lone surrogates; never show them
            raise ConfigError(
                from_node.mark,
                f"environment variable '{source}' (read by env '{var}' with from_env) is not valid UTF-8",
            )
        return value, secret, source, from_node.mark
    if value_node is None:
        if sec.given("value"):
            raise ConfigError(sec.key_mark("value"), f"env '{var}' has no value; write \"\" for an empty string")
        raise ConfigError(sec.mark, f"missing key 'value' or 'from_env' in env '{var}'")
    return s.text(value_node, what), secret, None, value_node.mark


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _preflight(node: Node | None) -> Preflight:
    if node is None:
        return Preflight()
    sec = s.Section(node, "preflight", PREFLIGHT_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("gpus")) is not None:
        fields["gpus"] = s.gpu_list(n)
        fields["gpus_mark"] = n.mark
    if (n := sec.get("max_memory_used_mib")) is not None:
        fields["max_memory_used_mib"] = s.integer(n, 0)
    if (n := sec.get("max_utilization_pct")) is not None:
        fields["max_utilization_pct"] = s.integer(n, 0, 100)
    if (n := sec.get("allow_processes")) is not None:
        fields["allow_processes"] = s.boolean(n)
    if (n := sec.get("health")) is not None:
        fields["health"] = s.choice(n, HEALTH_MODES, "what preflight does with a GPU that needs a reset or service")
    if (n := sec.get("xid_window")) is not None:
        fields["xid_window"] = s.seconds(n, zero_ok=True)
    return Preflight(**fields)  # type: ignore[arg-type]


def _warmup(node: Node | None) -> Warmup | None:
    if node is None:
        return None
    sec = s.Section(node, "warmup", WARMUP_KEYS)
    gpus_node = sec.require("gpus", "the GPUs to warm up, in order")
    command_node = sec.require("command", "the warmup command; {gpu} is replaced by each GPU index")
    command = s.nonempty(command_node, "a command")
    _check_placeholders(command_node, command)
    fields: dict[str, object] = {}
    for key in ("timeout", "drain_timeout"):
        if (n := sec.get(key)) is not None:
            fields[key] = s.seconds(n, zero_ok=False)
    gpus = s.gpu_list(gpus_node)
    return Warmup(gpus=gpus, command=command, gpus_mark=gpus_node.mark, **fields)  # type: ignore[arg-type]


def _check_placeholders(node: Node, command: str) -> None:
    """Only {gpu} is substituted; '{{' and '}}' stand for literal braces."""
    escape = "write '{{' and '}}' for literal braces, e.g. ${{HOME}}"
    i = 0
    while i < len(command):
        c = command[i]
        if command.startswith(("{{", "}}"), i):
            i += 2
            continue
        if c == "}":
            raise ConfigError(_at(node, i), f"single '}}' in the warmup command: {escape}")
        if c == "{":
            end = command.find("}", i)
            if end < 0:
                raise ConfigError(_at(node, i), f"unclosed '{{' in the warmup command: {escape}")
            field = command[i : end + 1]
            if field != "{gpu}":
                raise ConfigError(
                    _at(node, i),
                    f"unknown placeholder '{field}' in the warmup command: only {{gpu}} is replaced; {escape}",
                )
            i = end + 1
            continue
        i += 1


def _at(node: Node, offset: int) -> Mark:
    return node.mark_at(offset) if isinstance(node, Scalar) else node.mark


def _launch(node: Node) -> Launch:
    sec = s.Section(node, "launch", LAUNCH_KEYS)
    session_node = sec.require("session", "a tmux session name")
    session = s.text(session_node, "a tmux session name")
    problem = _session_problem(session)
    if problem:
        raise ConfigError(session_node.mark, f"invalid tmux session name {session!r}: {problem}")
    command = s.nonempty(sec.require("command", "the training command"), "a command")
    guard = sec.get("compile_guard")
    nodes, marks = parse_nodes(sec.get("nodes"))
    torchrun = parse_torchrun(sec.get("torchrun"), nodes, sec.get("nodes"), node.mark)
    return Launch(session=session, command=command, compile_guard=s.boolean(guard) if guard is not None else False,
                  nodes=nodes, torchrun=torchrun, node_marks=marks)


def _session_problem(session: str) -> str | None:
    if not session:
        return "it is empty"
    if ":" in session or "." in session:
        return "tmux reads ':' and '.' as window and pane separators, so they cannot be used"
    if any(c.isspace() or not c.isprintable() for c in session):
        return "it cannot contain whitespace or control characters"
    if session.startswith("-"):
        return "it cannot start with '-' (tmux would read it as an option)"
    if not session.isascii():
        return "use ASCII characters only (tmux in a C locale replaces the others with '_', so names would collide)"
    if "#" in session:
        return "it cannot contain '#' (tmux expands #{...} and #(...) in names)"
    if ";" in session:
        return "it cannot contain ';' (tmux reads an argument ending in ';' as a command separator)"
    for c in ("\\", "$"):
        if c in session:
            return f"it cannot contain '{c}' (tmux stores it escaped, so the session could not be found again)"
    if "/" in session:
        return "it cannot contain '/' (gpuops keeps a file per session under ~/.gpuops)"
    if len(session) > SESSION_MAX:
        return f"it is longer than {SESSION_MAX} characters"
    return None


def _abort(node: Node | None) -> Abort:
    if node is None:
        return Abort()
    sec = s.Section(node, "abort", ABORT_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("signal")) is not None:
        fields["signal"] = _signal(n)
    if (n := sec.get("grace")) is not None:
        fields["grace"] = s.seconds(n, zero_ok=True)
    return Abort(**fields)  # type: ignore[arg-type]


def _signal(node: Node) -> str:
    expected = f"expected a signal name ({', '.join(SIGNALS)}, with or without SIG)"
    if isinstance(node, Scalar) and node.kind == "int":
        raise ConfigError(node.mark, f"{expected}, got the number {node.text}: signal numbers differ between systems")
    raw = s.text(node, "a signal name").upper()
    name = raw[3:] if raw.startswith("SIG") else raw
    if name not in SIGNALS:
        raise ConfigError(node.mark, f"{expected}, got {s.describe(node)}{s.suggest(name, SIGNALS)}")
    return name
