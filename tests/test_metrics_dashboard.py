"""docs/grafana/gpuops.json, the dashboard to start from: what Grafana needs of it, and its queries over gpuops' own
families. Each panel's PromQL also runs against the real Prometheus (tests/test_metrics_prometheus.py).

Grafana is not packaged for Debian; its schema is: npm's @grafana/schema (the Dashboard, Panel and VariableModel
types Grafana generates from its CUE schema, and each panel plugin's Options). tools/grafana-dashboard-check.mjs
type-checks the dashboard against them with TypeScript; .ci/run installs both packages (best effort: without npm
that one test skips, the structural checks here still run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from gpuops.agent.wire.metric_table import GPU_FAMILIES, RUN_FAMILIES

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "gpuops.json"
#: Series of other exporters a panel may join with (DCGM exporter's, by the GPU's UUID).
OTHERS = re.compile(r"DCGM_FI_DEV_[A-Z_]+\Z")
#: The families a panel shows that gpuops does not expose yet (issue 36's GPU health counters): matched by name.
HEALTH = 'gpuops_gpu_health_.+'
PROMQL_WORDS = {"on", "by", "without", "and", "or", "unless", "sum", "max", "min", "avg", "count", "time",
                "label_replace", "group_left", "group_right", "increase", "rate", "offset", "bool", "ignoring"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queries(dash: dict[str, Any] | None = None) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of every panel."""
    for panel in (dash or dashboard())["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (identifiers that are no keyword, function or label)."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals out
    stripped = re.sub(r"\{[^}]*\}", "{}", stripped)  # matchers out
    stripped = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", r"\1", stripped)  # label lists out
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped))
    return {n for n in names if n not in PROMQL_WORDS}


def test_the_dashboard_has_what_grafana_needs_to_import_it() -> None:
    dash = dashboard()
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids)
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        g = panel["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        cells |= mine
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["title"] and panel["description"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs) and refs
    for panel, target in queries(dash):
        assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and target["expr"].strip()
        used = set(re.findall(r"\$([A-Za-z_]\w*)", target["expr"]))  # $1 is label_replace's
        assert used <= set(variables), (panel["title"], used - set(variables))


def test_every_query_reads_families_gpuops_exposes() -> None:
    """A misspelt family fails here before any Prometheus runs (and there as an empty panel)."""
    known = {f.name for f in RUN_FAMILIES} | {g.family.name for g in GPU_FAMILIES}
    shown: set[str] = set()
    for panel, target in queries():
        for name in metric_names(target["expr"]):
            assert name in known or OTHERS.match(name), f"panel {panel['title']!r} reads {name!r}"
            shown.add(name)
    for family in ("gpuops_run_state", "gpuops_throughput", "gpuops_throughput_baseline", "gpuops_log_silence_seconds",
                   "gpuops_stall_timeout_seconds", "gpuops_restarts_total", "gpuops_aborts_total",
                   "gpuops_gpu_memory_used_bytes", "gpuops_run_exit_code", "gpuops_watchdog_heartbeat_timestamp_seconds"):
        assert family in shown, f"no panel shows {family}"
    assert any(HEALTH in t["expr"] for _, t in queries()), "no panel for the GPU health families"


def grafana_check() -> list[str]:
    js = os.environ.get("GPUOPS_GRAFANA_CHECK_JS")
    if js and os.path.exists(js) and shutil.which("node"):
        return [shutil.which("node") or "node", js]
    pytest.skip("Grafana's schema (npm @grafana/schema and typescript) is not installed: .ci/run installs it where "
                "npm works and sets GPUOPS_GRAFANA_CHECK_JS")


def test_the_dashboard_passes_grafanas_own_schema_types(tmp_path: Path) -> None:
    argv = grafana_check()
    result = subprocess.run([*argv, str(DASHBOARD)], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout + result.stderr
    # the check checks: a misspelt key, a missing required option and an unknown panel type are each refused
    dash = dashboard()
    dash["panels"][0]["gridpos"] = dash["panels"][0].pop("gridPos")
    dash["panels"][1]["options"]["legend"].pop("placement")
    dash["panels"][2]["type"] = "timeseriez"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dash))
    refused = subprocess.run([*argv, str(bad)], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    said = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "gridpos" in said and "placement" in said and "timeseriez" in said, said
