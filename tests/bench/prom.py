"""The real Prometheus tools on 127.0.0.1: node_exporter (its textfile collector alone), the Pushgateway, and a
Prometheus server scraping both every second, each on a free port with its own temporary folder; promtool.

Debian's packages (`prometheus`, `prometheus-node-exporter`, `prometheus-pushgateway`; .ci/run installs them).
`PromStack.start()` starts the three and waits until Prometheus has scraped both; `stop()` ends every process it
started (SIGTERM, then SIGKILL) and removes its folders. Nothing here listens beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from bench.waiting import wait_until

PROMETHEUS, PROMTOOL = "prometheus", "promtool"
NODE_EXPORTER, PUSHGATEWAY = "prometheus-node-exporter", "prometheus-pushgateway"
TOOLS = (PROMETHEUS, PROMTOOL, NODE_EXPORTER, PUSHGATEWAY)
#: Deadlines: a loaded two-core machine starts Prometheus in seconds, not milliseconds.
START_WITHIN = 60.0


def missing_tools() -> list[str]:
    """The tools of the stack that are not installed here."""
    return [t for t in TOOLS if shutil.which(t) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, data: bytes | None = None, timeout: float = 10.0) -> tuple[int, bytes]:
    """One request to a local server: (status, body); an HTTP error's status is returned too."""
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - 127.0.0.1 only
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def promtool_check(text: str) -> str:
    """`promtool check metrics` of an exposition: what it said (empty: no problem, no warning); fails on an error."""
    done = subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    said = (done.stdout + done.stderr).decode("utf-8", "replace").strip()
    assert done.returncode == 0, f"promtool check metrics failed ({done.returncode}): {said}\n{text[:4000]}"
    return said


class PromStack:
    """node_exporter + Pushgateway + Prometheus, started together and stopped together."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="gpuops-prom-"))
        self.textfile_dir = self.root / "textfile"
        self.textfile_dir.mkdir(mode=0o755)
        self.node_port, self.push_port, self.prom_port = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def node_url(self) -> str:
        return f"http://127.0.0.1:{self.node_port}"

    @property
    def pushgateway_url(self) -> str:
        return f"http://127.0.0.1:{self.push_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    def _start(self, name: str, *argv: str) -> None:
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the process writes it until stop()
        self.procs.append(subprocess.Popen([name, *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                           cwd=self.root, start_new_session=True))
        log.close()

    def start(self) -> "PromStack":
        try:
            self._start(NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{self.node_port}", "--collector.disable-defaults",
                        "--collector.textfile", f"--collector.textfile.directory={self.textfile_dir}")
            self._start(PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{self.push_port}")
            config = self.root / "prometheus.yml"
            config.write_text(json.dumps({
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
                "scrape_configs": [
                    {"job_name": "node", "static_configs": [{"targets": [f"127.0.0.1:{self.node_port}"]}]},
                    {"job_name": "pushgateway", "honor_labels": True,
                     "static_configs": [{"targets": [f"127.0.0.1:{self.push_port}"]}]},
                ]}))
            self._start(PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'data'}",
                        f"--web.listen-address=127.0.0.1:{self.prom_port}", "--storage.tsdb.retention.time=1h")
            wait_until(self._both_up, timeout=START_WITHIN, interval=0.2, message=self._why_not_up)
        except BaseException:
            self.stop()
            raise
        return self

    def _both_up(self) -> bool:
        for proc in self.procs:
            if proc.poll() is not None:
                raise AssertionError(f"{proc.args[0]} exited ({proc.returncode}): {self._logs()}")
        try:
            result = self.query('up{job=~"node|pushgateway"} == 1')
        except OSError:
            return False
        return len(result) == 2

    def _logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.root.glob("*.log"))

    def _why_not_up(self) -> str:
        return f"Prometheus scraping node_exporter and the Pushgateway\n{self._logs()}"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []
        shutil.rmtree(self.root, ignore_errors=True)

    # -- reading back ---------------------------------------------------------------------------------------------
    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query through Prometheus' HTTP API: its result vector; AssertionError on a bad query."""
        status, body = http("GET", f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        reply = json.loads(body)
        assert status == 200 and reply.get("status") == "success", f"query {expr!r}: {status} {reply}"
        data = reply["data"]
        return data["result"] if data["resultType"] == "vector" else [{"metric": {}, "value": data["result"]}]

    def values(self, expr: str) -> dict[str, float]:
        """An instant query's values by the series' labels (as `k=v,...`, sorted)."""
        out = {}
        for row in self.query(expr):
            key = ",".join(f"{k}={v}" for k, v in sorted(row["metric"].items()))
            out[key] = float(row["value"][1])
        return out

    def node_metrics(self) -> str:
        """What node_exporter serves now (its textfile collector's series among them)."""
        status, body = http("GET", f"{self.node_url}/metrics")
        assert status == 200, status
        return body.decode()

    def pushgateway_groups(self) -> list[dict[str, Any]]:
        """The Pushgateway's groups (its API): each with its `labels` (the grouping key) and metrics."""
        status, body = http("GET", f"{self.pushgateway_url}/api/v1/metrics")
        assert status == 200, status
        return list(json.loads(body)["data"])
