"""The README documents every key (CONTRACT: "The README documents every key"): each key the loaders
accept has a row in the README's key tables, and no row names a key they would refuse.

The key lists are the loaders' own (what `gpuops validate` accepts), so a key added to a loader
without a README row, or a row left behind by a removed key, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuops.config import inventory, playbook, watch

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
SECTIONS = ("hosts", "targets", "preflight", "warmup", "launch", "abort", "watch")


def table_keys() -> dict[str, str]:
    """Each key named in the first cell of a README table row (`a`, `b` rows name several) -> the row."""
    keys: dict[str, str] = {}
    for row in re.findall(r"^\| (`[^|]*`(?:, `[^|]*`)*) \|.*$", README, re.M):
        for key in re.findall(r"`([^`]+)`", row):
            keys[key] = row
    return {k: v for k, v in keys.items() if k.split(".")[0] in SECTIONS or k in playbook.PLAYBOOK_KEYS}


def accepted_keys() -> list[str]:
    keys = [f"hosts.<name>.{k}" for k in inventory.HOST_KEYS] + [f"targets.<name>.{k}" for k in inventory.TARGET_KEYS]
    keys += [k for k in playbook.PLAYBOOK_KEYS if k not in SECTIONS]
    for section, names in (("preflight", playbook.PREFLIGHT_KEYS), ("warmup", playbook.WARMUP_KEYS),
                           ("launch", playbook.LAUNCH_KEYS), ("abort", playbook.ABORT_KEYS), ("watch", watch.WATCH_KEYS),
                           ("watch.throughput", watch.THROUGHPUT_KEYS), ("watch.gpu_memory", watch.GPU_MEMORY_KEYS),
                           ("watch.compile_after_warmup", watch.COMPILE_KEYS)):
        keys += [f"{section}.{k}" for k in names]
    return keys


def test_every_key_the_loaders_accept_has_a_readme_row_and_every_row_is_a_key() -> None:
    documented, accepted = table_keys(), accepted_keys()
    assert [k for k in accepted if k not in documented] == []
    assert sorted(k for k in documented if k not in accepted) == []


def test_the_keys_inside_a_value_are_named_in_their_row() -> None:
    """watch.rules items, watch.stall_auto and env values are mappings documented in their parent's row."""
    rows = table_keys()
    for parent, names in (("watch.rules", watch.RULE_KEYS), ("watch.stall_auto", watch.STALL_AUTO_KEYS),
                          ("env", playbook.ENV_VALUE_KEYS)):
        line = next(line for line in README.splitlines() if line.startswith(f"| `{parent}` |"))
        assert parent in rows
        assert [n for n in names if not re.search(rf"\b{n}\b", line)] == [], parent
