"""The run's report as a person opens it: one HTML file that draws its plots with nothing fetched, every value
escaped, secrets masked; rendered in headless Chromium and its screenshot's pixels counted.

The record is the agent's `report` reply (gpuops/agent/run/collect.py) for a run that warmed up two GPUs,
warned on throughput, hit the FX race, was restarted and hit it again: every kind of mark.
"""

from __future__ import annotations

import html.parser
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from gpuops.cli.report.writer import build

T = 1_796_300_000.0
SECRET = "hf_s3cr3t-report-0042"
HOSTILE = '<script>alert("x")</script>'


def mask(text: str) -> str:
    return text.replace(SECRET, "***")


def record(**over: Any) -> dict[str, Any]:
    """A restarted run's record as the agent's `report` tool replies it."""
    samples = []
    for i in range(240):
        t = T + 10 + i * 0.5
        slow = 60 <= i < 120
        samples.append([t, {"5": [1443 if not slow else 2900, 97], "6": [1460 if not slow else 2950, 88 if i % 9 else 40]},
                        (98_000 if slow else 505_000) + (i % 7) * 900, 1 if i < 120 else 2])
    events = [
        {"event": "match", "rule": "throughput-drop", "action": "warn", "ts": T + 45, "figures": {"ratio": 0.19},
         "line": "throughput 98k < 0.5 x baseline 505k"},
        {"event": "match", "rule": HOSTILE, "action": "abort", "ts": T + 69.0, "line": "RuntimeError: Detected ..."},
        {"event": "abort_start", "reason": "match", "rule": HOSTILE, "by": "watchdog", "ts": T + 69.01},
        {"event": "aborted", "reason": "match", "seconds": 0.4, "survivors": [], "ts": T + 69.4},
        {"event": "restart", "attempt": 2, "max_attempts": 3, "after": "fx-tracing-race", "compile_guard": True,
         "ts": T + 70},
        {"event": "attempt_started", "attempt": 2, "ts": T + 72},
        {"event": "stall", "seconds": 30, "stall_timeout": 30, "ts": T + 125},
        {"event": "abort_start", "reason": "stall", "by": "watchdog", "ts": T + 125.1},
    ]
    rec: dict[str, Any] = {
        "run": "20261201-102500-3fa9c2", "now": T + 130, "session_alive": False,
        "meta": {"id": "20261201-102500-3fa9c2", "playbook": "dflash-drafter", "session": "train", "ctid": 200,
                 "command": f"HF_TOKEN={SECRET} bash /root/start_training.sh", "started_at": "2026-12-01T10:25:00Z",
                 "warmup_seconds": {"5": 3.2, "6": 3.5}},
        "profile": {"outcome": "stalled", "exit_code": 8, "rule": None, "by": "watchdog", "attempts": 2,
                    "duration_s": 130.0, "ended": "2026-12-01T10:27:10Z", "command_exit_code": 130, "findings": []},
        "attempt": {"attempt": 2, "max_attempts": 3, "after": "fx-tracing-race", "compile_guard": True},
        "attempts": [{"attempt": 1, "training_started": T + 9, "excerpt": "Traceback ...\nRuntimeError: Detected ..."}],
        "abort": {"reason": "stall", "by": "watchdog", "excerpt": f"step 118 loss 1.2 token {SECRET}",
                  "stacks": [{"pid": 4242, "file": "stacks/4242.txt", "threads": 3, "via": "faulthandler"}]},
        "abort_done": {"session_gone_at": T + 126}, "training_started": T + 72, "exit_code_at": None,
        "telemetry": {"baseline": {"throughput": 505_695, "gpu_memory": {"5": 1443}, "source": "last",
                                   "run": "20261130-090000-aaaaaa"}},
        "warmups": [{"gpu": 5, "seconds": 3.2, "end": T + 3.2}, {"gpu": 6, "seconds": 3.5, "end": T + 6.8}],
        "samples": samples, "events": events,
        "stacks": [{"pid": "4242", "file": "stacks/4242.txt", "cut": False,
                    "text": 'Thread 0x7f (most recent call first):\n  File "train.py", line 12 in <module>\n'}],
    }
    rec.update(over)
    return rec


def page(rec: dict[str, Any] | None = None) -> str:
    return build([("ct200", rec or record(), {}, "", "", mask)], "gpuops report")


class Refs(html.parser.HTMLParser):
    """Every tag, and every attribute that could make a browser fetch something."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.fetching: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "xlink:href", "srcset", "poster", "data", "action") and value:
                self.fetching.append(f"{tag} {name}={value}")


def test_the_page_holds_everything_it_shows_and_links_to_nothing() -> None:
    text = page()
    refs = Refs()
    refs.feed(text)
    assert refs.tags.count("svg") == 3  # throughput, GPU memory, GPU utilisation
    assert refs.fetching == []
    assert {"script", "link", "iframe", "img", "object", "embed", "image", "use"}.isdisjoint(refs.tags), refs.tags
    assert not re.search(r"url\s*\(|@import|@font-face", text, re.I)
    # the only http(s) text is the SVG namespace name, which nothing fetches
    assert set(re.findall(r"https?://[^\s\"'<>)]+", text)) == {"http://www.w3.org/2000/svg"}


def test_every_value_is_escaped_and_secrets_are_masked() -> None:
    text = page()
    assert HOSTILE not in text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert SECRET not in text
    assert "HF_TOKEN=*** bash /root/start_training.sh" in text and "token ***" in text


def test_the_summary_says_what_ended_the_run_and_where() -> None:
    rows = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", page()))
    assert rows["outcome"] == "stalled" and rows["exit code"] == "8" and rows["attempts"] == "2 of 3"
    assert rows["run id"] == "20261201-102500-3fa9c2" and rows["playbook"] == "dflash-drafter"
    assert rows["target"] == "ct200 (CT 200)" and rows["stopped by"] == "watchdog"
    assert rows["warmup"] == "GPU 5 3.2 s, GPU 6 3.5 s" and rows["duration"] == "2:10 (130 s)"


def test_each_plot_marks_warmups_the_start_matches_warnings_the_abort_and_restarts() -> None:
    for plot in re.findall(r"<svg.*?</svg>", page(), re.S):
        labels = " | ".join(re.findall(r'class="marklabel"[^>]*>(.*?)</text>', plot))
        for mark in ("warmup GPU 5", "warmup GPU 6", "training starts", "warn: throughput-drop",
                     "&lt;script&gt;", "abort (watchdog)", "restart: attempt 2 of 3", "attempt 2 starts",
                     "stall: 30 s silent"):
            assert mark in labels, (mark, labels)
        assert plot.count('fill="#e8e8e8"') == 2  # the warmups' bands


def test_the_plots_draw_the_baselines_and_each_gpu() -> None:
    tp, mem, util = re.findall(r"<svg.*?</svg>", page(), re.S)
    assert "baseline 506k (20261130-090000-aaaaaa)" in tp and "<polyline" in tp
    assert "GPU 5 baseline 1443 MiB" in mem
    for plot in (mem, util):
        assert ">GPU 5</text>" in plot and ">GPU 6</text>" in plot and plot.count("<polyline") >= 2
    assert ">100</text>" in util  # utilisation's axis goes to 100 %


def test_a_run_without_samples_still_gets_labelled_empty_plots() -> None:
    text = page(record(samples=[], telemetry=None))
    assert text.count("<svg") == 3 and "no throughput figures" in text and "no samples" in text


def test_the_stacks_section_shows_each_file_with_its_summary() -> None:
    text = page()
    assert '<h3 id="stacks">Stacks</h3>' in text
    assert "process 4242 (stacks/4242.txt, threads 3, via faulthandler)" in text
    assert "line 12 in &lt;module&gt;" in text
    assert "Stacks" not in page(record(stacks=[]))


# -- in Chromium -----------------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Chromium's own service requests (time, updates, accounts), made by the browser whatever page it opens.
BROWSER_OWN = re.compile(r"^https?://([a-z0-9-]+\.)*(google\.com|googleapis\.com|gvt1\.com|gstatic\.com)/")


def chromium(page_path: Path, shot: Path, profile: Path) -> list[str]:
    """Open the page headless, screenshot it; every URL the network layer was asked for (all resolve nowhere)."""
    assert CHROMIUM
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
            "--disable-background-networking", "--disable-component-update", "--disable-extensions",
            f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=1",
            f"--screenshot={shot}", "--window-size=1200,2000", "--force-device-scale-factor=0.5", page_path.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert shot.exists(), done.stderr[-3000:]
    asked = re.findall(r"NotifyBeforeURLRequest: (\S+)", done.stderr)
    return [url for url in asked if not BROWSER_OWN.match(url)]


def png_rgb(path: Path) -> tuple[int, int, list[bytes]]:
    """A non-interlaced 8-bit RGB/RGBA PNG (what Chromium writes) as rows of RGB bytes."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(data):
        (size,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + size]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + size
    raw, stride, prev, rows = zlib.decompress(idat), width * channels, bytearray(width * channels), []
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        _unfilter(kind, line, prev, channels)
        prev = line
        rows.append(bytes(line) if channels == 3 else bytes(v for i, v in enumerate(line) if i % 4 != 3))
    return width, height, rows


def _unfilter(kind: int, line: bytearray, prev: bytearray, n: int) -> None:
    """PNG's five row filters undone in place (RFC 2083, 6.3)."""
    if kind == 1:
        for i in range(n, len(line)):
            line[i] = (line[i] + line[i - n]) & 0xFF
    elif kind == 2:
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prev))
    elif kind == 3:
        for i in range(len(line)):
            line[i] = (line[i] + ((line[i - n] if i >= n else 0) + prev[i]) // 2) & 0xFF
    elif kind == 4:
        for i in range(len(line)):
            a, b, c = (line[i - n], prev[i], prev[i - n]) if i >= n else (0, prev[i], 0)
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF


def count_near(rows: list[bytes], colour: str, tolerance: int = 40) -> int:
    want = bytes.fromhex(colour.lstrip("#"))
    return sum(1 for row in rows for i in range(0, len(row), 3)
               if sum(abs(row[i + k] - want[k]) for k in range(3)) <= tolerance)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs Debian's package)")
def test_chromium_draws_every_plot_and_the_page_asks_the_network_for_nothing(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text(page())
    leaked = tmp_path / "leaky.html"  # the check itself: a page that fetches is caught
    leaked.write_text('<html><body><img src="http://example.invalid/x.png"><p style="background:'
                      'url(https://example.invalid/y.png)">x</p></body></html>')
    assert set(chromium(leaked, tmp_path / "leaky.png", tmp_path / "p1")) == {
        "http://example.invalid/x.png", "https://example.invalid/y.png"}
    assert chromium(report, tmp_path / "shot.png", tmp_path / "p2") == []
    width, height, rows = png_rgb(tmp_path / "shot.png")
    assert (width, height) == (600, 1000)  # the 1200 x 2000 page at half scale: a quarter of the pixels to count
    # the GPUs' lines in the memory and utilisation plots, the throughput line, the warmup bands
    assert count_near(rows, "#0072B2") > 500 and count_near(rows, "#E69F00") > 250
    assert count_near(rows, "#7B2D8E") > 40 and count_near(rows, "#e8e8e8", 6) > 5000
    plain = sum(1 for row in rows for i in range(0, len(row), 3) if row[i:i + 3] in (b"\xff\xff\xff", b"\xf6\xf6\xf6"))
    assert plain < 0.9 * width * height  # not a blank page
