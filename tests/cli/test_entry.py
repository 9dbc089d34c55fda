"""The console entry point ends the process itself (os._exit, no teardown): nothing may be lost by it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCAL_INV = REPO / "inventories" / "local.yaml"


def run(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, stdin=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]


def test_every_line_of_piped_output_arrives_and_the_exit_code_is_kept(tmp_path: Path) -> None:
    # A pipe is block-buffered: the last lines are only written by the flush before the exit.
    bad = tmp_path / "bad.yaml"
    bad.write_text("hosts:\n  pve1: {address: [oops}\n")
    result = run("validate", "-i", str(bad), "--json")
    assert result.returncode == 2, result
    assert [json.loads(line)["outcome"] for line in result.stdout.splitlines()] == ["error"]
    ok = run("status", "-i", str(LOCAL_INV), "--json", env={**os.environ, "GPUOPS_TARGET": "local"})
    assert ok.returncode == 0, ok
    assert [json.loads(line)["target"] for line in ok.stdout.splitlines()] == ["local"]


def test_a_reader_that_is_gone_gives_141_and_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout now fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "gpuops", "status", "-i", str(LOCAL_INV), "--json"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def test_a_usage_error_from_click_keeps_its_exit_code_and_message() -> None:
    result = run("status", "--no-such-option")
    assert result.returncode == 2
    assert "No such option" in result.stderr
