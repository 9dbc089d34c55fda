"""Every line a `gpuops ... --json` prints in the tests is checked against `gpuops schema`.

The schema comes from the CLI itself (once per test process), so what users get from
`gpuops schema` is what the suite holds the output to. A line that is not one JSON object, or
that does not validate (an undocumented field, a wrong type, a missing schema_version), fails
the test that printed it.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from typing import Any, Iterable


@functools.lru_cache(maxsize=1)
def _validators() -> dict[str, Any]:
    import jsonschema

    out = subprocess.run([sys.executable, "-m", "gpuops", "schema"], capture_output=True, check=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    schema = json.loads(out.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    cls = jsonschema.Draft202012Validator
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    # One validator per event kind: a failure names the fields of that kind, not 30 oneOf branches.
    return {kind: cls({"$ref": f"#/$defs/{kind}", "$defs": schema["$defs"]}, format_checker=checker)
            for kind in schema["properties"]["event"]["enum"]}


def wants_json(args: Iterable[str]) -> bool:
    return "--json" in args


def problems(stdout: bytes | str, *, complete_only: bool = False) -> list[str]:
    """What is wrong with each line of a --json stdout (empty: all valid). complete_only: a last line without
    its newline (the process was killed mid-write) is left out."""
    text = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    lines = text.split("\n")
    if complete_only or lines[-1] == "":
        lines.pop()
    validators = _validators()
    found = []
    for n, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except ValueError as exc:
            found.append(f"line {n}: not JSON ({exc}): {line[:200]!r}")
            continue
        kind = obj.get("event") if isinstance(obj, dict) else None
        if kind not in validators:
            found.append(f"line {n}: unknown event {kind!r}: {line[:200]}")
            continue
        for err in validators[kind].iter_errors(obj):
            where = "/".join(map(str, err.absolute_path)) or "(the object)"
            found.append(f"line {n} ({kind}): {where}: {err.message}")
    return found


def check(args: Iterable[str], stdout: bytes | str, *, complete_only: bool = False) -> None:
    """Fail (AssertionError) when `args` asked for --json and a line of `stdout` is not valid."""
    if not wants_json(list(args)):
        return
    found = problems(stdout, complete_only=complete_only)
    assert not found, "gpuops --json printed lines that do not validate against `gpuops schema`:\n" + "\n".join(found[:20])
