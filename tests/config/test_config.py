"""Inventories and playbooks: the shipped files load, and each bad input gets its FILE:LINE:COL message."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from bench.cli import gpuops

from gpuops.client.launch.sequential_warmup import render_warmup_command
from gpuops.config import load_inventory, load_playbook, resolve_target
from gpuops.config.playbook_model import EnvVar, Preflight, RuleSpec
from gpuops.errors import ConfigError, UsageError
from gpuops.position import Mark

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = "launch: {session: s, command: c}\n"


def write(tmp_path: Path, text: str, name: str = "f.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def inventory_error(tmp_path: Path, text: str) -> str:
    """The message for a bad inventory, without the FILE: prefix (checked here)."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(path + ":"), message
    return message[len(path) + 1 :]


def playbook_error(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_playbook(path, environ=environ or {})
    message = str(info.value)
    assert message.startswith(path + ":"), message
    return message[len(path) + 1 :]


# --- the shipped files ------------------------------------------------------------------------


def test_example_inventory_loads() -> None:
    inv = load_inventory(str(ROOT / "inventories/example.yaml"))
    pve1, bastion = inv.hosts["pve1"], inv.hosts["bastion"]
    assert (pve1.address, pve1.user, pve1.port, pve1.jump) == ("10.1.2.6", "root", 22, "bastion")
    assert (pve1.identity_file, pve1.known_hosts, pve1.host_key_policy) == (
        "~/.ssh/id_ed25519",
        "~/.ssh/known_hosts",
        "strict",
    )
    assert bastion.transport == "ssh" and bastion.address == "10.1.2.5" and bastion.jump is None
    ct200 = inv.targets["ct200"]
    assert (ct200.host, ct200.ctid, ct200.gpus) == ("pve1", 200, (0, 1, 2, 3, 4, 5, 6, 7))
    assert ct200.mark == Mark(str(ROOT / "inventories/example.yaml"), 14, 3)
    assert inv.path == str(ROOT / "inventories/example.yaml")


def test_local_inventory_loads() -> None:
    inv = load_inventory(str(ROOT / "inventories/local.yaml"))
    assert inv.hosts["here"].transport == "local"
    assert inv.targets["local"].host == "here" and inv.targets["local"].ctid is None


def test_dflash_playbook_loads() -> None:
    pb = load_playbook(str(ROOT / "playbooks/dflash.yaml"), environ={})
    assert (pb.name, pb.target, pb.workdir) == ("dflash-drafter", "ct200", "/root")
    assert pb.env == (EnvVar("PYTHONUNBUFFERED", "1", False),)
    assert pb.preflight == Preflight(gpus=(5, 6, 7), max_memory_used_mib=500, max_utilization_pct=10)
    assert pb.warmup is not None
    assert pb.warmup.gpus == (5, 6, 7) and pb.warmup.timeout == 1200.0 and pb.warmup.drain_timeout == 120.0
    assert pb.warmup.command == "python /root/warmup_drafter.py --device cuda:{gpu}"
    assert (pb.launch.session, pb.launch.command) == ("dflash-train", "bash /root/start_training.sh")
    assert pb.watch.builtin is True and pb.watch.stall_timeout == 900.0
    assert pb.watch.rules == (RuleSpec("loss-nan", r"loss (nan|inf)\b", "abort"),)
    assert (pb.abort.signal, pb.abort.grace) == ("INT", 30.0)
    assert pb.path == str(ROOT / "playbooks/dflash.yaml")


def test_demo_playbook_loads_and_resolves_on_local_inventory() -> None:
    pb = load_playbook(str(ROOT / "playbooks/demo.yaml"), environ={})
    assert (pb.name, pb.target, pb.workdir) == ("demo", "local", ".")
    assert pb.env == (EnvVar("PYTHONUNBUFFERED", "1", False),)
    assert pb.preflight.gpus == ()
    assert pb.warmup is not None and pb.warmup.gpus == (0, 1)
    assert pb.warmup.command == "python3 demo_trainer.py warmup --gpu {gpu}"
    assert (pb.launch.session, pb.launch.command) == ("gpuops-demo", "python3 demo_trainer.py train")
    assert pb.watch.builtin and [r.name for r in pb.watch.rules] == ["loss-nan"]
    assert pb.watch.stall_timeout == 60.0 and (pb.abort.signal, pb.abort.grace) == ("INT", 5.0)
    inv = load_inventory(str(ROOT / "inventories/local.yaml"))
    assert resolve_target(inv, pb, None).name == "local"


def test_dflash_playbook_resolves_on_example_inventory() -> None:
    inv = load_inventory(str(ROOT / "inventories/example.yaml"))
    pb = load_playbook(str(ROOT / "playbooks/dflash.yaml"), environ={})
    assert resolve_target(inv, pb, None).ctid == 200
    assert resolve_target(inv, pb, "ct200").name == "ct200"


def test_importing_config_does_not_import_yaml() -> None:
    code = "import sys, gpuops.config; assert 'yaml' not in sys.modules, 'yaml imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- files that are not YAML mappings ----------------------------------------------------------


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        load_inventory(str(tmp_path / "nope.yaml"))
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: no such file"
    assert not isinstance(info.value, ConfigError)


def test_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        load_playbook(str(tmp_path))
    assert str(info.value) == f"{tmp_path}: is a directory, expected a YAML file"


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    assert inventory_error(tmp_path, text) == "1:1: the file is empty; expected an inventory with keys: hosts, targets"


def test_empty_playbook(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, "") == "1:1: the file is empty; expected a playbook (launch: is required)"


def test_top_level_list(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "- a\n- b\n") == (
        "1:1: expected a mapping for the inventory (keys: hosts, targets), got a list"
    )


def test_top_level_scalar(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, "just text\n").startswith("1:1: expected a mapping for the playbook (keys: ")


def test_non_utf8_bytes(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"hosts:\n  h: {user: r\xffoot}\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(str(path))
    assert str(info.value) == f"{path}:2:14: not valid UTF-8 (byte 0xff); save the file as UTF-8"


def test_control_character(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"hosts:\n  h: {user: r\x00oot}\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(str(path))
    assert str(info.value) == (
        f'{path}:2:14: character U+0000 is not allowed in a YAML file (in a double-quoted string, write it as "\\u0000")'
    )


def test_bom_does_not_shift_columns(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"\xef\xbb\xbfhosts: {h: {user: r\xffoot}}\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(str(path))
    assert str(info.value) == f"{path}:1:20: not valid UTF-8 (byte 0xff); save the file as UTF-8"


def test_nul_in_path_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        load_inventory("a\0b.yaml")
    assert str(info.value) == "'a\\x00b.yaml': cannot read the file: embedded null byte"


def test_a_file_over_1_mib_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(LAUNCH.encode() + b"#" * (1 << 20))
    with pytest.raises(UsageError) as info:
        load_playbook(str(path), environ={})
    assert str(info.value).startswith(f"{path}: larger than 1 MiB; ")
    path.write_bytes(LAUNCH.encode() + b"#" * ((1 << 20) - len(LAUNCH) - 1) + b"\n")  # exactly 1 MiB: fine
    assert load_playbook(str(path), environ={}).launch.session == "s"


def test_files_from_pipes_are_read_once_and_validate(tmp_path: Path) -> None:
    """`-i <(...)` and /dev/stdin: a pipe gives its text once, however many readers look at the file."""
    inv, pb = ROOT / "inventories/local.yaml", ROOT / "playbooks/demo.yaml"
    script = f'exec "$0" -m gpuops validate -i <(cat {inv}) -p /dev/stdin < <(cat {pb})'
    result = subprocess.run(["bash", "-c", script, sys.executable], capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    assert result.returncode == 0, result
    said = result.stdout.splitlines()  # validate reports on stdout
    assert re.fullmatch(r"ok: /dev/fd/\d+: 1 host\(s\), 1 target\(s\)", said[0]), result
    assert said[1] == "ok: /dev/stdin: playbook 'demo', session 'gpuops-demo'", result


def test_a_device_that_fails_reads_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as info:
        load_inventory("/proc/self/mem")  # open works, read fails (EIO)
    assert str(info.value) == "/proc/self/mem: cannot read the file: Input/output error"


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes("\ufeffhosts: {h: {}}\n".encode())
    assert list(load_inventory(str(path)).hosts) == ["h"]


# --- YAML syntax errors --------------------------------------------------------------------------


def test_tab_indentation(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n\th: {}\n") == (
        "2:1: found a tab character where YAML expects spaces; indent with spaces"
    )


def test_unclosed_quote(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  h: {user: 'root}\n") == (
        "3:1: found unexpected end of stream (while scanning a quoted scalar started at line 2, column 13)"
    )


def test_unclosed_flow_mapping(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts: {h: {}\ntargets: {}\n") == (
        "2:1: did not find expected ',' or '}' (while parsing a flow mapping started at line 1, column 8)"
    )


def test_mapping_value_in_plain_scalar(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts: a: b\n") == "1:9: mapping values are not allowed in this context"


def test_two_documents(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts: {}\n---\ntargets: {}\n") == (
        "2:1: expected a single YAML document, found a second one (remove the '---')"
    )


def test_python_tags_are_refused(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts: !!python/object/apply:os.system [ls]\n") == (
        "1:8: unsupported tag 'tag:yaml.org,2002:python/object/apply:os.system' "
        "(use plain strings, numbers, true/false, lists and mappings)"
    )


def test_undefined_alias(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts: *base\n") == "1:8: unknown alias '*base' (no anchor '&base' before it)"


def test_deep_nesting_is_refused_without_crashing(tmp_path: Path) -> None:
    # yaml.compose would segfault here (its C composer recurses); newer libyaml stops at 1000 levels itself.
    message = inventory_error(tmp_path, "hosts: " + "[" * 100_000 + "\n")
    assert message in ("1:71: nested more than 64 levels deep", "1:1007: exceeded maximum nesting depth")


def test_recursive_alias_does_not_hang(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts: &a {h: *a}\n") == (
        "1:12: unknown key 'h' in host 'h' (expected one of: address, command_timeout, connect_timeout, "
        "host_key_policy, identity_file, jump, known_hosts, port, transport, user)"
    )


def test_self_merge_is_refused(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  h: &a {<<: *a}\n") == "2:6: a mapping cannot merge itself with '<<'"


def test_pure_python_loader_gives_the_same_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    assert inventory_error(tmp_path, "hosts:\n  h:\n    prot: 22\n").startswith("3:5: unknown key 'prot' in host 'h'")
    assert inventory_error(tmp_path, "hosts:\n  h: {user: 'root}\n").startswith("3:1: found unexpected end of stream")
    assert inventory_error(tmp_path, "hosts: " + "[" * 5000 + "\n") == "1:71: nested more than 64 levels deep"
    assert load_inventory(str(ROOT / "inventories/example.yaml")).targets["ct200"].ctid == 200


# --- keys ----------------------------------------------------------------------------------------


def test_unknown_key_suggests_the_closest(tmp_path: Path) -> None:
    text = """\
        name: t
        launch:
            session: s
            command: c
        watch:
            builtin: true
            stall_timout: 10
        """
    assert playbook_error(tmp_path, text) == (
        "7:5: unknown key 'stall_timout' in watch (expected one of: builtin, builtin_rules, compile_after_warmup, "
        "gpu_ecc, gpu_lost, gpu_memory, gpu_slowdown, gpu_xid, host_kernel_log, metrics, recompiles, rules, sample_interval, "
        "slow_node, stacks, stall_auto, stall_timeout, throughput); "
        "did you mean 'stall_timeout'?"
    )


def test_unknown_key_without_a_close_match(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts: {}\nzzz: 1\n") == (
        "2:1: unknown key 'zzz' in the inventory (expected one of: hosts, targets)"
    )


def test_unknown_host_key(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  pve1:\n    prot: 22\n") == (
        "3:5: unknown key 'prot' in host 'pve1' (expected one of: address, command_timeout, connect_timeout, "
        "host_key_policy, identity_file, jump, known_hosts, port, transport, user); did you mean 'port'?"
    )


def test_duplicate_key(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a:\n    port: 22\n    port: 23\n") == (
        "4:5: duplicate key 'port' in host 'a' (first given at line 3, column 5)"
    )


def test_duplicate_host_name(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a: {}\n  a: {}\n") == (
        "3:3: duplicate key 'a' in hosts (first given at line 2, column 3)"
    )


def test_duplicate_top_level_key(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "name: a\nname: b\n") == (
        "3:1: duplicate key 'name' in the playbook (first given at line 2, column 1)"
    )


def test_merge_keys_share_settings(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: &lab {user: root, port: 22}\n  b:\n    <<: *lab\n    port: 2222\n")
    hosts = load_inventory(path).hosts
    assert (hosts["b"].user, hosts["b"].port, hosts["a"].port) == ("root", 2222, 22)


def test_null_value_means_default(tmp_path: Path) -> None:
    pb = load_playbook(write(tmp_path, LAUNCH + "watch:\n  stall_timeout:\nwarmup:\n"), environ={})
    assert pb.watch.stall_timeout == 900.0 and pb.warmup is None


# --- inventory -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ("70000", "70000"),
        ("0", "0"),
        ("abc", "'abc'"),
        ("'22'", "'22' (a quoted string: remove the quotes)"),
        ("22.0", "22.0"),
        ("true", "true"),
        ("[22]", "a list"),
    ],
)
def test_port(tmp_path: Path, value: str, got: str) -> None:
    assert inventory_error(tmp_path, f"hosts:\n  a: {{port: {value}}}\n") == (
        f"2:13: expected a port number (an integer 1..65535), got {got}"
    )


def test_transport_choice(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a: {transport: sssh}\n") == (
        "2:18: expected transport: ssh | local, got 'sssh'; did you mean 'ssh'?"
    )


def test_host_key_policy_choice(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a:\n    host_key_policy: accept_new\n") == (
        "3:22: expected a host key policy: strict | accept-new, got 'accept_new'; did you mean 'accept-new'?"
    )


@pytest.mark.parametrize("key", ["address: x", "user: root", "port: 22", "jump: b", "known_hosts: kh"])
def test_local_host_takes_no_ssh_keys(tmp_path: Path, key: str) -> None:
    name = key.split(":")[0]
    assert inventory_error(tmp_path, f"hosts:\n  a:\n    transport: local\n    {key}\n") == (
        f"4:5: '{name}' does not apply to host 'a' (transport: local takes no ssh settings)"
    )


def test_local_host_takes_a_command_timeout(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  a: {transport: local, command_timeout: 5}\n")
    assert load_inventory(path).hosts["a"].command_timeout == 5.0


@pytest.mark.parametrize("value", ["0", "-1", "abc", ".inf", ".nan", "1e400"])
def test_timeouts_are_positive_finite_seconds(tmp_path: Path, value: str) -> None:
    assert inventory_error(tmp_path, f"hosts:\n  a: {{connect_timeout: {value}}}\n") == (
        f"2:24: expected a number of seconds > 0, got {value if value != 'abc' else repr(value)}"
    )


def test_float_fields_take_ints_and_floats(tmp_path: Path) -> None:
    host = load_inventory(write(tmp_path, "hosts:\n  a: {connect_timeout: 5, command_timeout: 2.5}\n")).hosts["a"]
    assert (host.connect_timeout, host.command_timeout) == (5.0, 2.5)
    assert isinstance(host.connect_timeout, float)


@pytest.mark.parametrize("address", ["-oProxyCommand=sh", "a b", "root@host", "a;b"])
def test_address_is_refused_when_it_could_be_an_option_or_word(tmp_path: Path, address: str) -> None:
    assert inventory_error(tmp_path, f"hosts:\n  a:\n    address: '{address}'\n") == (
        f"3:14: expected a host name or IP address, got {address!r}"
    )


def test_ipv6_address(tmp_path: Path) -> None:
    assert load_inventory(write(tmp_path, "hosts:\n  a: {address: 'fe80::1'}\n")).hosts["a"].address == "fe80::1"


@pytest.mark.parametrize("name", ["-x", "a b", "_a", "a/b", "'é'"])
def test_bad_host_name(tmp_path: Path, name: str) -> None:
    shown = repr(name.strip("'"))
    assert inventory_error(tmp_path, f"hosts:\n  {name}: {{}}\n") == (
        f"2:3: expected a host name (letters, digits, '_', '.' and '-', starting with a letter or digit), got {shown}"
    )


def test_jump_to_unknown_host(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a: {jump: bastoin}\n  bastion: {}\n") == (
        "2:13: jump names unknown host 'bastoin' (hosts: a, bastion); did you mean 'bastion'?"
    )


def test_jump_to_local_host(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a: {jump: h}\n  h: {transport: local}\n") == (
        "2:13: jump names host 'h', which is local (a jump host must use ssh)"
    )


def test_jump_to_itself(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a:\n    jump: a\n") == "3:11: jump loop: a -> a"


def test_jump_loop_of_two(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  a: {jump: b}\n  b: {jump: a}\n") == "2:13: jump loop: a -> b -> a"


def test_jump_loop_reached_through_a_chain(tmp_path: Path) -> None:
    text = "hosts:\n  c: {jump: a}\n  a: {jump: b}\n  b: {jump: d}\n  d: {jump: a}\n"
    assert inventory_error(tmp_path, text) == "3:13: jump loop: a -> b -> d -> a"


def test_jump_chain_without_loop(tmp_path: Path) -> None:
    hosts = load_inventory(write(tmp_path, "hosts:\n  a: {jump: b}\n  b: {jump: c}\n  c: {}\n")).hosts
    assert [hosts[h].jump for h in "abc"] == ["b", "c", None]


def test_target_on_unknown_host(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  pve1: {}\ntargets:\n  t:\n    host: pve2\n") == (
        "5:11: unknown host 'pve2' (hosts: pve1); did you mean 'pve1'?"
    )


def test_target_without_host(tmp_path: Path) -> None:
    assert inventory_error(tmp_path, "hosts:\n  h: {}\ntargets:\n  t:\n    ctid: 200\n") == (
        "5:5: missing key 'host' in target 't' (the name of a host under hosts)"
    )


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ("abc", "'abc'"),
        ("200; rm -rf /", "'200; rm -rf /'"),
        ("'200 && reboot'", "'200 && reboot'"),
        ("$(reboot)", "'$(reboot)'"),
        ('"200"', "'200' (a quoted string: remove the quotes)"),
        ("99", "99"),
        ("1000000000", "1000000000"),
        ("-200", "-200"),
        ("200.0", "200.0"),
        ("0x10", "'0x10'"),
        ("9" * 5000, "9" * 57 + "..."),
    ],
)
def test_ctid_is_an_integer_in_proxmox_range(tmp_path: Path, value: str, got: str) -> None:
    assert inventory_error(tmp_path, f"hosts:\n  h: {{}}\ntargets:\n  t:\n    host: h\n    ctid: {value}\n") == (
        f"6:11: expected a container id (an integer 100..999999999), got {got}"
    )


def test_ctid_bounds_accepted(tmp_path: Path) -> None:
    text = "hosts: {h: {}}\ntargets:\n  a: {host: h, ctid: 100}\n  b: {host: h, ctid: 999999999}\n"
    targets = load_inventory(write(tmp_path, text)).targets
    assert (targets["a"].ctid, targets["b"].ctid) == (100, 999999999)


@pytest.mark.parametrize(
    ("gpus", "column", "message"),
    [
        ("[0, 1, 0]", 29, "GPU 0 is listed twice"),
        ("[0, -1]", 26, "expected a GPU index (an integer >= 0), got -1"),
        ("[0, x]", 26, "expected a GPU index (an integer >= 0), got 'x'"),
        ("3", 22, "expected a list of GPU indexes (e.g. [0, 1]), got 3"),
        ("'0,1'", 22, "expected a list of GPU indexes (e.g. [0, 1]), got '0,1'"),
    ],
)
def test_target_gpus(tmp_path: Path, gpus: str, column: int, message: str) -> None:
    assert inventory_error(tmp_path, f"hosts:\n  h: {{}}\ntargets:\n  t: {{host: h, gpus: {gpus}}}\n") == (
        f"4:{column}: {message}"
    )


# --- playbook ------------------------------------------------------------------------------------


def test_minimal_playbook_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, LAUNCH, name="my-job.yaml")
    pb = load_playbook(path, environ={})
    assert pb.name == "my-job" and pb.target is None and pb.target_mark is None and pb.workdir is None
    assert pb.path == os.path.abspath(path) and pb.warmup is None and pb.env == ()
    assert (pb.watch.builtin, pb.watch.rules, pb.watch.stall_timeout) == (True, (), 900.0)
    assert (pb.abort.signal, pb.abort.grace) == ("INT", 30.0)


def test_relative_workdir_is_kept_as_written(tmp_path: Path) -> None:
    assert load_playbook(write(tmp_path, LAUNCH + "workdir: runs/a\n"), environ={}).workdir == "runs/a"


@pytest.mark.parametrize("written, read", [("~", "~"), ("'~'", "~"), ("~/runs", "~/runs"), ("", None), ("null", None)])
def test_workdir_tilde_is_the_home_not_yaml_null(tmp_path: Path, written: str, read: str | None) -> None:
    """`workdir: ~` is YAML's null, but whoever writes it means the home (as a shell reads it)."""
    assert load_playbook(write(tmp_path, LAUNCH + f"workdir: {written}\n"), environ={}).workdir == read


def test_playbook_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, LAUNCH, name="p.yaml")
    monkeypatch.chdir(tmp_path)
    pb = load_playbook("p.yaml", environ={})
    assert pb.path == str(tmp_path / "p.yaml")


def test_missing_launch(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, "name: t\n") == (
        "1:1: missing key 'launch' in the playbook (a mapping with session and command)"
    )


def test_launch_without_command(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, "launch:\n  session: s\n") == (
        "2:3: missing key 'command' in launch (the training command)"
    )


def test_wrong_type_names_the_expected_type(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "preflight:\n  max_memory_used_mib: abc\n") == (
        "3:24: expected an integer >= 0, got 'abc'"
    )


def test_utilization_is_a_percentage(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "preflight: {max_utilization_pct: 101}\n") == (
        "2:34: expected an integer 0..100, got 101"
    )


@pytest.mark.parametrize("value", ["yes", "no", "on", "'true'", "1", "0", "~x"])
def test_booleans_are_true_or_false_only(tmp_path: Path, value: str) -> None:
    got = value if value.isdigit() else repr(value.strip("'"))
    assert playbook_error(tmp_path, LAUNCH + f"preflight: {{allow_processes: {value}}}\n") == (
        f"2:30: expected true or false, got {got}"
    )


@pytest.mark.parametrize("value", ["true", "True", "TRUE"])
def test_true_spellings(tmp_path: Path, value: str) -> None:
    pb = load_playbook(write(tmp_path, LAUNCH + f"preflight: {{allow_processes: {value}}}\n"), environ={})
    assert pb.preflight.allow_processes is True


def test_bad_playbook_name(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "name: my job\n") == (
        "2:7: expected a playbook name (letters, digits, '_', '.' and '-', starting with a letter or digit), "
        "got 'my job'"
    )


# env and secrets


def test_env_values_are_strings_as_written(tmp_path: Path) -> None:
    text = LAUNCH + "env:\n  SEED: 0\n  LR: 1e-4\n  NAME: run\n  EMPTY: ''\n  FLAG: 'true'\n  ANSWER: yes\n"
    env = load_playbook(write(tmp_path, text), environ={}).env
    assert [(v.name, v.value) for v in env] == [
        ("SEED", "0"),
        ("LR", "1e-4"),
        ("NAME", "run"),
        ("EMPTY", ""),
        ("FLAG", "true"),
        ("ANSWER", "yes"),
    ]


def test_env_null_is_an_error(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "env:\n  A:\n") == '3:5: env \'A\' has no value; write "" for an empty string'


def test_env_boolean_is_an_error(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "env:\n  A: true\n") == (
        "3:6: expected a string or number for env 'A', got true (quote it to use it as text)"
    )


def test_env_list_is_an_error(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "env:\n  A: [1]\n").startswith(
        "3:6: expected a mapping for env 'A' (keys: from_env, secret, value), got a list"
    )


@pytest.mark.parametrize("name", ["1A", "A-B", "'A B'", "'A=B'"])
def test_env_names_are_shell_identifiers(tmp_path: Path, name: str) -> None:
    assert playbook_error(tmp_path, LAUNCH + f"env:\n  {name}: x\n") == (
        "3:3: expected an environment variable name (letters, digits and '_', not starting with a digit), "
        f"got {name.strip(chr(39))!r}"
    )


def test_env_value_with_nul(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + 'env:\n  A: "x\\0y"\n') == (
        "3:6: expected a string or number for env 'A' without NUL characters"
    )


def test_secret_by_name(tmp_path: Path) -> None:
    text = LAUNCH + "env:\n  HF_TOKEN: hf_abc\n  WANDB_API_KEY: k\n  DB_PASSWORD: p\n  PLAIN: v\n"
    pb = load_playbook(write(tmp_path, text), environ={})
    assert {v.name: v.secret for v in pb.env} == {
        "HF_TOKEN": True,
        "WANDB_API_KEY": True,
        "DB_PASSWORD": True,
        "PLAIN": False,
    }
    assert pb.secrets == ("hf_abc", "k", "p")


def test_secret_by_flag(tmp_path: Path) -> None:
    text = LAUNCH + "env:\n  HUB: {value: s3cr3t, secret: true}\n  CACHE_KEY_PREFIX: {value: run, secret: false}\n"
    pb = load_playbook(write(tmp_path, text), environ={})
    assert pb.env == (EnvVar("HUB", "s3cr3t", True), EnvVar("CACHE_KEY_PREFIX", "run", False))


def test_secret_from_env(tmp_path: Path) -> None:
    text = LAUNCH + "env:\n  HUB: {from_env: MY_HUB, secret: true}\n  USER_NAME: {from_env: ME}\n"
    pb = load_playbook(write(tmp_path, text), environ={"MY_HUB": "tok", "ME": "ann"})
    assert pb.env == (EnvVar("HUB", "tok", True), EnvVar("USER_NAME", "ann", False))
    assert pb.secrets == ("tok",)


def test_secret_by_secrets_list(tmp_path: Path) -> None:
    text = LAUNCH + "secrets: [HUB]\nenv:\n  HUB: x1\n  OTHER: y\n"
    pb = load_playbook(write(tmp_path, text), environ={})
    assert [(v.name, v.secret) for v in pb.env] == [("HUB", True), ("OTHER", False)]


def test_from_env_missing_variable(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "env:\n  HUB: {from_env: HUB_TOKEN}\n", environ={}) == (
        "3:19: environment variable 'HUB_TOKEN' is not set (env 'HUB' reads it with from_env)"
    )


def test_value_and_from_env_together(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "env:\n  A:\n    value: x\n    from_env: B\n") == (
        "5:5: env 'A' takes 'value' or 'from_env', not both"
    )


def test_env_mapping_without_value(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "env:\n  A:\n    secret: true\n") == (
        "4:5: missing key 'value' or 'from_env' in env 'A'"
    )


def test_secrets_list_names_unknown_variable(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "secrets: [HUB_TOKN]\nenv:\n  HUB_TOKEN: x\n") == (
        "2:11: secrets lists 'HUB_TOKN', which is not set in env; did you mean 'HUB_TOKEN'?"
    )


def test_secrets_list_contradicts_flag(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "secrets: [A]\nenv:\n  A: {value: x, secret: false}\n") == (
        "4:3: env 'A' says secret: false but is listed in secrets"
    )


def test_from_env_value_that_is_not_utf8_is_refused_by_validate_and_launch(tmp_path: Path) -> None:
    pb = write(tmp_path, "target: local\n" + LAUNCH + "env:\n  HUB: {from_env: HUB_TOKEN}\n")
    bad = {"HOME": str(tmp_path), "HUB_TOKEN": "hf_sekrit\udc80"}  # bytes 0x80: what os.environ gives for them
    expected = f"gpuops: error: {pb}:4:19: environment variable 'HUB_TOKEN' (read by env 'HUB' with from_env) is not valid UTF-8"
    for command in (["validate"], ["launch", "--yes"]):
        result = gpuops(*command, "-i", str(ROOT / "inventories/local.yaml"), "-p", pb, env=bad)
        assert result.code == 2 and result.err.splitlines()[0] == expected, result
        assert "sekrit" not in result.err + result.text, result
    assert not (tmp_path / ".gpuops").exists()  # refused before anything ran: no run directory


def test_secret_shorter_than_3_characters_is_a_validate_warning(tmp_path: Path) -> None:
    text = LAUNCH + "env:\n  HUB_TOKEN: ab\n  PIN: {value: '7', secret: true}\n  TAG: ab\n  DB_PASSWORD: abc\n  NO_KEY: ''\n"
    pb = write(tmp_path, text)
    warnings = [
        f"{pb}:3:3: secret env 'HUB_TOKEN' is shorter than 3 characters: gpuops cannot mask it in its output",
        f"{pb}:4:3: secret env 'PIN' is shorter than 3 characters: gpuops cannot mask it in its output",
    ]
    assert load_playbook(pb, environ={}).warnings == tuple(warnings)
    result = gpuops("validate", "-p", pb)
    assert result.code == 0 and result.err.splitlines() == [f"warning: {w}" for w in warnings], result
    assert result.text.startswith("ok: "), result  # the report on stdout, its warnings on stderr
    as_json = gpuops("validate", "--json", "-p", pb)
    assert as_json.code == 0 and as_json.events()[-1]["warnings"] == warnings, as_json


def test_a_playbook_without_findings_has_no_warnings(tmp_path: Path) -> None:
    result = gpuops("validate", "--json", "-p", str(ROOT / "playbooks/dflash.yaml"))
    assert result.code == 0 and result.events()[-1]["warnings"] == [], result


def test_env_string_over_max_arg_strlen_is_refused_by_validate(tmp_path: Path) -> None:
    limit = 131072 - len("BIG=") - 1  # the kernel counts NAME=value and its NUL
    pb = write(tmp_path, LAUNCH + f"env:\n  BIG: {'x' * limit}\n")
    assert gpuops("validate", "-p", pb).code == 0
    pb = write(tmp_path, LAUNCH + f"env:\n  BIG: {'x' * (limit - 1)}é\n")  # é is two bytes
    result = gpuops("validate", "-p", pb)
    assert result.code == 2 and result.err.startswith(
        f"gpuops: error: {pb}:3:8: env 'BIG' is too large to pass: BIG=value is 131072 bytes, and Linux refuses "
        "any single environment string over 131072 bytes, its NUL included (MAX_ARG_STRLEN)"
    ), result


def test_env_from_env_over_max_arg_strlen_is_refused(tmp_path: Path) -> None:
    message = playbook_error(tmp_path, LAUNCH + "env:\n  BIG: {from_env: HUGE}\n", environ={"HUGE": "x" * 131068})
    assert message.startswith(
        "3:19: environment variable 'HUGE' (read by env 'BIG' with from_env) is too large to pass: BIG=value is "
        "131072 bytes"
    ), message


def test_env_over_1_mib_in_all_is_refused(tmp_path: Path) -> None:
    value = "x" * 120_000
    names = [f"V{i}" for i in range(9)]  # aliases: 9 x 120 kB of env from a 120 kB file
    text = LAUNCH + f"env:\n  {names[0]}: &v {value}\n" + "".join(f"  {n}: *v\n" for n in names[1:])
    message = playbook_error(tmp_path, text)
    assert message.startswith(
        "11:3: env 'V8' brings the environment to 1080036 bytes (NAME=value strings), over gpuops' limit of 1 MiB"
    ), message
    assert len(load_playbook(write(tmp_path, text.rsplit("  V8", 1)[0]), environ={}).env) == 8


# launch session


@pytest.mark.parametrize(
    ("session", "why"),
    [
        ("'a:b'", "tmux reads ':' and '.' as window and pane separators, so they cannot be used"),
        ("a.b", "tmux reads ':' and '.' as window and pane separators, so they cannot be used"),
        ("''", "it is empty"),
        ("'a b'", "it cannot contain whitespace or control characters"),
        ('"a\\tb"', "it cannot contain whitespace or control characters"),
        ("-a", "it cannot start with '-' (tmux would read it as an option)"),
    ],
)
def test_tmux_session_names(tmp_path: Path, session: str, why: str) -> None:
    value = {"'a:b'": "a:b", "''": "", "'a b'": "a b", '"a\\tb"': "a\tb"}.get(session, session)
    assert playbook_error(tmp_path, f"launch:\n  session: {session}\n  command: c\n") == (
        f"2:12: invalid tmux session name {value!r}: {why}"
    )


# watch rules


def test_rule_pattern_must_compile(tmp_path: Path) -> None:
    text = LAUNCH + "watch:\n  rules:\n    - name: nan\n      pattern: 'loss (nan|inf'\n"
    assert playbook_error(tmp_path, text) == (
        "5:22: pattern of rule 'nan' is not a valid Python regular expression: missing ), unterminated subpattern"
    )


def test_rule_pattern_error_points_into_the_pattern(tmp_path: Path) -> None:
    text = LAUNCH + "watch:\n  rules:\n    - name: x\n      pattern: loss [nan\n"
    assert playbook_error(tmp_path, text) == (
        "5:21: pattern of rule 'x' is not a valid Python regular expression: unterminated character set"
    )


def test_rule_empty_pattern(tmp_path: Path) -> None:
    text = LAUNCH + "watch:\n  rules:\n    - {name: x, pattern: ''}\n"
    assert playbook_error(tmp_path, text) == "4:26: rule 'x' has an empty pattern, which would match every line"


def test_rule_names_are_unique(tmp_path: Path) -> None:
    text = LAUNCH + "watch:\n  rules:\n    - {name: x, pattern: a}\n    - {name: x, pattern: b}\n"
    assert playbook_error(tmp_path, text) == "5:14: duplicate rule name 'x' (first at line 4, column 14)"


def test_rule_action(tmp_path: Path) -> None:
    text = LAUNCH + "watch:\n  rules:\n    - {name: x, pattern: a, action: wran}\n"
    assert playbook_error(tmp_path, text) == "4:37: expected an action: abort | warn, got 'wran'; did you mean 'warn'?"


def test_rule_unknown_key(tmp_path: Path) -> None:
    text = LAUNCH + "watch:\n  rules:\n    - {name: x, pattern: a}\n    - {name: y, patern: b}\n"
    assert playbook_error(tmp_path, text) == (
        "5:17: unknown key 'patern' in watch.rules[1] (expected one of: action, name, pattern); "
        "did you mean 'pattern'?"
    )


def test_rule_defaults_to_abort(tmp_path: Path) -> None:
    text = LAUNCH + "watch:\n  rules:\n    - {name: x, pattern: a}\n    - {name: y, pattern: b, action: warn}\n"
    rules = load_playbook(write(tmp_path, text), environ={}).watch.rules
    assert rules == (RuleSpec("x", "a", "abort"), RuleSpec("y", "b", "warn"))


def test_stall_timeout_zero_is_off_and_negative_refused(tmp_path: Path) -> None:
    assert load_playbook(write(tmp_path, LAUNCH + "watch: {stall_timeout: 0}\n"), environ={}).watch.stall_timeout == 0
    assert playbook_error(tmp_path, LAUNCH + "watch: {stall_timeout: -1}\n") == (
        "2:24: expected a number of seconds >= 0, got -1 (0 turns it off; auto learns it from the run)"
    )


# abort signal


@pytest.mark.parametrize(("value", "name"), [("INT", "INT"), ("SIGTERM", "TERM"), ("kill", "KILL"), ("SigUsr1", "USR1")])
def test_signal_names_are_normalised(tmp_path: Path, value: str, name: str) -> None:
    assert load_playbook(write(tmp_path, LAUNCH + f"abort: {{signal: {value}}}\n"), environ={}).abort.signal == name


def test_signal_number_is_refused(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "abort: {signal: 9}\n") == (
        "2:17: expected a signal name (INT, TERM, HUP, QUIT, KILL, USR1, USR2, ABRT, ALRM, PIPE, with or without SIG), "
        "got the number 9: signal numbers differ between systems"
    )


def test_unknown_signal_is_refused(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "abort: {signal: SIGTREM}\n") == (
        "2:17: expected a signal name (INT, TERM, HUP, QUIT, KILL, USR1, USR2, ABRT, ALRM, PIPE, with or without SIG), "
        "got 'SIGTREM'; did you mean 'TERM'?"
    )


# warmup command placeholders


def test_warmup_without_placeholder_is_fine(tmp_path: Path) -> None:
    pb = load_playbook(write(tmp_path, LAUNCH + "warmup: {gpus: [1, 0], command: ./warm.sh}\n"), environ={})
    assert pb.warmup is not None and pb.warmup.gpus == (1, 0) and pb.warmup.command == "./warm.sh"


def test_warmup_escaped_braces_reach_the_shell_as_single_braces(tmp_path: Path) -> None:
    """`${{HOME}}` and `awk '{{print $1}}'` run as `${HOME}` and `awk '{print $1}'`, with {gpu} replaced:
    what the warmup runs on the target, and what --dry-run shows."""
    text = "target: local\n" + LAUNCH + "warmup:\n  gpus: [3]\n  command: echo ${{HOME}}:{gpu} | awk '{{print $1}}'\n"
    path = write(tmp_path, text)
    command = render_warmup_command(load_playbook(path, environ={}).warmup.command, 3)
    assert command == "echo ${HOME}:3 | awk '{print $1}'"
    ran = subprocess.run(["bash", "-c", command], env={"HOME": "/home/op", "PATH": os.environ["PATH"]},
                         capture_output=True, text=True, timeout=10)
    assert (ran.returncode, ran.stdout) == (0, "/home/op:3\n")
    dry = gpuops("launch", "--dry-run", "-i", str(ROOT / "inventories/local.yaml"), "-p", path)
    assert dry.code == 0 and shlex.quote(command).encode() in dry.out


def test_warmup_unknown_placeholder(tmp_path: Path) -> None:
    text = LAUNCH + "warmup:\n  gpus: [0]\n  command: run --device cuda:{device}\n"
    assert playbook_error(tmp_path, text) == (
        "4:30: unknown placeholder '{device}' in the warmup command: only {gpu} is replaced; "
        "write '{{' and '}}' for literal braces, e.g. ${{HOME}}"
    )


def test_warmup_shell_braces_need_escaping(tmp_path: Path) -> None:
    text = LAUNCH + "warmup:\n  gpus: [0]\n  command: 'cd ${HOME} && run {gpu}'\n"
    assert playbook_error(tmp_path, text).startswith("4:17: unknown placeholder '{HOME}' in the warmup command")


def test_warmup_single_brace(tmp_path: Path) -> None:
    text = LAUNCH + "warmup:\n  gpus: [0]\n  command: run {gpu\n"
    assert playbook_error(tmp_path, text).startswith("4:16: unclosed '{' in the warmup command")


def test_warmup_requires_gpus(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "warmup:\n  command: w\n") == (
        "3:3: missing key 'gpus' in warmup (the GPUs to warm up, in order)"
    )


def test_warmup_gpus_distinct(tmp_path: Path) -> None:
    assert playbook_error(tmp_path, LAUNCH + "warmup: {gpus: [1, 1], command: w}\n") == "2:20: GPU 1 is listed twice"


# --- resolve_target ------------------------------------------------------------------------------


@pytest.fixture()
def inventory(tmp_path: Path):
    text = "hosts: {h: {}}\ntargets:\n  ct200: {host: h, ctid: 200, gpus: [0, 1]}\n  ct201: {host: h, ctid: 201}\n"
    return load_inventory(write(tmp_path, text, name="inv.yaml"))


def test_resolve_by_name_overrides_playbook(tmp_path: Path, inventory) -> None:
    pb = load_playbook(write(tmp_path, LAUNCH + "target: ct200\n"), environ={})
    assert resolve_target(inventory, pb, "ct201").name == "ct201"
    assert resolve_target(inventory, pb, None).name == "ct200"
    assert resolve_target(inventory, None, "ct201").ctid == 201


def test_resolve_unknown_name_is_a_usage_error(inventory) -> None:
    with pytest.raises(UsageError) as info:
        resolve_target(inventory, None, "ct2000")
    assert not isinstance(info.value, ConfigError)
    assert str(info.value) == f"unknown target 'ct2000' (targets in {inventory.path}: ct200, ct201); did you mean 'ct200'?"


def test_resolve_unknown_playbook_target_points_at_the_playbook(tmp_path: Path, inventory) -> None:
    path = write(tmp_path, LAUNCH + "target: ct300\n")
    pb = load_playbook(path, environ={})
    with pytest.raises(ConfigError) as info:
        resolve_target(inventory, pb, None)
    assert str(info.value) == (
        f"{path}:2:9: unknown target 'ct300' (targets in {inventory.path}: ct200, ct201); did you mean 'ct200'?"
    )


def test_resolve_without_any_target(inventory) -> None:
    with pytest.raises(UsageError) as info:
        resolve_target(inventory, None, None)
    assert str(info.value) == (
        f"no target given: pass -t NAME or set 'target:' in the playbook (targets in {inventory.path}: ct200, ct201)"
    )


def test_resolve_refuses_gpus_the_target_lacks(tmp_path: Path, inventory) -> None:
    path = write(tmp_path, LAUNCH + "warmup:\n  gpus: [1, 2]\n  command: w\n")
    pb = load_playbook(path, environ={})
    with pytest.raises(ConfigError) as info:
        resolve_target(inventory, pb, "ct200")
    assert str(info.value) == f"{path}:3:9: warmup uses GPU 2, which target 'ct200' does not have (its gpus: 0, 1)"
    assert resolve_target(inventory, pb, "ct201").name == "ct201"  # declares no gpus: not checked
