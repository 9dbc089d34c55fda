"""`gpuops schema`: one JSON Schema (draft 2020-12) that every object any `--json` prints validates against.

Units: the schema is a valid 2020-12 schema, closed per event (an undocumented field is refused),
versioned, and every event and field in it is named in docs/json.md. On the bench (real sshd, pct
stand-in, real tmux): each command's --json (launch with warmup and an abort, logs, logs -f,
status, runs, stop, validate, launch --dry-run, a usage error) printed through bench.cli, whose
hook validates every line against the CLI's own `gpuops schema`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from bench import jsoncheck
from bench.cli import CtCli, gpuops

from gpuops.agent.wire.protocol import SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]
SESSION = "schema"
GPUS = (5, 6)


def printed_schema() -> dict:
    result = gpuops("schema")
    assert result.code == 0, result
    return json.loads(result.out)


def test_gpuops_schema_prints_a_draft_2020_12_schema_of_closed_versioned_events() -> None:
    schema = printed_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    kinds = schema["properties"]["event"]["enum"]
    assert {"summary", "status", "run", "dry_run_step", "restart", "match", "log"} <= set(kinds)
    assert [b["$ref"] for b in schema["oneOf"]] == [f"#/$defs/{k}" for k in kinds]
    for kind in kinds:
        d = schema["$defs"][kind]
        assert d["additionalProperties"] is False, kind
        assert {"ts", "event", "target", "schema_version"} <= set(d["required"]), kind
        assert d["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
        assert d["properties"]["event"] == {"const": kind}


def test_the_whole_schema_refuses_an_undocumented_field_a_wrong_type_and_a_missing_version() -> None:
    validator = jsonschema.Draft202012Validator(printed_schema())
    good = {"ts": "2026-12-01T10:00:00.000Z", "event": "warmup_done", "target": "ct200", "run": "20261201-100000-abcdef",
            "gpu": 5, "seconds": 1.5, "schema_version": SCHEMA_VERSION}
    assert validator.is_valid(good)
    assert not validator.is_valid({**good, "surprise": 1})  # documented nowhere
    assert not validator.is_valid({**good, "gpu": "5"})
    assert not validator.is_valid({k: v for k, v in good.items() if k != "schema_version"})
    assert not validator.is_valid({**good, "event": "no_such_event"})
    line = json.dumps({**good, "surprise": 1})
    assert any("surprise" in p for p in jsoncheck.problems(line + "\n"))  # the suite's hook says which field


def doc_sections() -> dict[str, str]:
    """docs/json.md's `### `name`` sections (and `### Every object`), by name."""
    doc = (REPO / "docs" / "json.md").read_text()
    parts = re.split(r"^###? ", doc, flags=re.M)
    return {m.group(1): part for part in parts if (m := re.match(r"`?([A-Za-z_ ]+?)`?\n", part))}


def test_docs_json_documents_every_event_and_field_of_the_schema_in_its_own_section() -> None:
    schema = printed_schema()
    sections = doc_sections()
    common = set(re.findall(r"`([a-z_0-9]+)`", sections["Every object"]))
    missing = {}
    for name, d in schema["$defs"].items():
        named = set(re.findall(r"`([a-z_0-9-]+)`", sections.get(name, "")))
        for field in d.get("properties", {}):
            if field not in named and not (field in common and field in ("ts", "event", "target", "run", "schema_version")):
                missing.setdefault(name, []).append(field)
    assert not missing, f"fields not documented in their docs/json.md section: {missing}"
    what = set(schema["$defs"]["watchdog"]["properties"]["what"]["enum"])
    assert what <= set(re.findall(r"`([a-z_]+)`", sections["watchdog"])), what


# -- every command's --json on the bench ---------------------------------------------------------------
class Ct(CtCli):
    def playbook_for(self, command: str) -> Path:
        return self.write({
            "name": "schema-check",
            "preflight": {"gpus": list(GPUS)},
            "warmup": {"gpus": [GPUS[0]], "command": "echo warming {gpu}", "timeout": 60},
            "launch": {"session": SESSION, "command": command},
            "watch": {"stall_timeout": 0},
            "abort": {"grace": 3},
        })


def fx(*extra: str) -> str:
    return " ".join(["fake-train", "--mode", "fx-thread", "--gpus", ",".join(map(str, GPUS)), "--interval", "0.05",
                     "--slow-interval", "0.05", *extra])


def kinds(result) -> list[str]:
    return [e["event"] for e in result.events()]


def test_every_commands_json_validates_against_the_schema(ct: Ct) -> None:
    """bench.cli validates each line; this test makes sure each command printed what it should."""
    ct.playbook_for(fx())
    dry = ct.gpuops("launch", "--dry-run", "--json")
    assert dry.code == 0 and "dry_run_step" in kinds(dry), dry
    launch = ct.gpuops("launch", "--json", "--timeout", "120")
    assert launch.code == 7, launch
    got = kinds(launch)
    for kind in ("preflight_ok", "run_created", "warmup_start", "warmup_output", "warmup_done", "started", "log",
                 "match", "abort_start", "summary"):
        assert kind in got, (kind, got)
    summary = launch.events()[-1]
    assert (summary["exit_code"], summary["rule"], summary["schema_version"]) == (7, "fx-tracing-race", SCHEMA_VERSION)
    for args in (("logs", "--json"), ("logs", "-f", "--json"), ("status", "--json"), ("runs", "--json"),
                 ("stop", "--json")):
        result = ct.gpuops(*args)
        assert result.code in (0, 7), (args, result)
        assert result.events(), args
    status = ct.gpuops("status", "--json").events()
    (run,) = [s["run"] for s in status[0]["sessions"] if s["run"]]
    assert (run["state"], run["exit_code"]) == ("aborted", 7)  # gpuops' code, as the launch exited
    (row,) = ct.gpuops("runs", "--json").events()[:1]
    assert (row["run"], row["exit_code"], row["command_exit_code"]) == (run["id"], 7, run["command_exit_code"])
    valid = gpuops("validate", "-i", str(ct.inventory), "-p", str(ct.playbook), "--json")
    assert valid.code == 0 and valid.events()[-1]["outcome"] == "valid", valid
    bad = gpuops("status", "-i", str(ct.inventory), "-t", "no-such-target", "--json")
    assert bad.code == 2 and bad.events()[-1]["event"] == "summary", bad


def test_the_hook_fails_a_test_whose_gpuops_prints_an_invalid_line() -> None:
    with pytest.raises(AssertionError, match="do not validate"):
        jsoncheck.check(["status", "--json"], b'{"event": "status", "target": "x"}\n')
    jsoncheck.check(["status"], b"not json: no --json asked\n")
