"""Differential: real `ansible-inventory --list` and Ansible's own ssh plugin against gpuops, on a corpus.

For every inventory of the corpus (INI, YAML, directories, group_vars/host_vars, children, both
spellings, ssh args, jumps in ssh args, jump names that are inventory hosts too, an ~/.ssh/config alias,
become, patterns): Ansible's ssh plugin builds each host's ssh argv from ansible-inventory's hostvars, and
real `ssh -G` resolves it (where Ansible would connect: address, port, user, every ProxyJump hop as
user@host:port); gpuops' `validate --json` must show the same connection and the user Ansible's become
plugin would become, its groups must be Ansible's, and `-t PATTERN` must pick what `ansible --list-hosts`
picks. Vault: real `ansible-vault` encrypts, and a vaulted value fails only the target that uses it, in
the inventory and in `ansible-inventory --list` JSON, with a way out that real `ansible` runs. Nothing connects: ssh -G only prints its configuration and the corpus
names documentation addresses only.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bench.cli import gpuops

from gpuops.config import load_inventory
from gpuops.config.inventory import resolve_targets

HERE = Path(__file__).resolve().parent
ANSIBLE = shutil.which("ansible-inventory")
pytestmark = [
    pytest.mark.skipif(ANSIBLE is None, reason="needs ansible-inventory (the test extra: pip install ansible-core)"),
    pytest.mark.skipif(shutil.which("ssh") is None, reason="needs OpenSSH's ssh client (ssh -G)"),
]

LAB_INI = """\
bastion ansible_host=203.0.113.5 ansible_user=jump
[proxmox]
pve1 ansible_host=10.1.2.6 ansible_user=root
[h200]
ct200 ansible_host=10.1.2.6 proxmox_vmid=200
ct201 ansible_host=10.1.2.7 proxmox_vmid=201 ansible_user=trainer
[a100]
ct3[00:02] ansible_host=10.1.3.1 gpuops_ctid=300
[gpu_nodes:children]
h200
a100
[gpu_nodes:vars]
ansible_user=root
ansible_port=2200
"""

# name -> {relative path: text}; "inventory" names what -i gets (a file or a folder).
CORPUS: dict[str, dict[str, str]] = {
    "ini-groups-children": {"hosts": LAB_INI},
    "yaml-groups-children": {"hosts.yml": """\
        all:
          hosts:
            bastion: {ansible_host: 203.0.113.5, ansible_user: jump}
          children:
            gpu_nodes:
              vars: {ansible_user: root, ansible_port: 2200}
              children:
                h200:
                  hosts:
                    ct200: {ansible_host: 10.1.2.6, proxmox_vmid: 200}
                    ct201: {ansible_host: 10.1.2.7, ansible_user: trainer, proxmox_vmid: 201}
                a100:
                  hosts:
                    ct[300:302]: {ansible_host: 10.1.3.1}
        """},
    "ini-both-spellings": {"hosts": """\
        w1 ansible_user=u1 ansible_ssh_user=u2
        w2 ansible_host=192.0.2.1 ansible_ssh_host=192.0.2.2 ansible_port=2201 ansible_ssh_port=2202
        w3 ansible_ssh_user=only_legacy ansible_ssh_port=2203
        """},
    "yaml-spellings-across-layers": {"hosts.yml": """\
        all:
          vars: {ansible_ssh_user: from_all}
          children:
            g:
              vars: {ansible_ssh_port: 2210}
              hosts:
                h1: {ansible_user: from_host, ansible_port: 2211, ansible_host: 192.0.2.10}
                h2: {ansible_host: 192.0.2.11}
        """},
    "directory-merged": {
        "inventory": "inv",
        "inv/01-hosts": "[gpu]\nct200 ansible_host=10.1.2.6\n[gpu:vars]\nansible_port=2222\n",
        "inv/02-more.yml": "gpu:\n  hosts:\n    ct201: {ansible_host: 10.1.2.7}\nother:\n  hosts:\n    ct200:\n",
        "inv/group_vars/gpu.yml": "ansible_user: ops\n",
        "inv/group_vars/other/main.yml": "ansible_port: 2300\n",
        "inv/host_vars/ct201.yml": "ansible_user: trainer\nansible_port: 2401\n",
    },
    "file-with-group-and-host-vars": {
        "hosts.ini": LAB_INI,
        "group_vars/all.yml": "ansible_port: 2100\n",
        "group_vars/a100.yaml": "ansible_user: a100user\n",
        "host_vars/ct301.yml": "ansible_host: 10.1.3.2\nansible_port: 2301\n",
    },
    "ssh-args-port-user-key": {"hosts": """\
        a ansible_host=192.0.2.20 ansible_ssh_common_args='-o Port=2222 -o User=admin'
        b ansible_host=192.0.2.21 ansible_ssh_common_args='-p 2223 -l bob'
        c ansible_host=192.0.2.22 ansible_ssh_extra_args='-oPort=2224 -oUser=carol'
        d ansible_host=192.0.2.23 ansible_port=2200 ansible_user=dave ansible_ssh_common_args='-o Port=2222 -l nobody'
        e ansible_host=192.0.2.24 ansible_ssh_common_args='-p 2225' ansible_ssh_extra_args='-p 2226'
        """},
    "ssh-args-hostname-and-config-file": {"hosts.yml": """\
        all:
          hosts:
            alias1: {ansible_ssh_common_args: -o HostName=192.0.2.30}
            node.lab: {ansible_ssh_common_args: -F {config}}
        """},
    "jumps-in-ssh-args": {"hosts": """\
        [gpu]
        ct200 ansible_host=10.1.0.2 ansible_ssh_extra_args='-J ops@gw1.example.net,root@10.1.0.1:2222'
        ct201 ansible_host=10.1.0.3 ansible_ssh_common_args='-o ProxyJump=gw2.example.net:2022'
        ct202 ansible_host=10.1.0.4 ansible_ssh_common_args="-o 'ProxyCommand=ssh -W %h:%p -p 2023 ops@gw3.example.net'"
        """},
    "jumps-from-group-vars": {
        "hosts.yml": "gpu:\n  hosts:\n    ct200: {ansible_host: 10.2.0.2}\n    ct201: {ansible_host: 10.2.0.3, ansible_user: u}\n",
        "group_vars/gpu.yml": "ansible_ssh_common_args: -o ProxyJump=jumper@gw.example.net:2200 -o StrictHostKeyChecking=yes\n",
    },
    "group-priority-and-depth": {"hosts": """\
        [a]
        h1 ansible_host=192.0.2.40
        [b]
        h1
        [c:children]
        a
        [a:vars]
        ansible_port=2001
        [b:vars]
        ansible_port=2002
        ansible_group_priority=10
        [c:vars]
        ansible_port=2003
        ansible_user=cuser
        """},
    "ranges-and-inline-ports": {"hosts": """\
        [web]
        web[01:03].example.com ansible_user=deploy
        db.example.com:2299
        [web:vars]
        ansible_port=2201
        """},
    # A jump host's name is resolved by ssh config, as ssh resolves it when Ansible runs `ssh -J bastion`, even
    # where the inventory has a host of that name (its ansible_host is how Ansible reaches it, not a jump).
    "jump-name-is-an-inventory-host": {"hosts": """\
        bastion ansible_host=203.0.113.5 ansible_user=jump ansible_port=2022
        gw ansible_host=203.0.113.6
        [gpu]
        ct200 ansible_host=10.1.0.2 proxmox_vmid=200 ansible_ssh_common_args='-J bastion'
        ct201 ansible_host=10.1.0.3 proxmox_vmid=201 ansible_ssh_common_args='-o ProxyJump=ops@gw:2200,bastion'
        ct202 ansible_host=10.1.0.4 ansible_ssh_common_args="-o 'ProxyCommand=ssh -W %h:%p gw'"
        """},
    "jump-name-in-ssh-config-and-inventory": {
        "hosts.yml": "all:\n  hosts:\n    bastion: {ansible_host: 203.0.113.5, ansible_user: jump}\n"
                     "    ct200: {ansible_host: 10.1.0.2, ansible_ssh_common_args: -J bastion}\n",
        "home/.ssh/config": "Host bastion\n  HostName 192.0.2.99\n  User cfguser\n  Port 2299\n",
    },
    "become-layers": {"hosts": """\
        [gpu]
        ct200 proxmox_vmid=200
        ct201 proxmox_vmid=201 ansible_become_user=bob
        ct202 proxmox_vmid=202 ansible_become=no
        ct203 proxmox_vmid=203 ansible_sudo_user=legacy
        h1 ansible_host=192.0.2.60 ansible_become_method=su ansible_su_user=carol
        h2 ansible_host=192.0.2.61 ansible_become=false ansible_become_user=dave
        h3 ansible_host=192.0.2.62 ansible_become=True
        [gpu:vars]
        ansible_become=yes
        ansible_become_user=trainer
        """},
    "ssh-config-alias-included": {
        "hosts": "[gpu]\nct200 ansible_host=pve-alias proxmox_vmid=200\nct201 ansible_host=other.lab ansible_user=explicit\n",
        "home/.ssh/config": "Include {home}/.ssh/conf.d/*.conf\nHost *.lab\n  Port 2444\n",
        "home/.ssh/conf.d/lab.conf": "Host pve-alias\n  HostName 192.0.2.50\n  Port 2250\n  User labuser\n",
    },
}

PATTERNS = {"ini-groups-children": ["gpu_nodes:!a100", "h200:&gpu_nodes", "ct30*", "~ct20[01]", "!gpu_nodes",
                                    "bastion,pve1"]}  # fmt: skip


def lay_out(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """The corpus entry's files under tmp_path; (what -i gets, the HOME both sides use)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    other = tmp_path / "other_ssh_config"
    other.write_text("Host node.lab\n  HostName 192.0.2.31\n  Port 2231\n  User fromfile\n")
    files = dict(CORPUS[name])
    inventory = files.pop("inventory", None)
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).replace("{config}", str(other)).replace("{home}", str(home)))
    if inventory is None:
        inventory = next(r for r in files if not r.startswith(("group_vars/", "host_vars/", "home/")))
    return tmp_path / inventory, home


def ansible_env(home: Path) -> dict[str, str]:
    bin_dir = str(Path(ANSIBLE or "").parent)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
            "ANSIBLE_NOCOLOR": "1", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}


def ssh_g(home: Path, args: list[str]) -> dict[str, str]:
    """What real ssh resolves for these args (the same ~/.ssh/config gpuops reads), first value per option."""
    config = home / ".ssh" / "config"
    done = subprocess.run(["ssh", "-G", "-F", str(config) if config.exists() else "none", *args], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        out.setdefault(key, value)
    return out


def ansible_connection(home: Path, argv: list[str]) -> dict[str, object]:
    """Where Ansible's ssh would go: the destination, and each ProxyJump hop as its own ssh resolves it."""
    found = ssh_g(home, argv)
    jumps = []
    spec = found.get("proxyjump", "none")
    command = found.get("proxycommand", "none")
    if spec == "none" and command != "none":  # an `ssh -W %h:%p HOP` ProxyCommand: its ssh is the hop
        words = command.split()
        spec = words[-1] + (f":{words[words.index('-p') + 1]}" if "-p" in words else "")
    if spec != "none":
        for hop in spec.split(","):
            user, _, rest = hop.rpartition("@")
            host, _, port = rest[1:].partition("]") if rest.startswith("[") else rest.partition(":")
            port = port.lstrip(":")  # ssh -G writes a hop with a port as [host]:port
            hop_found = ssh_g(home, [*(["-l", user] if user else []), *(["-p", port] if port else []), host])
            jumps.append(f"{hop_found['user']}@{hop_found['hostname']}:{hop_found['port']}")
    return {"address": found["hostname"], "port": int(found["port"]), "user": found["user"], "jumps": jumps}


def members(listed: dict, group: str) -> set[str]:
    """A group's hosts as ansible-inventory lists them, its children's included."""
    node = listed.get(group, {})
    out = set(node.get("hosts", []))
    for child in node.get("children", []):
        out |= members(listed, child)
    return out


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_gpuops_connects_where_ansible_would(tmp_path: Path, name: str) -> None:
    inventory, home = lay_out(tmp_path, name)
    env = ansible_env(home)
    listed_run = subprocess.run([ANSIBLE or "ansible-inventory", "-i", str(inventory), "--list"], capture_output=True,
                                text=True, timeout=180, env=env, cwd=tmp_path)
    assert listed_run.returncode == 0, listed_run.stderr
    listed = json.loads(listed_run.stdout)
    hostvars = listed["_meta"]["hostvars"]
    hosts = sorted(members(listed, "all") | set(hostvars))
    built = subprocess.run([sys.executable, str(HERE / "ansible_ssh_argv.py")], input=json.dumps(
        {h: hostvars.get(h, {}) for h in hosts}), capture_output=True, text=True, timeout=180, env=env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    argv, becomes = json.loads(built.stdout)["argv"], json.loads(built.stdout)["become"]
    expected = {h: ansible_connection(home, argv[h]) for h in hosts}

    ours = gpuops("validate", "-i", str(inventory), "--json", env={"HOME": str(home)})
    assert ours.code == 0, ours
    views = {t["name"]: t for t in ours.events()[-1]["targets"]}
    got = {h: {k: views[h][k] for k in ("address", "port", "user", "jumps")} for h in views}
    assert got == expected
    # Who the job runs as: the user Ansible's become plugin would become, by the method it names (in a
    # container gpuops becomes with runuser, pct exec being root there; root there needs nothing).
    assert {h: views[h]["become_user"] for h in views} == {h: becomes[h]["user"] for h in hosts}
    for h in views:
        theirs = becomes[h]
        ours = views[h]["become_method"]
        if views[h]["ctid"] is not None:
            assert ours == (None if theirs["user"] in (None, "root") else "runuser"), h
        else:
            assert ours == theirs["method"], h

    inv = load_inventory(str(inventory))
    groups = {g for g in listed if g != "_meta"}
    assert {g: set(inv.groups.get(g, ())) for g in groups} == {g: members(listed, g) for g in groups}
    for pattern in PATTERNS.get(name, []):
        chosen = subprocess.run([str(Path(ANSIBLE or "").parent / "ansible"), "-i", str(inventory), pattern,
                                 "--list-hosts"], capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
        assert chosen.returncode == 0, chosen.stderr
        theirs = sorted(line.strip() for line in chosen.stdout.splitlines()[1:] if line.strip())
        assert sorted(t.name for t in resolve_targets(inv, [pattern])) == theirs, pattern


def vault_string(home: Path, password: Path, value: str) -> str:
    """`ansible-vault encrypt_string` of value: the `!vault |` block Ansible writes."""
    done = subprocess.run([str(Path(ANSIBLE or "").parent / "ansible-vault"), "encrypt_string", "--vault-password-file",
                           str(password), value], capture_output=True, text=True, timeout=120, env=ansible_env(home))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_vaulted_values_fail_only_where_gpuops_uses_them_and_the_way_out_shows_the_value(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    password = tmp_path / "pw"
    password.write_text("correct horse\n")
    secret, address = (textwrap.indent(vault_string(home, password, v), "    ").lstrip() for v in ("s3cret", "10.1.2.9"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(f"all:\n  vars:\n    ansible_become_password: {secret}\n  hosts:\n"
                         f"    ct200: {{ansible_host: 10.1.2.6, proxmox_vmid: 200}}\n"
                         f"    ct201:\n      proxmox_vmid: 201\n      ansible_host: {textwrap.indent(address, '  ').lstrip()}\n")
    env = ansible_env(home)
    listed_run = subprocess.run([ANSIBLE or "", "-i", str(inventory), "--list", "--vault-password-file", str(password)],
                                capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert listed_run.returncode == 0, listed_run.stderr
    listed = json.loads(listed_run.stdout)
    # ansible-inventory keeps vaulted values encrypted, password or not: its JSON is no way out of vault.
    assert set(listed["_meta"]["hostvars"]["ct201"]["ansible_host"]) == {"__ansible_vault"}
    as_json = tmp_path / "inv.json"
    as_json.write_text(listed_run.stdout)
    built = subprocess.run([sys.executable, str(HERE / "ansible_ssh_argv.py")], capture_output=True, text=True,
                           timeout=180, env=env, input=json.dumps({"ct200": listed["_meta"]["hostvars"]["ct200"]}))
    assert built.returncode == 0, built.stderr
    theirs = ansible_connection(home, json.loads(built.stdout)["argv"]["ct200"])
    errors = {}
    for source in (inventory, as_json):
        ours = gpuops("validate", "-i", str(source), "--json", env={"HOME": str(home)})
        assert ours.code == 0, ours
        views = {t["name"]: t for t in ours.events()[-1]["targets"]}
        assert {k: views["ct200"][k] for k in theirs} == theirs  # the unused vaulted password costs nothing
        errors[source] = error = views["ct201"]["error"]
        assert "got an Ansible Vault value (!vault): gpuops does not decrypt vault" in error, error
        selected = gpuops("validate", "-i", str(source), "-p", str(write_playbook(tmp_path)), "-t", "ct201",
                          env={"HOME": str(home)})
        assert selected.code == 2 and "Ansible Vault" in selected.err, selected
    # The way out the message names, run as it says (FILE: the vault password file), shows what Ansible decrypts;
    # from the JSON it names the inventory the JSON came from, which gpuops cannot know (Ansible cannot read
    # --list JSON back as an inventory).
    assert "`ansible -i INVENTORY ct201 -m debug -a var=ansible_host --vault-password-file FILE`" in errors[as_json]
    way_out = shlex.split(errors[inventory].split("`")[-2].replace("FILE", str(password)))
    way_out[0] = str(Path(ANSIBLE or "").parent / way_out[0])
    shown = subprocess.run(way_out, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert shown.returncode == 0 and '"ansible_host": "10.1.2.9"' in shown.stdout, shown


def write_playbook(folder: Path) -> Path:
    path = folder / "pb.yaml"
    path.write_text("launch: {session: s, command: train}\n")
    return path


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 15
    assert os.path.isfile(HERE / "ansible_ssh_argv.py")
