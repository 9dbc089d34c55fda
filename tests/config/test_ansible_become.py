"""Ansible inventories, continued: who the job runs as (ansible_become*), vaulted values and ssh options gpuops
cannot use failing only the targets that use them, in the inventory and in `ansible-inventory --list` JSON."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from gpuops.config import load_inventory, load_playbook
from gpuops.config.inventory import resolve_target, resolve_targets
from gpuops.errors import ConfigError

# The shape `ansible-vault encrypt_string` writes (a real body: the value is 10.1.2.9, the password `pw`).
VAULT_BODY = """\
$ANSIBLE_VAULT;1.1;AES256
64343630356631313366363464336338363261313832313031373335653866623861343836633965
3563353134343137653336323732623834356466623138320a383562333264303165643739653732
64306233373531383961303066383739643735613966383937386633356237633164346664623261
3631356539373562620a373165633364356363326165633736316537663339613635613036626462
6234"""


def vaulted(indent: int) -> str:
    return "!vault |\n" + textwrap.indent(VAULT_BODY, " " * indent)


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text) if not text.startswith(("{", "[")) else text)
    return path


def broken_message(inv_path: Path, target: str) -> str:
    inv = load_inventory(str(inv_path))
    with pytest.raises(ConfigError) as info:
        resolve_targets(inv, [target])
    return str(info.value)


# -- become ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "user", "method"), [
    ("ct200 proxmox_vmid=200 ansible_become=true ansible_become_user=alice", "alice", "sudo"),
    ("ct200 proxmox_vmid=200 ansible_become=yes", "root", "sudo"),  # Ansible's default become_user
    ("ct200 proxmox_vmid=200 ansible_become_user=alice", None, "sudo"),  # become is off unless set
    ("ct200 proxmox_vmid=200 ansible_become=False ansible_become_user=alice", None, "sudo"),
    ("ct200 proxmox_vmid=200 ansible_become=1 ansible_become_user=alice ansible_sudo_user=bob", "bob", "sudo"),
    ("ct200 ansible_become=on ansible_become_method=su ansible_become_user=alice ansible_su_user=carol", "carol", "su"),
    ("ct200 ansible_become=t ansible_become_method=ansible.builtin.su ansible_sudo_user=bob", "root", "su"),
])  # fmt: skip
def test_become_is_read_as_ansible_reads_it(tmp_path: Path, line: str, user: str | None, method: str) -> None:
    target = load_inventory(str(write(tmp_path, "hosts", f"[gpu]\n{line}\n"))).targets["ct200"]
    assert (target.become_user, target.become_method) == (user, method)


def test_become_from_group_vars_with_the_host_overriding(tmp_path: Path) -> None:
    write(tmp_path, "hosts.yml", """\
        gpu:
          hosts:
            ct200: {proxmox_vmid: 200}
            ct201: {proxmox_vmid: 201, ansible_become_user: bob}
            ct202: {proxmox_vmid: 202, ansible_become: no}
        """)
    write(tmp_path, "group_vars/gpu.yml", "ansible_become: true\nansible_become_user: trainer\n")
    t = load_inventory(str(tmp_path / "hosts.yml")).targets
    assert [t[n].become_user for n in ("ct200", "ct201", "ct202")] == ["trainer", "bob", None]


def test_a_become_method_gpuops_cannot_use_fails_only_that_target(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts", "[gpu]\nct200 proxmox_vmid=200 ansible_become=true ansible_become_method=doas\n"
                                    "ct201 proxmox_vmid=201\n")
    assert resolve_targets(load_inventory(str(path)), ["ct201"])[0].ctid == 201
    assert broken_message(path, "ct200") == (
        f"{path}:2:66: become method 'doas': gpuops becomes with sudo or su on a host (runuser in a container); "
        "set ansible_become_method to one of them")


def test_a_bad_become_value_is_an_error_at_its_place(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts", "ct200 ansible_become=maybe\n")
    with pytest.raises(ConfigError, match=r":1:22: expected ansible_become \(true or false, .*got 'maybe'"):
        load_inventory(str(path))


def test_gpuops_targets_take_become_user_and_method(tmp_path: Path) -> None:
    path = write(tmp_path, "inv.yml", """\
        hosts: {pve1: {address: 10.1.2.6}}
        targets:
          ct200: {host: pve1, ctid: 200, become_user: alice}
          h: {host: pve1, become_user: bob, become_method: su}
        """)
    t = load_inventory(str(path)).targets
    assert (t["ct200"].become_user, t["h"].become_user, t["h"].become_method) == ("alice", "bob", "su")
    write(tmp_path, "bad.yml", "hosts: {pve1: {}}\ntargets: {h: {host: pve1, become_method: su}}\n")
    with pytest.raises(ConfigError, match=r"bad.yml:2:\d+: become_method needs become_user in target 'h'"):
        load_inventory(str(tmp_path / "bad.yml"))


# -- vault -----------------------------------------------------------------------------------------


def vault_inventory(tmp_path: Path) -> Path:
    return write(tmp_path, "hosts.yml", f"""\
all:
  vars:
    ansible_become_password: {vaulted(6)}
    my_token: {vaulted(6)}
  hosts:
    ct200: {{ansible_host: 10.1.2.6, proxmox_vmid: 200}}
    ct201:
      proxmox_vmid: 201
      ansible_host: {vaulted(8)}
""")


def test_a_vaulted_value_gpuops_does_not_read_costs_nothing(tmp_path: Path) -> None:
    inv = load_inventory(str(vault_inventory(tmp_path)))
    assert inv.hosts[resolve_target(inv, None, "ct200").host].address == "10.1.2.6"


def test_a_vaulted_value_gpuops_uses_fails_that_target_naming_vault_and_the_way_out(tmp_path: Path) -> None:
    path = vault_inventory(tmp_path)
    assert broken_message(path, "ct201") == (
        f"{path}:21:21: expected a host name or IP address, got an Ansible Vault value (!vault): gpuops does not "
        "decrypt vault; write this value in plain text (or in ~/.ssh/config) where gpuops reads it; "
        f"`ansible -i {path} ct201 -m debug -a var=ansible_host --vault-password-file FILE` shows it")
    with pytest.raises(ConfigError, match="Ansible Vault"):
        resolve_targets(load_inventory(str(path)), ["all"])  # selecting it is the error, as for a template


def test_a_vaulted_value_in_group_vars_names_that_file(tmp_path: Path) -> None:
    write(tmp_path, "hosts", "[gpu]\nct200 proxmox_vmid=200\n")
    group_vars = write(tmp_path, "group_vars/gpu.yml", f"ansible_user: {vaulted(2)}\n")
    assert broken_message(tmp_path / "hosts", "ct200").startswith(f"{group_vars}:1:15: expected a user name, got an "
                                                                  "Ansible Vault value")


def test_ansible_inventory_list_json_with_undecrypted_values_works_the_same_way(tmp_path: Path) -> None:
    vault = {"__ansible_vault": VAULT_BODY + "\n"}
    listed = {"_meta": {"hostvars": {
        "ct200": {"ansible_host": "10.1.2.6", "proxmox_vmid": 200, "ansible_become_password": vault},
        "ct201": {"ansible_host": vault, "proxmox_vmid": 201}}},
        "all": {"children": ["ungrouped"]}, "ungrouped": {"hosts": ["ct200", "ct201"]}}
    path = write(tmp_path, "inv.json", json.dumps(listed, indent=1))
    assert resolve_targets(load_inventory(str(path)), ["ct200"])[0].ctid == 200
    assert "got an Ansible Vault value (!vault): gpuops does not decrypt vault" in broken_message(path, "ct201")


def test_gpuops_own_files_take_no_vault(tmp_path: Path) -> None:
    inv = write(tmp_path, "inv.yml", f"hosts:\n  pve1:\n    address: {vaulted(6)}\ntargets: {{}}\n")
    with pytest.raises(ConfigError, match=r"inv.yml:3:14: an Ansible Vault value \(!vault\) in a gpuops file"):
        load_inventory(str(inv))
    pb = write(tmp_path, "pb.yaml", f"launch: {{session: s, command: train}}\nenv:\n  TOKEN: {vaulted(4)}\n")
    with pytest.raises(ConfigError, match=r"pb.yaml:3:10: an Ansible Vault value \(!vault\) in a gpuops file"):
        load_playbook(str(pb))


# -- ssh options gpuops cannot honour: that host's targets only -------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    ("-A", "2:30: ansible_ssh_extra_args: ssh's -A is not honoured by gpuops (remove it)"),
    ("-L 8080:localhost:80", "2:30: ansible_ssh_extra_args: ssh's -L is not honoured by gpuops (remove it)"),
    ("-C -o ForwardAgent=yes", "2:33: ansible_ssh_extra_args: ssh option 'forwardagent' is not honoured by gpuops "
     "(remove it; gpuops honours connecttimeout, hostname, identityfile, port, proxycommand, proxyjump, "
     "serveraliveinterval, stricthostkeychecking, user, userknownhostsfile)"),
])  # fmt: skip
def test_an_ssh_option_gpuops_cannot_honour_fails_only_that_hosts_targets(tmp_path: Path, args: str,
                                                                          message: str) -> None:
    path = write(tmp_path, "hosts", f"[gpu]\nct200 ansible_ssh_extra_args='{args}'\nct201 ansible_host=10.1.2.7\n")
    inv = load_inventory(str(path))
    assert [t.name for t in resolve_targets(inv, ["ct201"])] == ["ct201"]
    assert broken_message(path, "ct200") == f"{path}:{message}"
