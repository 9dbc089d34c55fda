"""The training runs on a terminal in its tmux pane (real tmux, the local target): what a person attached with
`tmux attach` sees and types, and that the log still gets every byte the watchdog needs.

What a user notices: `tmux capture-pane` of a detached run shows its lines; the training sees a terminal
(isatty() is True: tqdm draws, pdb reads); the log is byte for byte what it wrote (carriage returns,
CR LF, bytes that are not UTF-8: no newline turned into CR LF by the terminal); the window is named
after the run; pdb answers what is typed in the pane; a Ctrl-C typed there ends the run as
`interrupted`, by: pane, exit 130 (not `failed`).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench import LocalEnv, wait_until
from bench.cli import Running, gpuops

REPO = Path(__file__).resolve().parents[2]
INVENTORY = str(REPO / "inventories" / "local.yaml")
SESSION = "pane-test"
#: What the training writes, besides its first line: a progress bar's carriage returns, CR LF, a tab, bytes
#: that are not UTF-8, a line without its newline yet.
BLOB = b"step 1\rstep 2\rstep 3\nwindows\r\nraw \xff\xfe tab\there\npartial"

TRAIN = f"""
import os, sys, time
print("isatty", sys.stdin.isatty(), sys.stdout.isatty(), sys.stderr.isatty(), flush=True)
sys.stdout.buffer.write({BLOB!r}); sys.stdout.flush()
while not os.path.exists("go"):
    time.sleep(0.05)
"""

PDB = """
import time
secret = 6 * 7
breakpoint()
print("continued with", secret, flush=True)
"""

LOOP = """
import time
for i in range(100000):
    print("step", i, flush=True)
    time.sleep(0.1)
"""


def playbook(tmp_path: Path, script: str) -> str:
    (tmp_path / "train.py").write_text(script)
    pb = tmp_path / "pb.yaml"
    pb.write_text(f"name: pane\ntarget: local\nworkdir: {tmp_path}\nlaunch: {{session: {SESSION}, command: python3 train.py}}\n"
                  "watch: {stall_timeout: 0}\nabort: {grace: 5}\n")
    return str(pb)


def run_dir(env: LocalEnv) -> Path:
    (d,) = (env.home / ".gpuops" / "runs").iterdir()
    return d


def pane(env: LocalEnv) -> str:
    return env.tmux("capture-pane", "-p", "-t", f"={SESSION}:").stdout


def test_a_detached_run_shows_in_its_pane_on_a_terminal_and_its_log_is_every_byte(local_env: LocalEnv,
                                                                                  tmp_path: Path) -> None:
    pb = playbook(tmp_path, TRAIN)
    started = gpuops("launch", "--detach", "-y", "-i", INVENTORY, "-p", pb)
    assert started.code == 0, started
    wait_until(lambda: "partial" in pane(local_env), timeout=60, message="the training's output in its pane")
    shown = pane(local_env)
    assert "isatty True True True" in shown, shown  # stdin, stdout and stderr are the pane's terminal
    assert "step 3" in shown and "windows" in shown, shown
    d = run_dir(local_env)
    windows = local_env.tmux("list-windows", "-t", f"={SESSION}", "-F", "#{window_name}").stdout.split()
    assert windows == [d.name]  # named after the run, not `bash` or `python3`
    (tmp_path / "go").touch()
    wait_until(lambda: (d / "exit_code").exists(), timeout=60, message="the training to end")
    assert (d / "exit_code").read_text().strip() == "0"
    assert (d / "log").read_bytes() == b"isatty True True True\n" + BLOB  # byte for byte: no CR LF added


def test_pdb_in_the_pane_takes_what_is_typed_there(local_env: LocalEnv, tmp_path: Path) -> None:
    pb = playbook(tmp_path, PDB)
    assert gpuops("launch", "--detach", "-y", "-i", INVENTORY, "-p", pb).code == 0
    wait_until(lambda: "(Pdb)" in pane(local_env), timeout=60, message="breakpoint() to stop at pdb's prompt")
    local_env.tmux("send-keys", "-t", f"={SESSION}:", "p secret + 1", "Enter")
    wait_until(lambda: "\n43\n" in pane(local_env), timeout=30, message="pdb to answer in the pane")
    local_env.tmux("send-keys", "-t", f"={SESSION}:", "c", "Enter")
    d = run_dir(local_env)
    wait_until(lambda: (d / "exit_code").exists(), timeout=60, message="the training to go on and end")
    log = (d / "log").read_bytes()
    assert (d / "exit_code").read_text().strip() == "0" and b"continued with 42\n" in log
    assert b"(Pdb) p secret + 1\n43\n" in log  # what was typed, echoed as a terminal shows it, is in the log


def test_a_ctrl_c_typed_in_the_pane_is_an_interruption_by_pane(local_env: LocalEnv, tmp_path: Path) -> None:
    pb = playbook(tmp_path, LOOP)
    launch = Running("launch", "--json", "-y", "-i", INVENTORY, "-p", pb)
    launch.wait_for(lambda: '"line": "step 2"' in launch.out, "the launch to follow the training")
    local_env.tmux("send-keys", "-t", f"={SESSION}:", "C-c")  # a person at the pane; nobody else stops the run
    result = launch.finish()
    assert result.code == 130, result
    summary = result.events()[-1]
    assert (summary["outcome"], summary["exit_code"], summary["by"]) == ("interrupted", 130, "pane"), summary
    assert "Ctrl-C typed in its tmux pane" in summary["message"]
    d = run_dir(local_env)
    assert json.loads((d / "abort.json").read_text())["by"] == "pane"
    wait_until(lambda: (d / "abort-done.json").exists(), timeout=60, message="the watchdog to finish the stop")
    assert local_env.tmux("has-session", "-t", f"={SESSION}").returncode != 0
    assert b"^C" not in (d / "log").read_bytes()  # the terminal's echo of the Ctrl-C is the pane's, not the log's
    runs = gpuops("runs", "--json", "-i", INVENTORY, "-p", pb)
    (row,) = [e for e in runs.events() if e.get("run") == d.name]
    assert (row["outcome"], row["exit_code"], row["by"]) == ("interrupted", 130, "pane"), row
