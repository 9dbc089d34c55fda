"""Ansible inventories as `-i`: INI and YAML, groups and children, Ansible's variable layering,
group_vars/ and host_vars/ files, jump hosts; `-t GROUP`; FILE:LINE:COL errors; a real status run.
"""

from __future__ import annotations

import getpass
import re
import textwrap
from pathlib import Path

import pytest
from bench import FakeProxmox, SshServer
from bench.cli import gpuops
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.config import load_inventory
from gpuops.config.inventory import resolve_target, resolve_targets
from gpuops.errors import ConfigError, UsageError

LAB_INI = """\
# The lab, as the Ansible repo has it.
bastion ansible_host=203.0.113.5 ansible_user=jump

[proxmox]
pve1 ansible_host=10.1.2.6

[h200]
ct200 proxmox_vmid=200 gpuops_gpus="[0, 1, 2, 3]"
ct201 proxmox_vmid=201 ansible_user=trainer

[gpu_nodes]
ct[300:302] gpuops_ctid=300

[gpu_nodes:children]
h200

[lab:children]
gpu_nodes
proxmox

[all:vars]
ansible_user=root
ansible_host=10.9.9.9

[gpu_nodes:vars]
ansible_host=10.1.2.6
ansible_ssh_common_args='-o ProxyJump=bastion -o UserKnownHostsFile=/etc/gpuops/known_hosts'
gpuops_gpus=0,1

[h200:vars]
gpuops_gpus=[4, 5, 6, 7]
"""

LAB_YAML = """\
all:
  vars: {ansible_user: root, ansible_host: 10.9.9.9}
  hosts:
    bastion: {ansible_host: 203.0.113.5, ansible_user: jump}
  children:
    lab:
      children:
        proxmox:
          hosts:
            pve1: {ansible_host: 10.1.2.6}
        gpu_nodes:
          vars:
            ansible_host: 10.1.2.6
            ansible_ssh_common_args: -o ProxyJump=bastion -o UserKnownHostsFile=/etc/gpuops/known_hosts
            gpuops_gpus: [0, 1]
          hosts:
            ct[300:302]: {gpuops_ctid: 300}
          children:
            h200:
              vars: {gpuops_gpus: [4, 5, 6, 7]}
              hosts:
                ct200: {proxmox_vmid: 200, gpuops_gpus: [0, 1, 2, 3]}
                ct201: {proxmox_vmid: 201, ansible_user: trainer}
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def error_of(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_inventory(str(path))
    return str(info.value)


# -- the lab, in both formats -------------------------------------------------------------------


@pytest.mark.parametrize("name, text", [("hosts", LAB_INI), ("hosts.yml", LAB_YAML)])
def test_the_lab_inventory_becomes_targets_hosts_and_groups(tmp_path: Path, name: str, text: str) -> None:
    inv = load_inventory(str(write(tmp_path, name, text)))
    in_file_order = ["bastion", "pve1", "ct200", "ct201", "ct300", "ct301", "ct302"] if name == "hosts" else [
        "bastion", "pve1", "ct300", "ct301", "ct302", "ct200", "ct201"]
    assert list(inv.targets) == in_file_order  # each Ansible host is a target of the same name, in file order
    t = inv.targets
    # Host vars beat group vars; a child group (h200) beats its parent (gpu_nodes), which beats all.
    assert (t["ct200"].ctid, t["ct200"].gpus) == (200, (0, 1, 2, 3))
    assert (t["ct201"].ctid, t["ct201"].gpus) == (201, (4, 5, 6, 7))
    assert (t["ct301"].ctid, t["ct301"].gpus) == (300, (0, 1))
    assert t["pve1"].ctid is None and t["bastion"].ctid is None
    bastion, pve = inv.hosts[t["bastion"].host], inv.hosts[t["pve1"].host]
    assert (bastion.address, bastion.user, bastion.jump) == ("203.0.113.5", "jump", None)
    assert (pve.address, pve.user, pve.jump, pve.known_hosts) == ("10.1.2.6", "root", None, None)
    node = inv.hosts[t["ct200"].host]
    # The jump names an inventory host, yet ssh resolves a ProxyJump name through ssh config (as Ansible's
    # ssh does): the hop is `bastion` as ssh config has it, not the inventory's 203.0.113.5 as jump.
    hop = inv.hosts[node.jump]
    assert (node.address, node.user, node.known_hosts) == ("10.1.2.6", "root", "/etc/gpuops/known_hosts")
    assert (hop.address, hop.user, hop.port, hop.jump) == ("bastion", None, None, None) and hop != bastion
    assert inv.hosts[t["ct201"].host].user == "trainer"
    # Targets with the same ssh settings share one host, so one connection serves them all.
    assert t["ct200"].host == t["ct300"].host == t["ct302"].host != t["ct201"].host
    assert set(inv.groups["gpu_nodes"]) == {"ct200", "ct201", "ct300", "ct301", "ct302"}
    assert inv.groups["h200"] == ("ct200", "ct201")
    assert set(inv.groups["lab"]) == set(inv.groups["gpu_nodes"]) | {"pve1"}
    assert inv.groups["ungrouped"] == ("bastion",)


def test_group_vars_and_host_vars_files_are_layered_as_ansible_does(tmp_path: Path) -> None:
    write(tmp_path, "hosts.ini", LAB_INI)
    write(tmp_path, "group_vars/all.yml", "ansible_port: 2200\n")
    write(tmp_path, "group_vars/gpu_nodes/main.yaml", "gpuops_gpus: [2, 3]\nansible_port: 2201\n")
    write(tmp_path, "group_vars/h200.yml", "ansible_port: 2202\n")
    write(tmp_path, "host_vars/ct201.yml", "gpuops_gpus: [7]\nproxmox_vmid: 777\n")
    inv = load_inventory(str(tmp_path / "hosts.ini"))
    t, h = inv.targets, inv.hosts
    # group_vars/ files beat the inventory file's group vars; the inventory's host vars beat them.
    assert t["ct301"].gpus == (2, 3) and t["ct200"].gpus == (0, 1, 2, 3)
    assert h[t["ct301"].host].port == 2201 and h[t["ct200"].host].port == 2202 and h[t["pve1"].host].port == 2200
    # host_vars/ beats everything.
    assert (t["ct201"].ctid, t["ct201"].gpus) == (777, (7,))


def test_group_priority_orders_groups_of_the_same_depth(tmp_path: Path) -> None:
    text = """\
    [a]
    h1
    [b]
    h1
    [a:vars]
    gpuops_ctid=101
    [b:vars]
    gpuops_ctid=102
    """
    assert load_inventory(str(write(tmp_path, "inv", text))).targets["h1"].ctid == 102  # b sorts after a
    prioritised = text + "[a:vars]\nansible_group_priority=10\n"
    assert load_inventory(str(write(tmp_path, "inv", prioritised))).targets["h1"].ctid == 101


@pytest.mark.parametrize(("args", "hops"), [
    ("-J admin@gw.example.com:2222", [("gw.example.com", "admin", 2222, None)]),
    ("-o ProxyJump=bastion,10.0.0.9:2200", [("bastion", None, None, None), ("10.0.0.9", None, 2200, "bastion")]),
    ("-J ct200", [("ct200", None, None, None)]),  # its own name: ssh config's ct200, no loop
    ("-o 'ProxyCommand=ssh -q -W %h:%p -p 2201 ops@gw.example.com'", [("gw.example.com", "ops", 2201, None)]),
    ("-o ProxyJump=none -J ignored", []),
])  # fmt: skip
def test_jump_hosts_from_the_ssh_args(tmp_path: Path, args: str, hops: list[tuple]) -> None:
    text = f"bastion ansible_host=203.0.113.5 ansible_user=jump\n[gpu]\nct200 ansible_host=10.1.2.6 proxmox_vmid=200 ansible_ssh_common_args=\"{args}\"\n"
    inv = load_inventory(str(write(tmp_path, "inv.ini", text)))
    chain = []
    jump = inv.hosts[inv.targets["ct200"].host].jump
    while jump is not None:
        hop = inv.hosts[jump]
        chain.insert(0, (hop.address, hop.user, hop.port, hop.jump))
        jump = hop.jump
    # Each hop is reached through the one before it; an inventory host's name as a hop is resolved by ssh
    # config (as ssh and Ansible resolve it), never by the inventory's settings for that host.
    assert [(a, u, p) for a, u, p, _ in chain] == [(a, u, p) for a, u, p, _ in hops]
    if len(chain) == 2:
        assert inv.hosts[inv.hosts[inv.targets["ct200"].host].jump].jump != inv.targets["bastion"].host


def test_local_connection_and_skipped_connections(tmp_path: Path) -> None:
    text = "localhost ansible_connection=local\nwin1 ansible_connection=winrm\n"
    inv = load_inventory(str(write(tmp_path, "inv.ini", text)))
    assert list(inv.targets) == ["localhost"]
    assert inv.hosts[inv.targets["localhost"].host].transport == "local"


def test_the_format_is_detected_by_content(tmp_path: Path) -> None:
    gpuops_yaml = "hosts: {here: {transport: local}}\ntargets: {local: {host: here}}\n"
    assert list(load_inventory(str(write(tmp_path, "inventory", gpuops_yaml))).targets) == ["local"]
    ini = load_inventory(str(write(tmp_path, "inv.ini", "node1:2222\nnode2\n")))  # YAML reads it as one string
    assert list(ini.targets) == ["node1", "node2"] and ini.hosts[ini.targets["node1"].host].port == 2222
    assert list(load_inventory(str(write(tmp_path, "hosts", "gpu:\n  hosts: {n1: }\n"))).targets) == ["n1"]
    # A .yml/.yaml name is YAML: a syntax error there is reported as one, not read as INI.
    assert error_of(write(tmp_path, "inv.yaml", "gpu:\n  hosts: {n1: }\n  [x]\n")) == (
        f"{tmp_path}/inv.yaml:4:1: could not find expected ':' (while scanning a simple key started at line 3, column 3)")


# -- -t GROUP --------------------------------------------------------------------------------------


def test_a_group_selects_its_targets_and_its_childrens(tmp_path: Path) -> None:
    inv = load_inventory(str(write(tmp_path, "hosts", LAB_INI)))
    assert [t.name for t in resolve_targets(inv, ["h200"])] == ["ct200", "ct201"]
    assert [t.name for t in resolve_targets(inv, ["ct201", "h200", "pve1"])] == ["ct201", "ct200", "pve1"]
    with pytest.raises(UsageError, match=r"unknown target 'h20' .*groups: .*h200.*; did you mean 'h200'\?"):
        resolve_targets(inv, ["h20"])
    with pytest.raises(UsageError, match=r"'h200' is a group of 2 target\(s\) \(ct200, ct201\); this command acts on one"):
        resolve_target(inv, None, "h200")


def test_cli_validate_and_dry_run_read_an_ansible_inventory(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts", LAB_INI)
    pb = write(tmp_path, "pb.yaml", "launch: {session: s, command: train}\n")
    validated = gpuops("validate", "-i", str(inv))
    assert validated.code == 0 and f"ok: {inv}: 5 host(s), 7 target(s)" in validated.text, validated
    planned = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb), "-t", "ct200", env={"HOME": str(tmp_path)})
    assert planned.code == 0, planned
    # The whole chain, each hop user@host:port as ssh resolves it: `bastion` through ssh config (here none:
    # the local user, port 22), not the inventory's jump@203.0.113.5.
    assert planned.text.startswith("# gpuops launch --dry-run: target ct200 via ssh root@10.1.2.6:22 "
                                   f"-J {getpass.getuser()}@bastion:22,"), planned
    assert "pct exec 200 -- " in planned.text
    group = gpuops("launch", "--dry-run", "-i", str(inv), "-p", str(pb), "-t", "h200")  # a group: each of its targets
    assert group.code == 0, group
    headers = [line for line in group.text.splitlines() if line.startswith("# gpuops launch --dry-run: target ")]
    assert [h.split()[5] for h in headers] == ["ct200", "ct201"], headers


# -- errors keep FILE:LINE:COL ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text", "message"), [
    ("inv.ini", "[gpu]\nct200 proxmox_vmid=abc\n", "2:20: expected a container id (an integer 100..999999999), got 'abc'"),
    ("inv.ini", "[gpu:hostvars]\n", "1:1: unknown section [gpu:hostvars] (expected :vars or :children)"),
    ("inv.ini", "[gpu]\nct200 'unclosed\n", "2:1: cannot read the host line: No closing quotation (check its quotes)"),
    ("inv.ini", "[gpu]\nct200 a=1 stray\n", "2:11: expected key=value after the host name, got 'stray'"),
    ("inv.ini", "[gpu]\nh gpuops_gpus=[0,0]\n", "2:15: GPU 0 is listed twice in gpuops_gpus"),
    ("inv.yml", "all:\n  chilren:\n    gpu: {}\n",
     "2:3: unknown key 'chilren' in group 'all' (expected one of: children, hosts, vars); did you mean 'children'?"),
    ("inv.yml", "all:\n  children:\n    a: {children: {b: {children: {a: }}}}\n", "3:5: group loop: a -> b -> a"),
    # A loop no path from all reaches (each group is the other's child, so neither belongs to all): it
    # crashed (KeyError) where the loop should be named; hypothesis found it.
    ("inv.ini", "h1 ansible_host=127.0.0.1\n[a]\nh1\n[a:children]\nb\n[b:children]\na\n", "2:1: group loop: a -> b -> a"),
    ("inv.yml", "all:\n  hosts:\n    ct200: {ansible_port: 70000}\n", "3:27: expected a port number (an integer 1..65535), got 70000"),
    ("inv.yml", "gpu:\n  hosts: [ct200]\n", "2:10: expected a mapping for the hosts of group 'gpu', got a list"),
    ("inv.yml", "all:\n  hosts:\n    n[1:99999]: \n", "3:5: bad host range [1:99999]: empty, or more than 10000 hosts"),
])  # fmt: skip
def test_a_bad_inventory_names_the_place(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = write(tmp_path, name, text)
    assert error_of(path) == f"{path}:{message}"


def test_an_error_in_a_group_vars_file_names_that_file(tmp_path: Path) -> None:
    write(tmp_path, "hosts", "[gpu]\nct200\n")
    bad = write(tmp_path, "group_vars/gpu.yml", "proxmox_vmid: 200\nproxmox_vmid: 201\n")
    assert error_of(tmp_path / "hosts") == (
        f"{bad}:2:1: duplicate key 'proxmox_vmid' in the variables in {bad} (first given at line 1, column 1)")


def test_a_bad_file_is_exit_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts", "[gpu]\nct200 ansible_port=http\n")
    result = gpuops("status", "-i", str(path))
    assert result.code == 2
    assert result.err == f"gpuops: error: {path}:2:20: expected a port number (an integer 1..65535), got 'http'\n"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_inventories_load_or_fail_with_a_place(tmp_path: Path, data: st.DataObject) -> None:
    source = data.draw(st.sampled_from([("fuzz", LAB_INI), ("fuzz.yml", LAB_YAML)]))
    lines = source[1].splitlines(keepends=True)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(lines) - 1))
        junk = data.draw(st.sampled_from(["[", "]", ":", "=", "'", '"', "{{ x }}", "[1:3]", "-J ", ",", "\t", " ", "#",
                                           "ansible_port=0", "children", "!!str", "*a", "&a ", "\n", "-"]))
        at = data.draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:at] + junk + lines[i][at + data.draw(st.integers(0, 3)):]
    path = tmp_path / source[0]
    path.write_text("".join(lines))
    try:
        load_inventory(str(path))
    except ConfigError as exc:
        assert re.match(re.escape(str(path)) + r":(\d+):(\d+): \S", str(exc)), str(exc)
        assert "\n" not in str(exc)
    except UsageError as exc:
        assert "\n" not in str(exc)


# -- on the bench: `gpuops status -t <group>` through a jump host ------------------------------------


def test_status_of_a_group_reaches_every_container_through_the_jump_host(
    tmp_path: Path, sshd: SshServer, fake_proxmox: FakeProxmox, bastion: SshServer
) -> None:
    for vmid in (201, 202, 203):
        fake_proxmox.add_container(vmid, gpus=2)
    fake_proxmox.stop_container(202)
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + "\n" + bastion.known_hosts_line() + "\n")
    # ProxyJump=bastion is resolved as ssh resolves it, through ~/.ssh/config; the inventory's own `bastion`
    # (a closed port here) is how Ansible reaches that host, not how ssh jumps through it.
    write(tmp_path, ".ssh/config", f"""\
        Host bastion
          HostName 127.0.0.1
          Port {bastion.port}
          User {bastion.user}
          IdentityFile {bastion.client_key}
          UserKnownHostsFile {known}
        """)
    write(tmp_path, "inventory/hosts.ini", f"""\
        bastion ansible_host=127.0.0.1 ansible_port=1 ansible_ssh_private_key_file={bastion.client_key}

        [h200]
        ct200 proxmox_vmid=200
        ct201 proxmox_vmid=201

        [gpu_nodes]
        ct202 gpuops_ctid=202

        [gpu_nodes:children]
        h200

        [spare]
        ct203 proxmox_vmid=203

        [all:vars]
        ansible_user=nobody
        ansible_ssh_common_args='-o UserKnownHostsFile={known}'
        """)
    # The group's real settings live in group_vars/, as in most Ansible repos; they override all:vars.
    write(tmp_path, "inventory/group_vars/all.yml", f"ansible_user: {bastion.user}\n")
    write(tmp_path, "inventory/group_vars/gpu_nodes.yml", f"""\
        ansible_host: 127.0.0.1
        ansible_port: {sshd.port}
        ansible_user: {sshd.user}
        ansible_ssh_private_key_file: {sshd.client_key}
        ansible_ssh_common_args: -o ProxyJump=bastion -o UserKnownHostsFile={known}
        """)
    spare = write(tmp_path, "inventory/group_vars/spare.yml", f"ansible_host: 127.0.0.1\nansible_port: {sshd.port}\n")
    assert spare.exists()
    result = gpuops("status", "-i", str(tmp_path / "inventory/hosts.ini"), "-t", "gpu_nodes",
                    env={"HOME": str(tmp_path), "SSH_AUTH_SOCK": ""})
    assert result.code == 0, result
    lines = result.text.splitlines()
    via = f"{sshd.user}@127.0.0.1:{sshd.port} -J bastion"
    assert f"ct200: reachable via {via}, container 200 running" in lines, result
    assert f"ct201: reachable via {via}, container 201 running" in lines, result
    assert f"ct202: reachable via {via}, container 202 stopped" in lines, result
    assert {line.split(":")[0] for line in lines} == {"ct200", "ct201", "ct202"}  # not ct203, not bastion
    assert sum(1 for line in lines if line.startswith("ct201: gpu ")) == 2
    # One connection to the jump host, one through it to the Proxmox host, shared by the three containers.
    assert bastion.connection_count() == 1 and sshd.connection_count() == 1
