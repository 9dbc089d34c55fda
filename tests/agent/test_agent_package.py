"""gpuops/agent is what runs on the target: standard library only, shipped as files, Python >= 3.8.

Proved two ways: every import in the folder is a relative one or a standard-library module, and a
copy of the folder, renamed as it is on a target (gpuops_agent), imports and matches a real log on
the oldest Python we support there, started without site-packages (-S), so nothing else could help.
"""

from __future__ import annotations

import ast
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "gpuops" / "agent"
OLDEST = (3, 8)  # Ubuntu 20.04; Debian 11 ships 3.9


def _modules() -> list[Path]:
    return sorted(p for p in TARGET.rglob("*.py") if "__pycache__" not in p.parts)


def _absolute_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


#: The interpreter's own SHA-256 (profile.py, hashlib's OpenSSL left unloaded) is a private standard
#: module of another name on either side of Python 3.12; the one not of this interpreter is not in its list.
OTHER_PYTHONS = {"_sha256", "_sha2"}


def test_the_target_folder_imports_only_the_standard_library_and_itself() -> None:
    stdlib = set(sys.stdlib_module_names) | OTHER_PYTHONS
    outside = {str(p.relative_to(REPO)): sorted(_absolute_imports(p) - stdlib - {"__future__"}) for p in _modules()}
    assert {k: v for k, v in outside.items() if v} == {}


def oldest_python() -> str | None:
    """A Python 3.8 interpreter that runs: one of pyenv's, or python3.8 on PATH (a pyenv shim may not run)."""
    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8.*/bin/python3.8")))
    candidates += [p for p in (shutil.which("python3.8"),) if p]
    for candidate in candidates:
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 8)":
            return candidate
    return None


def shipped_copy(tmp: Path) -> Path:
    """The folder as a target has it: ~/.gpuops/lib/<hash>/gpuops_agent."""
    dest = tmp / "gpuops_agent"
    shutil.copytree(TARGET, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp


def test_every_module_imports_and_matches_a_real_log_on_python_3_8(tmp_path: Path) -> None:
    python = oldest_python()
    if python is None:
        pytest.skip("no Python 3.8 here (pyenv or python3.8 on PATH) to prove the oldest supported target")
    lib = shipped_copy(tmp_path)
    modules = [".".join(("gpuops_agent", *p.relative_to(TARGET).with_suffix("").parts)).removesuffix(".__init__")
               for p in _modules()]
    log = REPO / "tests" / "data" / "real_h200" / "fx-race.log"
    program = (
        f"import sys; sys.path.insert(0, {str(lib)!r}); import importlib\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "from gpuops_agent.wire.signatures import Matcher, builtin_rules\n"
        "m = Matcher(builtin_rules())\n"
        f"hits = m.feed(open({str(log)!r}, 'rb').read()) + m.finish()\n"
        "print(sys.version_info[:2], sorted({h.rule for h in hits}))\n"
    )
    result = subprocess.run([python, "-E", "-s", "-S", "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(3, 8) ['fx-tracing-race']"


SH = TARGET / "sh"


def test_the_shell_tools_are_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed here (.ci/run installs it)")
    scripts = sorted(str(p) for p in SH.glob("*.sh"))
    assert len(scripts) >= 5
    result = subprocess.run([shellcheck, "-x", "-P", str(SH), *scripts], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_marker_the_tools_print_is_one_the_protocol_knows() -> None:
    """A marker is spelled in protocol.py and printed by a tool: one home for the wire protocol."""
    import re

    from gpuops.agent.wire import marks

    printed: set[str] = set()
    for path in sorted((REPO / "gpuops").rglob("*")):
        if path.suffix in (".sh", ".py") and "__pycache__" not in path.parts and path.name != "protocol.py":
            printed.update(re.findall(r"@@gpuops ([a-z_-]+)", path.read_text()))
            for key in re.findall(r"""\bmark\(\s*["']([a-z_-]+)["']""", path.read_text()):
                printed.add(key)
    assert printed, "no marker found: the pattern is wrong"
    assert printed - marks.MARKS == set()
    assert "need-lib" in printed and "locked-ok" in printed and "survivors" in printed


# A program inside a string: shell control flow, an exit status read back, a heredoc, a `python -c`.
SHELL_PROGRAM = re.compile(
    r"(?:^|[;&|{(]\s*|\n\s*)(?:if|while|until|for)\s.*?(?:;|\n)\s*(?:then|do)\b"  # if ...; then / for ...; do
    r"|(?:^|[;&|]\s*|\n\s*)case\s.*?\sin\b"
    r"|\$\?"  # an exit status read back: a second statement that depends on the first
    r"|\|\|\s*exit\b"  # cmd || exit N: error handling of a script
    r"|<<-?\s*['\"]?[A-Za-z_]+"  # a heredoc
    r"|\bpython[0-9.]*\s+(?:-[A-Za-z]+\s+)*-[A-Za-z]*c\b",  # python3 -c '...'
    re.S,
)
PYTHON_C_ARGV = re.compile(r"""(?:python3?['"]?|sys\.executable),\s*['"]-[A-Za-z]*c['"]""")
# The one program that cannot be a shipped file: the installer that puts the shipped files there.
ALLOWED = {("gpuops/client/door/bundle.py", "install_command")}


def inline_programs(path: Path, root: Path = REPO) -> list[str]:
    """`function: text` for each string literal of `path` that holds a program (f-strings read with {} holes)."""
    rel = str(path.relative_to(root))
    found = [f"{rel}: argv runs python -c" for _ in PYTHON_C_ARGV.finditer(path.read_text())]
    tree = ast.parse(path.read_text(), rel)
    docstrings = {id(d.body[0].value) for d in ast.walk(tree)
                  if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module))
                  and d.body and isinstance(d.body[0], ast.Expr)}
    owner: dict[int, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                owner.setdefault(id(node), fn.name)  # the outermost function wins: walk goes outside in
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        else:
            continue
        where = owner.get(id(node), "<module>")
        if SHELL_PROGRAM.search(text) and (rel, where) not in ALLOWED:
            found.append(f"{rel}:{node.lineno} {where}: {text[:80]!r}")
    return found


def test_no_program_is_written_inside_a_string() -> None:
    """What runs on the target is a file (gpuops/agent: sh/*.sh, the Python modules): no module of gpuops holds
    a `python3 -c` program, a heredoc, or a shell program with control flow or `$?` in a string; the bootstrap
    that finds the shipped files is two plain statements, and only the installer that ships them is inline."""
    found = [hit for path in sorted((REPO / "gpuops").rglob("*.py")) for hit in inline_programs(path)]
    assert found == []


@pytest.mark.parametrize("expr", [
    "'if [ $rc -ne 0 ]; then echo x; fi'", "'rc=$?'", "\"python3 -c 'print(1)'\"", "\"python3 -E -s -c 'x'\"",
    "'cat <<EOF\\nx\\nEOF'", "'for f in *; do rm $f; done'", "'while true; do :; done'", "'case $x in a) ;; esac'",
    "f'if [ -d {d} ]; then exit 0; fi'", "'mkdir -p x || exit 70'", "['python3', '-c', 'import os']", "(sys.executable, '-c', 'x')",
])
def test_the_inline_program_check_sees_each_kind(tmp_path: Path, expr: str) -> None:
    """The check above is only as good as its pattern: each kind of program, written in a client module, is
    found; the same module returning a plain command is not."""
    module = tmp_path / "gpuops" / "client" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text(f"def f():\n    return {expr}\n")
    assert inline_programs(module, tmp_path) != []
    module.write_text("def f():\n    return ['bash', '-c', 'exec tmux has-session -t \"$1\"', 'gpuops', 's']\n")
    assert inline_programs(module, tmp_path) == []


def _strings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each string literal of a module, f-strings with their literal parts joined."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


#: The wire's own modules: the only ones that may read marker lines (hostwire.py: the host's kernel-log tools').
_WIRE = {"protocol.py", "marks.py", "frames.py", "hostwire.py"}


def test_markers_are_parsed_only_by_the_protocol() -> None:
    """Each tool's reply has one parser beside its markers: no other module splits marker lines or
    spells the marker prefix by hand (printing one goes through marks.mark)."""
    found = []
    for path in sorted((REPO / "gpuops").rglob("*.py")):
        if path.name in _WIRE and path.parent.name == "wire":
            continue
        for line, text in _strings(path):
            if "@@gpuops" in text:
                found.append(f"{path.relative_to(REPO)}:{line}: spells the marker prefix")
        code = path.read_text()
        for pattern in (r"\bmarks\(", r"(?<![A-Z_])MARK\b", r"\bFrameReader\b.*\bsplit\("):
            for m in re.finditer(pattern, code):
                found.append(f"{path.relative_to(REPO)}:{code[:m.start()].count(chr(10)) + 1}: {m.group(0)}")
    assert found == []


def test_the_follower_builds_every_frame_through_the_protocol() -> None:
    """No frame written by hand (b"E ...", b"T %d"): the builders in protocol are the one spelling."""
    code = (TARGET / "watch" / "follow.py").read_text()
    assert not re.search(r"""self\.w\(\s*b["']""", code)
    assert "end_frame(" in code and "truncated_frame(" in code and "rotated_frame(" in code


@pytest.mark.parametrize("name", ["d\n", "a b\n\n", "-x", "~x", " lead", "tab\t"])
def test_run_sh_enters_a_workdir_named_exactly_as_written(tmp_path: Path, name: str) -> None:
    """A name ending in newlines is its own directory: $( ) would strip them and cd elsewhere (found by hypothesis)."""
    home, run = tmp_path / "home", tmp_path / "run"
    (home / name).mkdir(parents=True)
    (home / name.rstrip("\n")).mkdir(exist_ok=True)  # the wrong directory, there to be entered by mistake
    run.mkdir()
    (run / "workdir").write_bytes(name.encode())
    script = f'. {TARGET / "sh" / "common.sh"}; D="$1"; enter_workdir || exit 9; pwd; printf x'
    done = subprocess.run(["bash", "-c", script, "bash", str(run)], env={"HOME": str(home), "PATH": os.environ["PATH"]},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout[:-len("\nx")] == str(home / name)
