"""The first `gpuops status` of a gpuops version on a target (issue 21): gpuops' target files are copied in
the same round trip as the probe that runs after it, so it takes two `pct exec` calls, not four.

Over the real sshd into the pct stand-in; a `pct` first on the host's PATH (its ~/.bashrc, sourced for
every `ssh host cmd`) writes each call's subcommand to a file, then runs the stand-in.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

from bench import FakeProxmox, SshServer, write_inventory
from bench.cli import gpuops


def counting_pct(sshd: SshServer, tmp: Path) -> Path:
    calls = tmp / "pct-calls"
    bindir = tmp / "pct-counter"
    bindir.mkdir()
    real = Path(__file__).resolve().parents[1] / "standins" / "bin" / "pct"
    (bindir / "pct").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$1\" >> {shlex.quote(str(calls))}\n"
                                f"exec {shlex.quote(sys.executable)} {shlex.quote(str(real))} \"$@\"\n")
    (bindir / "pct").chmod(0o755)
    with (Path(sshd.fake_root) / "host" / "home" / ".bashrc").open("a") as fh:
        fh.write(f"export PATH={shlex.quote(str(bindir))}:\"$PATH\"\n")
    return calls


def test_the_first_status_copies_gpuops_files_and_probes_in_two_pct_exec_calls(sshd: SshServer, fake_proxmox: FakeProxmox,
                                                                                 tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd)
    calls = counting_pct(sshd, tmp_path)
    lib = fake_proxmox.home(200) / ".gpuops" / "lib"
    assert not lib.exists()
    first = gpuops("status", "--json", "-i", str(inventory))
    assert first.code == 0, first
    (target,) = first.events()
    assert target["reachable"] and len(target["gpus"]) == 8, target
    assert lib.is_dir() and len(list(lib.iterdir())) == 1  # the copy is there, once
    said = calls.read_text().splitlines()
    assert said.count("exec") == 2, said  # the probe saying the files are missing, then copy + probe
    calls.write_text("")
    again = gpuops("status", "--json", "-i", str(inventory))
    assert again.code == 0 and json.dumps(again.events()[0]["gpus"]) == json.dumps(target["gpus"])
    assert calls.read_text().splitlines() == ["exec"]  # from then on: one


def test_a_first_status_on_a_target_without_python3_says_so(sshd: SshServer, fake_proxmox: FakeProxmox,
                                                            tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path / "inventory.yaml", sshd)
    bindir = tmp_path / "no-python"
    bindir.mkdir()
    for folder in ("/usr/bin", "/bin"):
        for name in sorted(Path(folder).iterdir()):
            if not name.name.startswith("python") and not (bindir / name.name).exists():
                (bindir / name.name).symlink_to(name)
    fake_proxmox.set_env(200, PATH=str(bindir))
    result = gpuops("status", "-i", str(inventory))
    assert "python3 is not installed on the target" in result.err + result.text, result
    assert not (fake_proxmox.home(200) / ".gpuops" / "lib").exists() or not any(
        (fake_proxmox.home(200) / ".gpuops" / "lib").iterdir())
    assert shutil.which("python3")  # (the bench's own python3 is untouched)
