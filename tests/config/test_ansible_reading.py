"""Ansible inventories read as Ansible reads them: YAML 1.1 values that YAML 1.2 reads otherwise are
refused at their line, the legacy spelling wins, ssh args mean what they mean to ssh, a template fails
only its host, directories, `ansible-inventory --list` JSON, host patterns; validate shows each
target's connection (its `targets`), nothing connects."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest
from bench.cli import gpuops

from gpuops.config import load_inventory
from gpuops.config.inventory import resolve_targets
from gpuops.errors import ConfigError


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def home(tmp_path: Path) -> dict[str, str]:
    """An empty HOME: no ~/.ssh/config of the developer's changes what ssh -G resolves."""
    (tmp_path / "home" / ".ssh").mkdir(parents=True, exist_ok=True)
    return {"HOME": str(tmp_path / "home")}


def targets(tmp_path: Path, inv: Path) -> dict[str, dict]:
    result = gpuops("validate", "-i", str(inv), "--json", env=home(tmp_path))
    assert result.code == 0, result
    return {t["name"]: t for t in result.events()[-1]["targets"]}


# -- one value, two readings ----------------------------------------------------------------------


@pytest.mark.parametrize(("line", "readings"), [
    ("proxmox_vmid: 0201", "Ansible (YAML 1.1) reads it as 129, a YAML 1.2 reader as 201"),
    ("ansible_port: 22_22", "Ansible (YAML 1.1) reads it as 2222, a YAML 1.2 reader as '22_22'"),
    ("ansible_user: yes", "Ansible (YAML 1.1) reads it as True, a YAML 1.2 reader as 'yes'"),
])  # fmt: skip
def test_a_value_yaml_1_1_and_1_2_read_differently_is_refused_at_its_line_with_nothing_connected(
    tmp_path: Path, line: str, readings: str
) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    inv = write(tmp_path, "inv.yml", f"""\
        all:
          hosts:
            ct200:
              {line}
              ansible_host: 127.0.0.1
              ansible_port_unused: {port}
        """)
    if "ansible_port" not in line:
        inv.write_text(inv.read_text().replace("ansible_port_unused", "ansible_port"))
    result = gpuops("status", "-i", str(inv), env=home(tmp_path))
    assert result.code == 2, result
    key, value = line.split(": ")
    assert result.err.startswith(f"gpuops: error: {inv}:4:{6 + len(key) + 3}: {value} is ambiguous as "), result
    assert readings in result.err
    with pytest.raises(socket.timeout):
        listener.accept()  # refused before anything connected
    listener.close()
    quoted = inv.read_text().replace(line, line.replace(": ", ": '") + "'")
    inv.write_text(quoted)  # quoted it is text to both: no longer ambiguous (it may still be invalid)
    assert "ambiguous" not in gpuops("validate", "-i", str(inv), env=home(tmp_path)).err


# -- the legacy spelling, ssh args -----------------------------------------------------------------


def test_the_legacy_spelling_wins_where_both_are_set_as_in_ansibles_ssh_plugin(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts", """\
        w1 ansible_user=u1 ansible_ssh_user=u2 ansible_host=192.0.2.1 ansible_ssh_host=192.0.2.2 ansible_port=2201 ansible_ssh_port=2202
        """)
    view = targets(tmp_path, inv)["w1"]
    assert (view["user"], view["address"], view["port"]) == ("u2", "192.0.2.2", 2202)


def test_ssh_args_mean_what_they_mean_to_ssh(tmp_path: Path) -> None:
    cfg = write(tmp_path, "other_config", "Host *.lab\n  User fromfile\n  Port 2299\n")
    inv = write(tmp_path, "hosts", f"""\
        a ansible_host=192.0.2.10 ansible_ssh_common_args='-o Port=2222 -o User=admin'
        b ansible_host=192.0.2.11 ansible_ssh_common_args='-p 2223 -l bob -i /keys/k'
        c ansible_host=alias ansible_ssh_extra_args='-o HostName=192.0.2.12'
        d ansible_host=node.lab ansible_ssh_common_args='-F {cfg}'
        e ansible_host=192.0.2.13 ansible_port=2200 ansible_ssh_common_args='-o Port=2222'
        """)
    t = targets(tmp_path, inv)
    assert (t["a"]["port"], t["a"]["user"]) == (2222, "admin")
    assert (t["b"]["port"], t["b"]["user"], t["b"]["identity_file"]) == (2223, "bob", None)  # no such key: skipped
    assert t["c"]["address"] == "192.0.2.12"
    assert (t["d"]["port"], t["d"]["user"]) == (2299, "fromfile")
    assert t["e"]["port"] == 2200  # Ansible puts -o Port=ansible_port before the args: first value wins


def test_two_hops_and_a_group_vars_policy_show_in_validates_targets(tmp_path: Path) -> None:
    write(tmp_path, "inventory/group_vars/all.yml", "ansible_ssh_common_args: -o StrictHostKeyChecking=accept-new\n")
    write(tmp_path, "inventory/hosts.yml", """\
        all:
          children:
            gpu:
              hosts:
                ct200:
                  ansible_host: 10.1.0.2
                  ansible_user: trainer
                  proxmox_vmid: 200
                  gpuops_gpus: [0, 1]
                  ansible_ssh_extra_args: -J ops@gw1.example.net,root@10.1.0.1:2222
        """)
    view = targets(tmp_path, tmp_path / "inventory")["ct200"]
    assert view["jumps"] == ["ops@gw1.example.net:22", "root@10.1.0.1:2222"]
    assert (view["address"], view["port"], view["user"]) == ("10.1.0.2", 22, "trainer")
    assert (view["host_key_policy"], view["ctid"], view["gpus"]) == ("accept-new", 200, [0, 1])
    text = gpuops("validate", "-i", str(tmp_path / "inventory"), env=home(tmp_path))
    assert ("ct200: ssh trainer@10.1.0.2:22 -J ops@gw1.example.net:22,root@10.1.0.1:2222, container 200 "
            "(host keys: accept-new)") in text.text


# -- templates, directories, JSON, patterns -----------------------------------------------------------


def test_a_template_in_one_host_fails_only_that_hosts_targets(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts.yml", """\
        all:
          hosts:
            ct200: {ansible_host: 10.1.2.6, proxmox_vmid: 200}
            ct201: {ansible_host: '{{ pve }}', proxmox_vmid: 201}
        """)
    pb = write(tmp_path, "pb.yaml", "launch: {session: s, command: train}\n")
    ok = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb), "-t", "ct200", env=home(tmp_path))
    assert ok.code == 0 and "target ct200 via ssh root@10.1.2.6:22," in ok.text, ok
    bad = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb), "-t", "ct201", env=home(tmp_path))
    assert bad.code == 2, bad
    assert bad.err.startswith(f"gpuops: error: {inv}:4:27: expected a host name or IP address, got the Jinja "
                              "template '{{ pve }}'"), bad.err
    checked = gpuops("validate", "-i", str(inv), env=home(tmp_path))
    assert checked.code == 0 and "warning: target ct201 cannot be used:" in checked.err


def test_an_inventory_directory_merges_its_files_as_ansible_does(tmp_path: Path) -> None:
    write(tmp_path, "inv/01-hosts", "[gpu]\nct200 ansible_host=10.1.2.6\n")
    write(tmp_path, "inv/02-more.yml", "gpu:\n  hosts:\n    ct201: {ansible_host: 10.1.2.7}\n")
    write(tmp_path, "inv/README.md", "not an inventory\n")
    write(tmp_path, "inv/group_vars/gpu.yml", "proxmox_vmid: 300\nansible_user: ops\n")
    write(tmp_path, "inv/host_vars/ct201.yml", "proxmox_vmid: 301\n")
    inv = load_inventory(str(tmp_path / "inv"))
    assert {n: t.ctid for n, t in inv.targets.items()} == {"ct200": 300, "ct201": 301}
    assert inv.groups["gpu"] == ("ct200", "ct201")
    assert {inv.hosts[t.host].user for t in inv.targets.values()} == {"ops"}


@pytest.mark.parametrize(("pattern", "chosen"), [
    ("gpu_nodes:!a100", ["ct200", "ct201"]),
    ("gpu_nodes:&a100", ["ct300"]),
    ("ct20*", ["ct200", "ct201"]),
    ("pve1,ct300", ["pve1", "ct300"]),
    ("~ct3.*", ["ct300"]),
    ("!gpu_nodes", ["pve1"]),
])  # fmt: skip
def test_host_patterns_select_as_ansible_does(tmp_path: Path, pattern: str, chosen: list[str]) -> None:
    inv = load_inventory(str(write(tmp_path, "hosts", """\
        pve1
        [gpu_nodes]
        ct200
        ct201
        ct300
        [a100]
        ct300
        """)))
    assert [t.name for t in resolve_targets(inv, [pattern])] == chosen
    if shutil.which("ansible-inventory"):
        listed = subprocess.run(["ansible", "-i", inv.path, pattern, "--list-hosts"], capture_output=True, text=True,
                                timeout=120, env={"PATH": "/usr/bin:/bin:" + str(Path(shutil.which("ansible-inventory")).parent),
                                                  "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")})
        names = [line.strip() for line in listed.stdout.splitlines()[1:]]
        assert sorted(names) == sorted(chosen), listed


@pytest.mark.skipif(shutil.which("ansible-inventory") is None, reason="needs ansible-inventory (pip install ansible-core)")
def test_ansible_inventory_list_json_is_an_inventory(tmp_path: Path) -> None:
    src = write(tmp_path, "src/hosts.yml", """\
        all:
          vars: {pve: 10.1.2.6}
          children:
            gpu:
              hosts:
                ct200: {ansible_host: 10.1.2.6, proxmox_vmid: 0201, ansible_user: root}
                ct201: {ansible_host: '{{ pve }}', proxmox_vmid: 202}
        """)
    write(tmp_path, "src/group_vars/gpu.yml", "gpuops_gpus: [0, 1]\n")
    listed = subprocess.run(["ansible-inventory", "-i", str(src), "--list"], capture_output=True, text=True, timeout=120,
                            env={"PATH": str(Path(shutil.which("ansible-inventory")).parent) + ":/usr/bin:/bin",
                                 "HOME": str(tmp_path), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp")})
    assert listed.returncode == 0, listed.stderr
    as_json = tmp_path / "inv.json"
    as_json.write_text(listed.stdout)
    assert set(json.loads(listed.stdout)) >= {"_meta", "all"}
    inv = load_inventory(str(as_json))
    ct = inv.targets["ct200"]
    # Ansible's own reading (0201 is 129 to it), group_vars/ applied by Ansible, groups as it lists them.
    assert (ct.ctid, ct.gpus, inv.groups["gpu"]) == (129, (0, 1), ("ct200", "ct201"))
    # ansible-inventory leaves templates as written: that host alone is refused, where it is used.
    with pytest.raises(ConfigError, match="Jinja template"):
        resolve_targets(inv, ["ct201"])
