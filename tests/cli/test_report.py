"""The run's report as a person opens it: one HTML file that draws its plots with nothing fetched, every value
escaped, secrets masked; rendered in headless Chromium and its screenshot's pixels counted.

The record is the agent's `report` reply (gpuops/agent/run/collect.py) for a run that warmed up two GPUs,
warned on throughput, hit the FX race, was restarted and hit it again: every kind of mark.
"""

from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest

from gpuops.cli.reports.html.writer import build

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
                    "text": 'Thread 0x7f (most recent call first):\n  File "train.py", line 12 in <module>\n\n'
                            f'Thread 0x80 (most recent call first):\n  File "/w/{HOSTILE}.py", line 3 in {HOSTILE}\n'}],
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


def test_the_stacks_section_shows_each_process_its_threads_and_where_the_training_is() -> None:
    text = page()
    assert '<h3 id="stacks">Stacks</h3>' in text
    assert ("process 4242: 2 threads via faulthandler; in the training&#x27;s code: &lt;module&gt; (train.py:12), "
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; (script&gt;.py:3)" in text)  # the file's name, escaped
    assert "stacks/4242.txt" in text and "line 12 in &lt;module&gt;" in text
    assert "Stacks" not in page(record(stacks=[]))


# -- figures that cannot be drawn ------------------------------------------------------------------
def test_figures_that_cannot_be_drawn_are_left_out_and_said_and_the_rest_is_drawn() -> None:
    rec = record(telemetry={"baseline": {"throughput": 1.7e308, "gpu_memory": {"5": float("inf")}}})
    rows = rec["samples"]
    for i, bad in enumerate((1.7e308, float("inf"), float("nan"), 10 ** 400)):  # a figure, then 3 a JSON reader makes
        rows[20 + i][2] = bad
    rows[30][2] = -0.0
    rows[40][1]["5"] = [10 ** 400, float("nan")]  # a sample's memory and utilisation
    rows.append([float("inf"), {"5": [1443, 97]}, 505_000, 2])  # a sample with no time to place it at
    text = page(rec)
    tp, mem, util = re.findall(r"<svg.*?</svg>", text, re.S)
    for plot in (tp, mem, util):
        assert "<polyline" in plot and not re.search(r"nan|inf", " ".join(re.findall(r'points="([^"]*)"', plot)))
    notes = re.findall(r'<p class="plotnote">(.*?)</p>', text)
    assert notes[0] == ("Left out of this plot: 4 figures that cannot be drawn (not finite, or past 1e+15): "
                        "1.7e+308 at 20.0s, inf at 20.5s, nan at 21.0s and 1 more.")
    assert notes[1] == "The baseline (1.7e+308) cannot be drawn: left out."
    assert notes[2:] == [
        "Left out of this plot: 1 sample that cannot be drawn (not finite, or past 1e+15): a number past 1e308 at 30.0s.",
        "The baseline (GPU 5 inf) cannot be drawn: left out.",
        "Left out of this plot: 1 sample that cannot be drawn (not finite, or past 1e+15): nan at 30.0s."]
    assert ">0</text>" in tp  # -0 is a figure: the axis still starts at 0


def test_a_record_the_report_cannot_draw_still_gets_its_section() -> None:
    text = build([("ct200", record(meta="not a mapping"), {"outcome": "failed", "exit_code": 6}, "run x exited 3", "",
                   mask)], "gpuops launch")
    assert "ct200: failed" in text and "run x exited 3" in text
    assert "The run&#x27;s records were read but could not be drawn: AttributeError" in text


# -- real H200 records -----------------------------------------------------------------------------
REAL = Path(__file__).parent.parent / "data" / "real_h200"
#: Python values where a person reads words (a dict, a list of them, None, True, False).
REPR = re.compile(r"\{'|\[\{|\['|\bNone\b|\bTrue\b|\bFalse\b")


def real_page(d: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], str]:
    """A run directory's record as the agent's `report` tool replies it (collect), and its page."""
    from gpuops.agent.run.collect import collect

    monkeypatch.setenv("TMUX_TMPDIR", str(tmp))  # the run's session is asked for on a tmux server of its own: none
    rec = collect(str(d))
    return rec, build([("ct200", rec, {}, "", "", mask)], "gpuops report")


def h200_restart(tmp: Path) -> Path:
    """The H200 restart (guard/restart: a cold-cache hang stalled, the watchdog restarted it under the guard, it
    succeeded, nobody attached) with the stacks the same hang left on the H200 (stacks/hang: 18 processes, taken
    before the abort) where the restart step files attempt 1's records: attempts/1/stacks/ and the list in
    attempts/1/abort-done.json (the restart record was made before stacks were taken). The exit code's time is
    its file's mtime, which git does not keep: set to the run's recorded end."""
    d = tmp / "20261201-210014-bbaa70"
    shutil.copytree(REAL / "guard" / "restart", d)
    shutil.copytree(REAL / "stacks" / "hang" / "stacks", d / "attempts" / "1" / "stacks")
    done = d / "attempts" / "1" / "abort-done.json"
    taken = json.loads((REAL / "stacks" / "hang" / "abort-done.json").read_text())["stacks"]
    done.write_text(json.dumps({**json.loads(done.read_text()), "stacks": taken}))
    os.utime(d / "exit_code", (1796158893.3, 1796158893.3))
    return d


def test_the_h200_restart_shows_attempt_1s_stacks_and_each_attempts_own_samples(tmp_path: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    d = h200_restart(tmp_path)
    _, text = real_page(d, tmp_path, monkeypatch)
    stacks = text[text.index('<h3 id="stacks">'):]
    assert "<summary>Attempt 1 (stalled, exit 8): 18 processes, 44 threads, taken before its abort</summary>" in stacks
    lines = re.findall(r'<details class="stack"><summary>(.*?)</summary>', stacks)
    assert lines[0] == ("process 2883: 8 threads via faulthandler, python3 /work/main/tools/real_drafter.py train --shapes "
                        "2048 --threads 3 --steps 5 --seconds 400; in the training&#x27;s code: _step (real_drafter.py:44) x2, "
                        "_step (real_drafter.py:47), train (real_drafter.py:157)")
    assert "<td>compile_fx_backward (torch/_inductor/compile_fx.py:2418)</td><td>none: library code only</td>" in stacks
    assert "<td>_step (/work/main/tools/real_drafter.py:44)</td>" in stacks and "attempts/1/stacks/2883.txt" in stacks
    # the training's own process first, then its compile workers (by pid)
    assert [re.match(r"process (\d+):", line).group(1) for line in lines] == ["2883", *sorted(
        (p.stem for p in (REAL / "stacks" / "hang" / "stacks").glob("*.txt") if p.stem != "2883"), key=int)]

    # Utilisation and memory: attempt 1's samples (attempts/1/samples.jsonl) then attempt 2's (samples.jsonl), as sampled.
    recorded = [json.loads(line)["g"]["0"] for f in (d / "attempts" / "1" / "samples.jsonl", d / "samples.jsonl")
                for line in f.read_text().splitlines()]
    _, mem, util = re.findall(r"<svg.*?</svg>", text, re.S)
    assert len(recorded) == 63 + 14
    assert values(mem) == pytest.approx([m for m, _ in recorded], abs=1)  # attempt 2's own: up to 913 MiB, 1's 801
    assert values(util) == pytest.approx([u for _, u in recorded], abs=0.5)  # every sample said 0 %: so is the line


def python_values(text: str, rec: dict[str, Any] | None = None) -> list[str]:
    """Python values on the page where words belong: outside <pre> (the training's own text) and the log lines a
    rule matched (the training's words, quoted)."""
    shown = html.unescape(re.sub(r"<pre>.*?</pre>|<style>.*?</style>", "", text, flags=re.S))
    for ev in (rec or {}).get("events") or []:
        shown = shown.replace(str(ev.get("line") or "\0"), "")
    return [shown[max(0, m.start() - 60):m.end() + 30] for m in REPR.finditer(shown)]


def test_no_page_of_a_recorded_h200_run_shows_python_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = sorted(m.parent for m in REAL.rglob("meta.json"))
    assert len(runs) >= 13
    for d in runs + [h200_restart(tmp_path)]:
        rec, text = real_page(d, tmp_path, monkeypatch)
        assert python_values(text, rec) == [], d
        happened = re.search(r'<table class="events">.*?</table>', text, re.S)
        assert happened is None or "=" not in happened.group(0).replace('="', ""), d  # no key=value dumps


def values(plot: str) -> list[float]:
    """A plot's line read back as values, through its y axis's lowest and highest tick."""
    ticks = [(float(y), float(label.replace(",", ""))) for y, label in
             re.findall(r'<line x1="[\d.]+" x2="[\d.]+" y1="([\d.]+)" y2="[\d.]+" class="grid"/><text[^>]*>([\d,.]+)</text>',
                        plot)]
    (y0, v0), (y1, v1) = ticks[0], ticks[-1]
    return [v0 + (y - y0) / (y1 - y0) * (v1 - v0) for line in re.findall(r'<polyline points="([^"]*)"', plot)
            for y in (float(p.split(",")[1]) for p in line.split())]


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
        line[:] = bytes((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
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
