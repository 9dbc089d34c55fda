"""The docs document every key (CONTRACT: "The README documents every key"; the key reference lives in
docs/inventory.md and docs/playbook.md, linked from the README): each key the loaders accept has a row
in its page's key tables, and no row names a key they would refuse. And every relative link in the
README and docs/ resolves, to a file and, where it names one, a heading there.

The key lists are the loaders' own (what `gpuops validate` accepts), so a key added to a loader
without a docs row, or a row left behind by a removed key, fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuops.agent.wire.detector_list import DETECTORS
from gpuops.config import inventory, metrics_keys, notify_keys, playbook, watch
from gpuops.config import restart_keys as restart
from gpuops.config import torchrun_keys as torchrun

ROOT = Path(__file__).resolve().parent.parent
INVENTORY_PAGE = ROOT / "docs" / "inventory.md"
PLAYBOOK_PAGE = ROOT / "docs" / "playbook.md"
INVENTORY_SECTIONS = ("hosts", "targets")
PLAYBOOK_SECTIONS = ("preflight", "warmup", "launch", "abort", "watch", "restart")


def table_keys(page: Path, sections: tuple[str, ...], top: tuple[str, ...] = ()) -> dict[str, str]:
    """Each key named in the first cell of a table row of `page` (`a`, `b` rows name several) -> the row."""
    keys: dict[str, str] = {}
    for row in re.findall(r"^\| (`[^|]*`(?:, `[^|]*`)*) \|.*$", page.read_text(), re.M):
        for key in re.findall(r"`([^`]+)`", row):
            keys[key] = row
    return {k: v for k, v in keys.items() if k.split(".")[0] in sections or k in top}


def inventory_keys() -> list[str]:
    return [f"hosts.<name>.{k}" for k in inventory.HOST_KEYS] + [f"targets.<name>.{k}" for k in inventory.TARGET_KEYS]


def playbook_keys() -> list[str]:
    keys = [k for k in playbook.PLAYBOOK_KEYS if k not in PLAYBOOK_SECTIONS or k == "restart"]
    for section, names in (("preflight", playbook.PREFLIGHT_KEYS), ("warmup", playbook.WARMUP_KEYS),
                           ("launch", playbook.LAUNCH_KEYS), ("launch.torchrun", torchrun.TORCHRUN_KEYS),
                           ("abort", playbook.ABORT_KEYS), ("watch", watch.WATCH_KEYS), ("restart", restart.RESTART_KEYS),
                           ("watch.metrics", metrics_keys.METRICS_KEYS),
                           *((f"watch.{d.key}", tuple(k.name for k in d.keys)) for d in DETECTORS)):
        keys += [f"{section}.{k}" for k in names]
    return keys


def playbook_rows() -> dict[str, str]:
    return table_keys(PLAYBOOK_PAGE, PLAYBOOK_SECTIONS, playbook.PLAYBOOK_KEYS)


def test_every_inventory_key_the_loader_accepts_has_a_row_and_every_row_is_a_key() -> None:
    documented, accepted = table_keys(INVENTORY_PAGE, INVENTORY_SECTIONS), inventory_keys()
    assert [k for k in accepted if k not in documented] == []
    assert sorted(k for k in documented if k not in accepted) == []


def test_every_playbook_key_the_loader_accepts_has_a_row_and_every_row_is_a_key() -> None:
    documented, accepted = playbook_rows(), playbook_keys()
    assert [k for k in accepted if k not in documented] == []
    assert sorted(k for k in documented if k not in accepted) == []


def test_the_keys_inside_a_value_are_named_in_their_row() -> None:
    """watch.rules items, watch.stall_auto and env values are mappings documented in their parent's row."""
    rows = playbook_rows()
    for parent, names in (("watch.rules", watch.RULE_KEYS), ("watch.stall_auto", watch.STALL_AUTO_KEYS),
                          ("env", playbook.ENV_VALUE_KEYS), ("notify", notify_keys.CHANNEL_KEYS + notify_keys.WEBHOOK_KEYS)):
        line = next(line for line in PLAYBOOK_PAGE.read_text().splitlines() if line.startswith(f"| `{parent}` |"))
        assert parent in rows
        assert [n for n in names if not re.search(rf"\b{n}\b", line)] == [], parent


def test_the_readme_links_the_key_pages() -> None:
    """A user finds the key reference from the README."""
    readme = (ROOT / "README.md").read_text()
    assert "(docs/inventory.md)" in readme and "(docs/playbook.md)" in readme


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of every heading of `page` (outside code blocks)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists() or (anchor and anchor not in anchors(target)):
            broken.append(link)
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """No reference page a user cannot reach from the README."""
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{p.name}" not in readme] == []
