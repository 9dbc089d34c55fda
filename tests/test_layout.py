"""The package's layout, read from its imports (docs/architecture.md, "What each folder holds"): no two files
import each other, in a circle of any length, and no folder is more than six floors deep.

Every import statement counts, wherever it stands: at the top, inside a function (a lazy import), under
`if TYPE_CHECKING:`. A folder's floors are the longest chain of imports among what lies directly in it, a
subfolder counting as one; the repository's own picture is gpuops/'s with benchmarks/ and tools/ beside it.
"""

from __future__ import annotations

import ast
import subprocess
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPS = ("gpuops", "benchmarks", "tools")
MOST_FLOORS = 6


@lru_cache(maxsize=1)
def files() -> frozenset[Path]:
    """The project's own Python files: what git tracks (a venv `benchmarks/run.py --venv` made under benchmarks/out/
    is not the house), or, outside a checkout, every file but caches and virtual environments."""
    tracked = subprocess.run(["git", "ls-files", "-z", "--", *TOPS], cwd=ROOT, capture_output=True)
    if tracked.returncode == 0 and tracked.stdout:
        return frozenset(Path(p) for p in tracked.stdout.decode().split("\0") if p.endswith(".py"))
    return frozenset(p.relative_to(ROOT) for top in TOPS for p in (ROOT / top).rglob("*.py")
                     if "__pycache__" not in p.parts and "site-packages" not in p.parts)


def module_file(parts: list[str]) -> Path | None:
    """The file a dotted name means: a module, else a package's __init__.py."""
    if not parts:
        return None
    for candidate in (Path(*parts).with_suffix(".py"), Path(*parts, "__init__.py")):
        if candidate in files():
            return candidate
    return None


def imported(src: Path, node: ast.Import | ast.ImportFrom) -> list[Path]:
    """The files of this tree an import statement of `src` reads (a script's sibling by its bare name too)."""
    here = list(src.parent.parts)
    if isinstance(node, ast.Import):
        names = [a.name.split(".") for a in node.names]
        return [f for n in names if (f := module_file(n) or module_file(here + n))]
    base = here[: len(here) - node.level + 1] if node.level else []
    module = node.module.split(".") if node.module else []
    for where in ([base + module] if node.level else [module, here + module]):
        found = [module_file(where + [a.name]) or module_file(where) for a in node.names]
        if any(found):
            return [f for f in found if f]
    return []


@lru_cache(maxsize=1)
def arrows() -> dict[Path, frozenset[Path]]:
    out = {}
    for src in files():
        tree = ast.parse((ROOT / src).read_text(), str(src))
        found = {f for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for f in imported(src, n)}
        out[src] = frozenset(found - {src})
    return out


def circle_from(start: Path) -> list[Path] | None:
    """A chain of imports from `start` that comes back to it, if any."""
    path, seen = [start], set()

    def walk(node: Path) -> bool:
        for nxt in sorted(arrows().get(node, ())):
            if nxt == start:
                return True
            if nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                if walk(nxt):
                    return True
                path.pop()
        return False

    return path if walk(start) else None


def node(folder: Path, f: Path) -> str | None:
    """What `f` is in `folder`'s picture: a file directly in it, or the subfolder it lies in (gpuops/ is opened
    in the repository's picture)."""
    if folder != Path(".") and folder not in f.parents:
        return None
    rest = f.parts if folder == Path(".") else f.relative_to(folder).parts
    if folder == Path(".") and rest[0] == "gpuops":
        return node(Path("gpuops"), f)
    return str(folder / rest[0]) + ("/" if len(rest) > 1 else "")


def floors(folder: Path) -> list[str]:
    """The longest chain of imports among what lies directly in `folder`, a subfolder counting as one."""
    graph: dict[str, set[str]] = {}
    for src, dests in arrows().items():
        a = node(folder, src)
        if a is not None:
            graph.setdefault(a, set()).update(b for d in dests if (b := node(folder, d)) is not None and b != a)

    longest: dict[str, tuple[str, ...]] = {}

    def chain(n: str, below: tuple[str, ...] = ()) -> tuple[str, ...]:
        if n not in longest:  # a circle (the test above fails on it) is cut where it closes
            longest[n] = (n, *max((chain(m, (*below, n)) for m in graph.get(n, ()) if m not in below), key=len, default=()))
        return longest[n]

    return list(max((chain(n) for n in sorted(graph)), key=len, default=()))


def test_no_file_imports_itself_through_others() -> None:
    circles: dict[frozenset[Path], list[Path]] = {}
    for f in sorted(files()):
        circle = circle_from(f)
        if circle:
            circles.setdefault(frozenset(circle), circle)
    said = "; ".join(" -> ".join(map(str, [*c, c[0]])) for c in circles.values())
    assert not circles, f"import circles: {said}"


def test_no_folder_is_more_than_six_floors_deep() -> None:
    folders = sorted({p for f in files() for p in f.parents})
    deep = {f"{d}/": chain for d in folders if len(chain := floors(d)) > MOST_FLOORS}
    assert deep == {}, "\n".join(f"{d}: {len(c)} floors: {' -> '.join(c)}" for d, c in deep.items())


def test_no_module_name_is_on_both_sides() -> None:
    """What runs on the target (gpuops/agent/) and what runs here name their modules apart: a newcomer who opens
    `health.py` or `status.py` knows which side it is (STYLE.md: no module name on both sides)."""
    def names(paths: list[Path]) -> set[str]:
        return {p.stem for p in paths if not p.stem.startswith("__")}

    package = ROOT / "gpuops"
    agent = names([*(package / "agent").rglob("*.py"), *(package / "agent").rglob("*.sh")])
    client = names([p for p in [*package.rglob("*.py"), *package.rglob("*.sh")] if (package / "agent") not in p.parents])
    assert agent & client == set()
