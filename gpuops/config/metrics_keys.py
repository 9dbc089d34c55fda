"""The playbook's `watch.metrics`: where the watchdog puts the run's series for Prometheus (docs/metrics.md).

None of it opens a port: `textfile` is a folder on the target that node_exporter's textfile collector reads,
`pushgateway` a URL the watchdog pushes to (written plain or as a notify webhook's is: `{from_env, secret}`).
"""

from __future__ import annotations

from typing import Mapping as Env

from gpuops.config import schema as s
from gpuops.config.notify_keys import secret_url
from gpuops.config.playbook_model import Metrics
from gpuops.config.yamlpos import Node
from gpuops.errors import ConfigError

METRICS_KEYS = ("textfile", "pushgateway", "keep_ended")
#: keep_ended at most: a day (a sweep takes files older than that away: agent/metrics/outlets.STALE_AFTER).
KEEP_ENDED_MAX = 86400.0


def parse_metrics(node: Node, environ: Env[str, str], need_env: bool) -> Metrics:
    """watch.metrics as Metrics; null or {} is none."""
    if s.is_null(node):
        return Metrics()
    sec = s.Section(node, "watch.metrics", METRICS_KEYS)
    fields: dict[str, object] = {}
    if (n := sec.get("textfile")) is not None:
        fields["textfile"] = _folder(n)
    if (n := sec.get("pushgateway")) is not None:
        url, secret, source = secret_url(n, "watch.metrics.pushgateway", environ, need_env, "a Pushgateway URL")
        fields.update(pushgateway=url or None, secret=secret, from_env=source)
    if (n := sec.get("keep_ended")) is not None:
        keep = s.seconds(n, zero_ok=True)
        if keep > KEEP_ENDED_MAX:
            raise ConfigError(n.mark, f"watch.metrics.keep_ended is at most {KEEP_ENDED_MAX:g} seconds (a day), "
                                      f"got {keep:g}")
        fields["keep_ended"] = keep
    return Metrics(**fields)  # type: ignore[arg-type]


def _folder(node: Node) -> str:
    """An absolute folder on the target, or one under the target user's home (~/...): node_exporter's
    --collector.textfile.directory, as the target sees it."""
    path = s.nonempty(node, "a folder on the target (node_exporter's --collector.textfile.directory)")
    if not (path.startswith("/") or path == "~" or path.startswith("~/")):
        raise ConfigError(node.mark, f"watch.metrics.textfile is a folder on the target written absolute (/...) or "
                                     f"under the target user's home (~/...), got {path!r}")
    if any(c in path for c in "\n\r"):
        raise ConfigError(node.mark, "watch.metrics.textfile holds a line break; expected a folder")
    return path

