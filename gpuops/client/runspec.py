"""What a run directory is made of, built from the playbook: meta.json, env.sh, the workdir, watch.json.

Sent to the target's `prepare` tool as one JSON document on stdin, so env values of any size
travel without the argv limit.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from gpuops.agent.wire import watchfile
from gpuops.agent.wire.detector_list import DetectorSettings
from gpuops.client.door.commands import dumps
from gpuops.client.play import Play, holder_id
from gpuops.command import Script, Secret, export


def meta(play: Play, run_id: str, phase: str, **extra: Any) -> dict[str, Any]:
    """The run's description (secrets masked), read back by status, logs, runs and the profile."""
    pb = play.playbook
    return {
        "id": run_id,
        "playbook": pb.name,
        "playbook_path": pb.path,
        "session": play.session,
        "target": play.target.name,
        "ctid": play.target.ctid,
        "command": play.mask(pb.launch.command),
        "workdir": pb.workdir,
        "env": {v.name: "***" if v.secret else _shown_value(v.value) for v in pb.env},
        "gpus": list(play.run_gpus),
        "phase": phase,
        "compile_guard": pb.launch.compile_guard,
        "launched_by": holder_id(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **({"job": play.node.meta()} if play.node is not None else {}),
        **extra,
    }


#: Longer env values are shown shortened in meta.json (the run gets them whole, through env.sh).
SHOWN_VALUE = 1024


def _shown_value(value: str) -> str:
    if len(value) <= SHOWN_VALUE:
        return value
    return value[: SHOWN_VALUE - 64] + f"... ({len(value)} characters; the run gets them all)"


def env_script(play: Play) -> Script:
    """Exports of the playbook's env (secrets stay Secret: they render as *** when shown)."""
    pb = play.playbook
    lines = []
    names = {v.name for v in pb.env}
    if play.local and "PATH" not in names:
        lines.append(export("PATH", os.environ.get("PATH", "/usr/bin:/bin")))
    if "PYTHONUNBUFFERED" not in names:
        lines.append(export("PYTHONUNBUFFERED", "1"))
    if getattr(pb.watch, "recompiles", False):
        torch_logs = next((v.value for v in pb.env if v.name == "TORCH_LOGS"), "")
        if "recompiles" not in torch_logs.split(","):
            lines.append(export("TORCH_LOGS", ",".join(filter(None, [torch_logs, "recompiles"]))))
    for var in pb.env:
        if var.name == "TORCH_LOGS" and getattr(pb.watch, "recompiles", False):
            continue
        lines.append(export(var.name, Secret(var.value) if var.secret else var.value))
    return Script(*lines)


def workdir(play: Play) -> str:
    """Where warmup and training run, as sh/common.sh's enter_workdir reads it."""
    pb = play.playbook
    if play.local:
        base = os.path.dirname(pb.path)
        return os.path.normpath(os.path.join(base, os.path.expanduser(pb.workdir or ".")))
    wd = pb.workdir or ""
    if not wd or wd == "~" or wd.startswith("~/") or wd.startswith("/"):
        return wd
    # A relative path is taken from the home dir as written: "./" keeps bash's cd from reading
    # "-" as $OLDPWD and from searching $CDPATH.
    return "./" + wd


def plain(value: Any) -> Any:
    """A config dataclass as JSON (None stays None)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def _detectors(detectors: DetectorSettings) -> DetectorSettings:
    """The playbook's detectors as watch.json carries them: one turned off is absent (None)."""
    return DetectorSettings(tuple((key, None if settings is None or settings.action == "off" else settings)
                        for key, settings in detectors.settings))


def watch_config(play: Play, run_id: str) -> watchfile.WatchConfig:
    """watch.json: everything the watchdog (or a client taking over) needs to watch and stop the run."""
    pb, w = play.playbook, play.playbook.watch
    return watchfile.WatchConfig(
        run=run_id,
        playbook=pb.name,
        session=play.session,
        gpus=tuple(play.run_gpus),
        max_memory_used_mib=pb.preflight.max_memory_used_mib,
        abort=watchfile.Abort(pb.abort.signal, pb.abort.grace),
        builtin=w.builtin,
        builtin_rules=tuple(w.builtin_rules or ()),
        rules=tuple(watchfile.Rule(r.name, r.pattern, r.action) for r in w.rules),
        stall=watchfile.Stall(w.stall_timeout, plain(w.stall_auto)),
        sample_interval=w.sample_interval,
        detectors=_detectors(w.detectors),
        recompiles=w.recompiles,
        env={v.name: v.value for v in pb.env if not v.secret},
        secrets=tuple(pb.secrets),
        restart=restart_config(play),
        stacks=w.stacks,
        notify=tuple(play.playbook.notify),
        job=watchfile.Job(**play.node.watch(), flight_recorder=pb.launch.torchrun is None or
                          pb.launch.torchrun.flight_recorder) if play.node is not None else None,
        metrics=watchfile.Metrics(textfile=w.metrics.textfile, pushgateway=w.metrics.pushgateway,
                                  secret=w.metrics.secret, keep_ended=w.metrics.keep_ended),
    )


def notify_config(play: Play) -> list[dict[str, Any]]:
    """The channels as watch.json's `notify` carries them, each with its kind (what notify-test sends too; a
    secret URL travels as watch.json's secrets do: in the run directory, mode 0600, never shown)."""
    return [watchfile.channel_record(c) for c in play.playbook.notify]


def restart_config(play: Play) -> watchfile.Restart | None:
    """watch.json's `restart`: what the watchdog needs to start training again (None: no restarts)."""
    pb = play.playbook
    r = pb.restart
    if r is None or r.max == 0:
        return None
    guard = r.compile_guard if r.compile_guard is not None else bool(getattr(pb.launch, "compile_guard", False))
    warm = pb.warmup if r.warmup else None
    return watchfile.Restart(
        max=r.max, on=tuple(r.on), compile_guard=guard, delay=r.delay, warmup=warm is not None,
        warmup_spec=None if warm is None else watchfile.Warmup(tuple(warm.gpus), warm.command, warm.timeout,
                                                               warm.drain_timeout))


def prepare_spec(play: Play, run_id: str, *, shown: bool = False) -> bytes:
    """The JSON document `prepare` reads on stdin; `shown`: as a dry run prints it, every secret masked
    before it is quoted or JSON-escaped (either respells a value holding ' or ")."""
    watch = watchfile.compose(watch_config(play, run_id))
    env = env_script(play).render(display=shown, mask=play.mask if shown else None) + "\n"
    command = play.playbook.launch.command
    again = play.playbook.restart.command if play.playbook.restart is not None and watch["restart"] else None
    if shown:
        watch["secrets"] = ["***" for _ in watch["secrets"]]
        watch["notify"] = [watchfile.channel_record(c, shown=True) for c in play.playbook.notify]
        if watch["metrics"]["secret"] and watch["metrics"]["pushgateway"]:
            watch["metrics"] = {**watch["metrics"], "pushgateway": "***"}
        if watch.get("job"):
            watch["job"] = {**watch["job"], "key": "***"}
        command = play.mask(command)
        again = play.mask(again) if again else again
    return dumps({
        "session": play.session,
        "meta": meta(play, run_id, "warmup"),
        "env": env,
        "command": command,
        "workdir": workdir(play),
        "watch": watch,
        "compile_guard": play.playbook.launch.compile_guard,
        **({"restart_command": again} if again else {}),
    }).encode()
