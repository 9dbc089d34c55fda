"""The scripts a run needs on the target, built from the playbook as values (nothing executed here)."""

from __future__ import annotations

import os
import re
import shlex

from gpuops import tmux
from gpuops.command import Cmd, Raw, Script, Secret, export
from gpuops.config.model import Playbook
from gpuops.gpus import GPU_FIELDS
from gpuops.runs import run_dir

MARK = "@@gpuops "


def env_lines(playbook: Playbook, *, local: bool) -> list[Cmd]:
    """Exports of the playbook's env; secrets stay Secret so they render as *** when shown."""
    lines: list[Cmd] = []
    names = {v.name for v in playbook.env}
    if local and "PATH" not in names:
        lines.append(export("PATH", os.environ.get("PATH", "/usr/bin:/bin")))
    if "PYTHONUNBUFFERED" not in names:
        lines.append(export("PYTHONUNBUFFERED", "1"))
    for var in playbook.env:
        lines.append(export(var.name, Secret(var.value) if var.secret else var.value))
    return lines


def workdir_lines(playbook: Playbook, *, local: bool) -> list[Cmd | str]:
    """cd to the workdir: relative paths from the playbook's folder (local) or the home dir (remote)."""
    if local:
        base = os.path.dirname(playbook.path)
        path = os.path.normpath(os.path.join(base, os.path.expanduser(playbook.workdir or ".")))
        return [Raw(f"{Cmd('cd', '--', path).render()} || exit 126").text]
    lines: list[Cmd | str] = ['cd "$HOME"']
    wd = playbook.workdir
    if wd == "~" or (wd or "").startswith("~/"):
        # ~ and ~/... are the target user's home, as on a local target (the rest stays literal).
        lines.append(f'cd -- "$HOME"{shlex.quote(wd[1:]) if wd[1:] else ""} || exit 126')
    elif wd:
        # A relative path is taken from the home dir as written: "./" keeps bash's cd from reading
        # "-" as $OLDPWD and from searching $CDPATH.
        path = wd if wd.startswith("/") else "./" + wd
        lines.append(Raw(f"{Cmd('cd', '--', path).render()} || exit 126").text)
    return lines


def lock_script(session: str, holder: str, probe: Script, idle_release: int = 30) -> Script:
    """Take the target's launch lock for `session`, print the probe, hold until stdin ends or goes quiet."""
    q = shlex.quote(session)
    return Script(
        'G="$HOME/.gpuops"; mkdir -p "$G/locks" "$G/runs" "$G/sessions" || exit 70',
        f'L="$G/locks/"{q}',
        'exec 9>>"$L.lock"',
        # Held without a holder's name: a launcher that is just writing it, or a status probe peeking
        # (flock -n ... true): retry for a moment, so a refusal is real and names who holds the lock.
        "i=0; until flock -n 9; do",
        '  h=$(head -c 300 "$L.holder" 2>/dev/null)',
        f'  if [ -n "$h" ] || [ $i -ge 20 ]; then echo "{MARK}busy $h"; exit 75; fi',
        "  sleep 0.05; i=$((i+1))",
        "done",
        'stale=$(head -c 300 "$L.holder" 2>/dev/null)',
        Cmd("printf", "%s\\n", holder) + [Raw('>"$L.holder"')],
        f'[ -n "$stale" ] && echo "{MARK}stale $stale"',
        "{",
        *probe.lines,
        "} 9>&-",
        f'echo "{MARK}locked"',
        # Hold the lock while the launcher sends heartbeats; a silent launcher is a dead one. A launcher
        # that ends normally says `release`; one that died leaves its name in the holder file, so the
        # next launch reports the recovery (`stale`).
        "released=",
        f'while IFS= read -r -t {idle_release} line; do [ "$line" = release ] && {{ released=1; break; }}; done',
        # A launcher that died during warmup left its warmup running (holding the GPU): stop it, as
        # the launcher would have, before the lock is free. Quietly: our stdout may be gone with it.
        f'R=$(head -c 64 "$G/sessions/"{q} 2>/dev/null)',
        'case "$R" in ""|*[!0-9a-z-]*) R="";; esac',
        f"""if [ -n "$R" ] && grep -qsF '"phase":"warmup"' "$G/runs/$R/meta.json" && ! {tmux.alive(session)}; then""",
        "  (",
        'M="GPUOPS_RUN_ID=$R"',
        *kill_marked_script("GPUOPS_RUN_ID=").lines[1:],
        "  ) >/dev/null 2>&1",
        "fi",
        '[ -n "$released" ] && rm -f "$L.holder"',
        "true",
    )


def run_sh(playbook: Playbook, run_id: str, *, local: bool) -> Script:
    """The script tmux runs: env, workdir, the command with output to the log, the exit code recorded."""
    d = run_dir(run_id)
    return Script(
        "#!/usr/bin/env bash",
        f"# gpuops run {run_id} ({playbook.name})",
        f"D={d}",
        'echo "gpuops run ' + run_id + ': output goes to $D/log (follow it with: gpuops logs -f)"',
        *[line for line in _wd_for_run(playbook, local)],
        *env_lines(playbook, local=local),
        export("GPUOPS_RUN_ID", run_id),
        'export GPUOPS_RUN_DIR="$D"',
        # Trapped (not ignored) signals: the command gets them with default handling,
        # and this script survives to record the exit code.
        "trap 'true' INT TERM HUP QUIT",
        Cmd("bash", "-c", playbook.launch.command) + [Raw('>>"$D/log" 2>&1 </dev/null')],
        "code=$?",
        'printf "%s\\n" "$code" >"$D/exit_code.tmp" && mv -f "$D/exit_code.tmp" "$D/exit_code"',
    )


def _wd_for_run(playbook: Playbook, local: bool) -> list[Cmd | str]:
    lines = workdir_lines(playbook, local=local)
    out: list[Cmd | str] = []
    for line in lines:
        text = line.render() if isinstance(line, Cmd) else line
        if text.endswith("|| exit 126"):
            # The reason (bash's own words, less its "run.sh: line N: cd: " prefix) goes into the log.
            text = text[: -len("|| exit 126")] + (
                '2>"$D/cd.err" || { printf "gpuops: cannot cd to the workdir: %s; training not started\\n" '
                '"$(sed "s/^[^:]*: line [0-9]*: cd: //" "$D/cd.err")" >>"$D/log"; echo 126 >"$D/exit_code"; exit 126; }'
            )
        out.append(text)
    return out


def start_script(playbook: Playbook, run_id: str, meta_json: str, run_sh_script: Script) -> Script:
    """Write the run directory and start run.sh in a detached tmux session."""
    d = run_dir(run_id)
    session = playbook.launch.session
    return Script(
        'G="$HOME/.gpuops"',
        f"D={d}",
        'mkdir -p "$D" && chmod 700 "$D" || exit 70',
        STOPPED_CHECK,
        Cmd("printf", "%s\\n", meta_json) + [Raw('>"$D/meta.json"')],
        Cmd("printf", "%s\\n", run_sh_script) + [Raw('>"$D/run.sh"')],
        'chmod 700 "$D/run.sh"',
        ': >>"$D/log"',
        Cmd("printf", "%s\\n", run_id) + [Raw('>"$G/sessions/"' + shlex.quote(session))],
        f"{tmux.alive(session)} && {{ echo '{MARK}session-exists'; exit 75; }}",
        tmux.new_detached(session, '"$D"', "exec bash ./run.sh") + " 9>&- || exit 71",
        # Started once tmux created the session: a command that fails at once may already have ended.
        f"echo '{MARK}started'",
    )


def prepare_script(run_id: str, session: str, meta_json: str) -> Script:
    """Create the run directory before warmup, so a launch in progress is visible to status."""
    d = run_dir(run_id)
    return Script(
        'G="$HOME/.gpuops"',
        f"D={d}",
        'mkdir -p "$D" && chmod 700 "$D" || exit 70',
        Cmd("printf", "%s\\n", meta_json) + [Raw('>"$D/meta.json"')],
        Cmd("printf", "%s\\n", run_id) + [Raw('>"$G/sessions/"' + shlex.quote(session))],
    )


def write_record(run_id: str, name: str, record_json: str) -> Script:
    """Write one JSON record into the run directory, atomically."""
    d = run_dir(run_id)
    return Script(
        f"D={d}",
        Cmd("printf", "%s\\n", record_json) + [Raw(f'>"$D/{name}.tmp" && mv -f "$D/{name}.tmp" "$D/{name}"')],
    )


def warmup_script(playbook: Playbook, run_id: str, gpu: int, *, local: bool) -> Script:
    """One GPU's warmup in the foreground: its exit code is the stream's exit code."""
    assert playbook.warmup is not None
    command = render_warmup_command(playbook.warmup.command, gpu)
    d = run_dir(run_id)
    return Script(
        f"D={d}",
        *workdir_lines(playbook, local=local),
        *env_lines(playbook, local=local),
        export("GPUOPS_GPU", str(gpu)),
        export("GPUOPS_RUN_ID", run_id),
        export("GPUOPS_PHASE", f"warmup-{gpu}"),
        STOPPED_CHECK,
        Cmd("bash", "-c", command) + [Raw(f'</dev/null 2>&1 | tee -a "$D/warmup-{gpu}.log"')],
        "rc=${PIPESTATUS[0]}",
        STOPPED_CHECK,
        "exit $rc",
    )


# `gpuops stop` during a launch writes abort.json (reason stop) in the run directory: the
# launcher's next step sees it, says so and ends, so training never starts after a stop.
STOPPED_EXIT = 86
STOPPED_CHECK = f'[ -f "$D/abort.json" ] && {{ echo "{MARK}stopped"; exit {STOPPED_EXIT}; }}'



def render_warmup_command(template: str, gpu: int) -> str:
    """Replace {gpu} in one left-to-right pass; {{ and }} are literal braces."""
    return re.sub(r"\{\{|\}\}|\{gpu\}", lambda m: {"{{": "{", "}}": "}"}.get(m.group(0), str(gpu)), template)


def gpu_memory_script(gpus: tuple[int, ...]) -> Script:
    """Memory used on some GPUs, one `index, MiB` line each."""
    return Script(
        Cmd("nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", ",".join(map(str, gpus)))
    )


def kill_marked_script(marker: str, *, term_wait: float = 3.0) -> Script:
    """Kill every process whose environment holds `marker` (GPUOPS_RUN_ID=...): TERM, then KILL."""
    m = shlex.quote(marker)
    return Script(
        f"M={m}",
        'pids() { grep -lzxF -- "$M" /proc/[0-9]*/environ 2>/dev/null | sed -e "s,/proc/,," -e "s,/environ,," | grep -vx "$$"; }',
        'p=$(pids); [ -z "$p" ] && { echo "' + MARK + 'killed 0"; exit 0; }',
        "kill -TERM $p 2>/dev/null",
        f"i=0; while [ $i -lt {int(term_wait * 20)} ]; do p=$(pids); [ -z \"$p\" ] && break; sleep 0.05; i=$((i+1)); done",
        'p=$(pids); [ -n "$p" ] && kill -KILL $p 2>/dev/null',
        "i=0; while [ $i -lt 100 ]; do p=$(pids); [ -z \"$p\" ] && break; sleep 0.05; i=$((i+1)); done",
        'p=$(pids); echo "' + MARK + 'survivors $p"',
    )


def abort_script(
    session: str, run_id: str, signal: str, grace: float, record_json: str, drain_gpus: tuple[int, ...], max_mib: int,
    drain_timeout: float = 30.0,
) -> Script:
    """Record why, signal the foreground job, wait the grace, kill the session and every marked process, wait for GPUs."""
    d = run_dir(run_id)
    kill = kill_marked_script(f"GPUOPS_RUN_ID={run_id}")
    if signal == "INT":
        send = tmux.interrupt(session)
    else:
        send = (
            f"pp=$({tmux.pane_pid(session)}); "
            'if [ -n "$pp" ] && st=$(cat /proc/$pp/stat 2>/dev/null); then set -- ${st##*) }; '
            f'kill -{signal} -- -$6 2>/dev/null; fi'
        )
    lines: list = [
        f"D={d}",
        Cmd("printf", "%s\\n", record_json) + [Raw('>"$D/abort.json.tmp" && mv -f "$D/abort.json.tmp" "$D/abort.json"')],
        f"if {tmux.alive(session)}; then",
        f"  {send}",
        f"  i=0; while [ $i -lt {max(1, int(grace * 20))} ] && {tmux.alive(session)}; do sleep 0.05; i=$((i+1)); done",
        f"  {tmux.kill(session)}",
        "fi",
        f'echo "{MARK}session-gone $(date +%s.%N)"',
        "(",
        *kill.lines,
        ")",
    ]
    if drain_gpus:
        ids = ",".join(map(str, drain_gpus))
        lines += [
            "if command -v nvidia-smi >/dev/null 2>&1; then",
            f"  i=0; while [ $i -lt {int(drain_timeout * 10)} ]; do",
            f"    busy=$(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -i {ids} 2>/dev/null | awk -F', ' '$2 > {max_mib}' | tr '\\n' ' ')",
            '    [ -z "$busy" ] && break; sleep 0.1; i=$((i+1)); done',
            f'  echo "{MARK}gpus $(nvidia-smi --query-gpu={GPU_FIELDS} --format=csv,noheader,nounits -i {ids} 2>&1 | tr "\\n" ";")"',
            "fi",
        ]
    return Script(*lines)
