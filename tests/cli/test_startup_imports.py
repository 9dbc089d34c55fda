"""What a command imports is what it costs to start: each heavy library only where it is used.

Every `gpuops status` starts a Python process, so a library imported for nothing is paid on
every call (benchmarks/run.py measures the time; these tests keep the imports from creeping back).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from bench import FakeProxmox, SshServer, write_inventory

REPO = Path(__file__).resolve().parents[2]

# Run one command in-process, then report which of these modules it imported.
PROBE = textwrap.dedent(
    """
    import json, sys
    from gpuops.cli.main import main
    try:
        main(sys.argv[2:], prog_name="gpuops")
    except SystemExit as exc:
        code = exc.code
    watched = ("paramiko", "yaml", "tenacity", "invoke", "importlib.metadata", "rich", "asyncio", "hyperscan",
               # what reading an inventory does not need: the playbook's model (and the agent defaults and
               # detectors it takes), the Ansible model, a thread pool for one target
               "gpuops.config.playbook_model", "gpuops.agent.detect.detectors", "gpuops.config.ansible.tree",
               "concurrent.futures")
    # A deferred stand-in (no __spec__) sits in sys.modules until first use: not imported.
    out = {"code": code, "imported": [m for m in watched if getattr(sys.modules.get(m), "__spec__", None)]}
    if "paramiko" in sys.modules:
        import paramiko, importlib.metadata
        out["paramiko_version"] = [paramiko.__version__, importlib.metadata.version("paramiko")]
        out["metadata_is_real"] = importlib.metadata.__spec__ is not None
    sys.stdout.flush()
    sys.stderr.write("\\n@@" + json.dumps(out) + "\\n")
    """
)


def imports_of(*args: str, env: dict[str, str] | None = None) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, "-", *args], capture_output=True, text=True, cwd=REPO,
                       timeout=120, stdin=subprocess.DEVNULL, env=None if env is None else {**os.environ, **env})
    return json.loads(r.stderr.rsplit("@@", 1)[1])


def test_help_imports_no_ssh_yaml_or_terminal_library() -> None:
    seen = imports_of("--help")
    assert seen["code"] == 0
    assert seen["imported"] == []


def test_status_over_ssh_imports_yaml_only(tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.add_container(200)
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    seen = imports_of("status", "-i", str(inv))
    assert seen["code"] == 0, seen
    # the user's ssh binary connects: no paramiko; tenacity only after a failed connect; invoke only for
    # ~/.ssh/config `Match exec`; rich only on a terminal; no playbook or Ansible model for a gpuops inventory.
    assert seen["imported"] == ["yaml"], seen


def test_status_without_an_ssh_binary_imports_paramiko_and_yaml_only(tmp_path: Path, sshd: SshServer,
                                                                     fake_proxmox: FakeProxmox) -> None:
    fake_proxmox.add_container(200)
    inv = write_inventory(tmp_path / "inv.yaml", sshd)
    seen = imports_of("status", "-i", str(inv), env={"PATH": str(tmp_path)})  # no `ssh` there
    assert seen["code"] == 0, seen
    assert seen["imported"] == ["paramiko", "yaml"], seen
    # paramiko still knows its own version (read without importlib.metadata), and whoever imports
    # importlib.metadata afterwards gets the real module, not the stand-in used during the import.
    installed, real = seen["paramiko_version"]
    assert installed == real
    assert seen["metadata_is_real"]


def test_status_on_a_local_target_imports_no_ssh_library() -> None:
    seen = imports_of("status", "-i", str(REPO / "inventories/local.yaml"), "--json")
    assert "paramiko" not in seen["imported"] and "tenacity" not in seen["imported"], seen


def test_ssh_config_match_exec_still_runs_through_the_deferred_invoke(tmp_path: Path) -> None:
    # `Match exec` is the one thing paramiko needs invoke for: it must work on first use.
    code = textwrap.dedent(
        """
        import sys
        from gpuops.transport.ssh._paramiko import paramiko
        assert getattr(sys.modules["invoke"], "__spec__", None) is None, "invoke imported up front"
        cfg = paramiko.SSHConfig.from_text('Match exec "test -e %s"\\n  Port 2222\\nHost *\\n  User nobody\\n' % sys.argv[1])
        print(cfg.lookup("gpu-host").get("port"), cfg.lookup("gpu-host").get("user"))
        """
    )
    present = subprocess.run([sys.executable, "-c", code, str(REPO)], capture_output=True, text=True, cwd=REPO, timeout=60)
    absent = subprocess.run([sys.executable, "-c", code, str(tmp_path / "nope")], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert present.stdout.split() == ["2222", "nobody"], present.stderr
    assert absent.stdout.split() == ["None", "nobody"], absent.stderr


def test_loading_the_config_imports_no_log_matcher() -> None:
    """The client's config reads the rules' texts; the matcher and its regex budget (~30 ms of every
    command's start, issue 21) load only where a log is scanned."""
    import subprocess
    import sys

    code = ("import sys, gpuops.targets, gpuops.client.status; "
            "print(sorted(m for m in sys.modules if m.startswith('gpuops.agent.wire.signatures.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "gpuops.agent.wire.signatures.matcher" not in out and "gpuops.agent.wire.signatures.budget" not in out, out


def test_validate_shows_the_connection_without_importing_an_ssh_library() -> None:
    # validate plans each target's chain as ssh resolves it (transport/ssh/plan.py); connecting it is chain.py's.
    seen = imports_of("validate", "-i", str(REPO / "inventories/example.yaml"), "-p", str(REPO / "playbooks/dflash.yaml"))
    assert seen["code"] == 0, seen
    assert "paramiko" not in seen["imported"], seen
