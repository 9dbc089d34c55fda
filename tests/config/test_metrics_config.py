"""watch.metrics as the playbook loader reads it (gpuops/config/keys/metrics_keys.py): each bad value is one message at its
line (exit 2 from validate), a secret Pushgateway URL is never shown, and what the watchdog gets (watch.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench.playbooks import playbook_error, write_playbook

from gpuops.client.runspec import prepare_spec
from gpuops.config import load_playbook

HEAD = "name: m\nlaunch: {session: s, command: train}\n"
WATCH = "watch:\n  metrics:\n"
SECRET = "http://metrics:hunter2-pass@127.0.0.1:9091/under/s3cret-path"


@pytest.mark.parametrize("section, said", [
    ("    textfile: metrics/here\n", "5:15: watch.metrics.textfile is a folder on the target written absolute"),
    ("    textfile: ''\n", "5:15: expected a folder on the target"),
    ("    textfile: \"/var/lib/x\\0y\"\n", "without NUL characters"),
    ("    pushgateway: ftp://host/x\n", "5:18: watch.metrics.pushgateway is not an http:// or https:// URL with a host: "
                                     "got 'ftp://host/x'"),
    ("    pushgateway: {value: 'ftp://user:pw@host/x', secret: true}\n", "is not an http:// or https:// URL with a host "
                                                                         "(its value is a secret: not shown)"),
    ("    pushgateway: {from_env: NOT_SET_HERE}\n", "environment variable 'NOT_SET_HERE' is not set "
                                                    "(watch.metrics.pushgateway reads its URL from it)"),
    ("    pushgateway: {}\n", "watch.metrics.pushgateway takes `value` (the URL) or `from_env`"),
    ("    keep_ended: 90000\n", "5:17: watch.metrics.keep_ended is at most 86400 seconds (a day), got 90000"),
    ("    keep_ended: -1\n", "5:17: expected a number of seconds >= 0"),
    ("    textfle: /x\n", "5:5: unknown key 'textfle' in watch.metrics"),
])
def test_a_bad_metrics_value_is_one_message_at_its_line(tmp_path: Path, section: str, said: str) -> None:
    message = playbook_error(write_playbook(tmp_path, HEAD, WATCH + section))
    assert said in message, message
    assert "hunter2" not in message and "pw@" not in message


def test_the_keys_reach_watch_json_and_a_secret_url_is_masked_where_shown(tmp_path: Path) -> None:
    path = write_playbook(tmp_path, HEAD, WATCH + "    textfile: ~/metrics\n    pushgateway: {from_env: PGW}\n"
                                          "    keep_ended: 30\n")
    pb = load_playbook(path, environ={"PGW": SECRET})
    m = pb.watch.metrics
    assert (m.textfile, m.pushgateway, m.secret, m.from_env, m.keep_ended) == ("~/metrics", SECRET, True, "PGW", 30.0)
    assert SECRET in pb.secrets and SECRET.split("://", 1)[1] in pb.secrets
    play = _play(pb)
    sent = json.loads(prepare_spec(play, "20261206-000000-abcdef"))["watch"]["metrics"]
    assert sent == {"textfile": "~/metrics", "pushgateway": SECRET, "secret": True, "keep_ended": 30.0}
    shown = prepare_spec(play, "20261206-000000-abcdef", shown=True).decode()
    assert "hunter2" not in shown and "s3cret" not in shown
    assert json.loads(shown)["watch"]["metrics"]["pushgateway"] == "***"


def test_no_metrics_key_is_none_and_a_plain_url_is_no_secret(tmp_path: Path) -> None:
    bare = load_playbook(write_playbook(tmp_path, HEAD, ""), environ={})
    assert not bare.watch.metrics.textfile and not bare.watch.metrics.pushgateway
    plain = load_playbook(write_playbook(tmp_path, HEAD, WATCH + "    pushgateway: http://127.0.0.1:9091\n"), environ={})
    assert (plain.watch.metrics.pushgateway, plain.watch.metrics.secret) == ("http://127.0.0.1:9091", False)
    unset = load_playbook(write_playbook(tmp_path, HEAD, WATCH + "    pushgateway: {from_env: PGW}\n"), environ={},
                          need_env=False)  # validate, status: the variable need not be set here
    assert unset.watch.metrics.secret and not unset.watch.metrics.pushgateway


def _play(pb: object) -> object:
    """The smallest Play prepare_spec reads: the playbook on the local target (no transport: nothing runs)."""
    from gpuops.client.play import Play
    from gpuops.config import load_inventory

    inv = load_inventory(str(Path(__file__).resolve().parents[2] / "inventories" / "local.yaml"))
    return Play(inv, pb, inv.targets["local"], None)  # type: ignore[arg-type]
