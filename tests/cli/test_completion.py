"""Shell completion through click's protocol and in the real shells: targets and groups from the
inventory on the command line or in GPUOPS_INVENTORY, files for -i/-p/--junit, nothing on a bad file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bench import SshServer, write_inventory

REPO = Path(__file__).resolve().parents[2]
GPUOPS = Path(sys.executable).parent / "gpuops"  # the console script a user's shell runs
ANSIBLE = """\
[h200]
ct200 ansible_host=10.1.2.6 proxmox_vmid=200
ct201 ansible_host=10.1.2.6 proxmox_vmid=201
[gpu_nodes:children]
h200
[spare]
cpu1 ansible_host=10.1.2.7
"""


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUOPS_", "COMP_", "_GPUOPS"))}
    base["PATH"] = f"{GPUOPS.parent}:{base.get('PATH', '')}"
    return {**base, **extra}


def complete(shell: str, words: str, cword: int | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    """One completion request as the shell's function sends it (fish passes the incomplete word, not an index)."""
    argv = words.split(" ")
    cw = argv[-1] if shell == "fish" else str(len(argv) - 1 if cword is None else cword)
    return subprocess.run([str(GPUOPS)], env=env(COMP_WORDS=words, COMP_CWORD=cw, _GPUOPS_COMPLETE=f"{shell}_complete", **extra),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def values(shell: str, result: subprocess.CompletedProcess[str]) -> list[tuple[str, str]]:
    """(type, value) pairs in each shell's format."""
    assert result.returncode == 0 and result.stderr == "", result
    if shell == "zsh":
        lines = result.stdout.splitlines()
        return [(lines[i], lines[i + 1]) for i in range(0, len(lines), 3)]
    if shell == "fish":
        return [tuple(line.split("\t")[0].split(",", 1)) for line in result.stdout.splitlines()]  # type: ignore[misc]
    return [tuple(line.split(",", 1)) for line in result.stdout.splitlines()]  # type: ignore[misc]


@pytest.fixture(scope="module", autouse=True)
def console_script() -> None:
    assert GPUOPS.exists(), f"{GPUOPS}: install gpuops (pip install -e .) so its console script exists"


@pytest.fixture
def ansible_inv(tmp_path: Path) -> Path:
    path = tmp_path / "hosts"
    path.write_text(ANSIBLE)
    return path


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_target_completes_targets_and_groups_from_the_inventory_option(shell: str, ansible_inv: Path) -> None:
    got = values(shell, complete(shell, f"gpuops status -i {ansible_inv} -t "))
    assert got == [("plain", n) for n in ("ct200", "ct201", "cpu1", "all", "h200", "gpu_nodes", "spare")]
    prefix = values(shell, complete(shell, f"gpuops status --inventory {ansible_inv} --target c"))
    assert prefix == [("plain", "ct200"), ("plain", "ct201"), ("plain", "cpu1")]
    # launch takes several targets too (-t repeated, a group): groups are offered there as well.
    several = values(shell, complete(shell, f"gpuops launch -i {ansible_inv} -t "))
    assert several == got


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_inventory_may_come_from_gpuops_inventory(shell: str, ansible_inv: Path) -> None:
    got = values(shell, complete(shell, "gpuops logs -t ct", GPUOPS_INVENTORY=str(ansible_inv)))
    assert got == [("plain", "ct200"), ("plain", "ct201")]


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_files_complete_as_files(shell: str) -> None:
    for words in ("gpuops launch -p ", "gpuops status -i inv", "gpuops launch --junit rep"):
        got = values(shell, complete(shell, words))
        assert [kind for kind, _ in got] == ["file"], (words, got)


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
@pytest.mark.parametrize("text", ["[h200\nct200\n", "hosts: {a: {port: 0}}\n", None])
def test_a_bad_or_missing_inventory_completes_nothing_and_prints_nothing(shell: str, tmp_path: Path,
                                                                        text: str | None) -> None:
    path = tmp_path / "inv.yaml"
    if text is not None:
        path.write_text(text)
    result = complete(shell, f"gpuops status -i {path} -t ")
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr == "", result


def test_completing_never_connects(tmp_path: Path, sshd: SshServer) -> None:
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    assert values("bash", complete("bash", f"gpuops stop -i {inv} -t ")) == [("plain", "ct200")]
    assert sshd.connection_count() == 0
    # The shipped lab inventory (a real host: read, never reached).
    assert values("bash", complete("bash", f"gpuops status -i {REPO}/inventories/example.yaml -t ")) == [("plain", "ct200")]


# -- the scripts click generates, run by the real shells ------------------------------------------


def source(shell: str) -> str:
    result = subprocess.run([str(GPUOPS)], env=env(_GPUOPS_COMPLETE=f"{shell}_source"), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stderr == "", result
    return result.stdout


def test_bash_completes_through_the_sourced_function(tmp_path: Path, ansible_inv: Path) -> None:
    script = tmp_path / "gpuops.bash"
    script.write_text(source("bash"))
    probe = (f"source {script}; complete -p gpuops; "
             f"COMP_WORDS=(gpuops status -i {ansible_inv} -t g); COMP_CWORD=5; _gpuops_completion gpuops; "
             "printf 'reply:%s\\n' \"${COMPREPLY[@]}\"; "
             "COMP_WORDS=(gpuops st); COMP_CWORD=1; COMPREPLY=(); _gpuops_completion gpuops; printf 'cmd:%s\\n' \"${COMPREPLY[@]}\"")
    result = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe], env=env(), capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result
    assert "complete -o nosort -F _gpuops_completion gpuops" in result.stdout
    assert [l for l in result.stdout.splitlines() if l.startswith("reply:")] == ["reply:gpu_nodes"]
    assert [l for l in result.stdout.splitlines() if l.startswith("cmd:")] == ["cmd:stacks", "cmd:status", "cmd:stop"]


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed (.ci/run installs it)")
def test_fish_completes_through_the_sourced_script(tmp_path: Path, ansible_inv: Path) -> None:
    script = tmp_path / "gpuops.fish"
    script.write_text(source("fish"))
    probe = (f"source {script}; complete -C 'gpuops status -i {ansible_inv} -t h'; "
             f"complete -C 'gpuops launch -i {ansible_inv} -t c'; complete -C 'gpuops launch -p {ansible_inv.parent}/ho'")
    result = subprocess.run(["fish", "--no-config", "-c", probe], env=env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result
    first, *second = result.stdout.splitlines()[:4]  # fish sorts each answer
    assert first == "h200\tgroup of 2 target(s)"
    assert sorted(second) == ["cpu1\ton 10.1.2.7", "ct200\tCT 200 on 10.1.2.6", "ct201\tCT 201 on 10.1.2.6"]
    assert result.stdout.splitlines()[4:] == [str(ansible_inv)]  # -p completes the file's path


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed (.ci/run installs it)")
def test_zsh_completes_through_the_sourced_function(tmp_path: Path, ansible_inv: Path) -> None:
    """zsh's completion widgets need a terminal: compdef, _describe and compadd are stood in for, to print."""
    script = tmp_path / "_gpuops"
    script.write_text(source("zsh"))
    probe = ("compdef() { print -r -- \"compdef $*\" }; "
             "_describe() { print -rl -- \"described:${(@P)3}\" }; compadd() { print -rl -- \"added:${(@P)${@[-1]}}\" }; "
             f"source {script}; words=(gpuops status -i {ansible_inv} -t s); CURRENT=6; _gpuops_completion")
    result = subprocess.run(["zsh", "-f", "-c", probe], env=env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result
    assert result.stdout.splitlines() == ["compdef _gpuops_completion gpuops", "described:spare:group of 1 target(s)"]
