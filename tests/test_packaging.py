"""Release hygiene: what ``python -m build`` makes is what a user should get, and it works.

The sdist and the wheel are built once per session the way a release would build them (an
isolated build from the sdist), then checked: ``twine check``, the wheel's files (the package with
its ``py.typed``, nothing else), one version everywhere, and the README's examples run against
the wheel installed in a fresh virtualenv, outside the source tree, so that nothing but the
installed package can be imported.
"""

from __future__ import annotations

import email.parser
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from markdown_blocks import ROOT, chains, run_chain

import purgatory


def run(*command: str | Path, cwd: Path = ROOT, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An sdist, and a wheel built from it (``python -m build``'s default)."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, ROOT)
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("*.whl")
    return found


@pytest.fixture(scope="module")
def sdist(dist: Path) -> Path:
    (found,) = dist.glob("*.tar.gz")
    return found


def test_names_carry_the_one_version(wheel: Path, sdist: Path) -> None:
    version = purgatory.__version__
    assert wheel.name == f"asyncio_purgatory-{version}-py3-none-any.whl"
    assert sdist.name == f"asyncio_purgatory-{version}.tar.gz"


def test_twine_check(dist: Path) -> None:
    output = run(sys.executable, "-m", "twine", "check", "--strict", *sorted(dist.iterdir()))
    assert output.count("PASSED") == 2, output


def test_wheel_holds_the_package_and_nothing_else(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = f"asyncio_purgatory-{purgatory.__version__}.dist-info"
        metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    assert "purgatory/py.typed" in names
    assert "purgatory/__init__.py" in names
    assert "purgatory/testing/__init__.py" in names
    strays = [name for name in names if not name.startswith(("purgatory/", f"{info}/"))]
    assert not strays, f"the wheel ships more than the package: {strays}"
    source = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "purgatory").rglob("*")
        if path.suffix in (".py", ".typed")
    }
    assert source <= set(names), f"missing from the wheel: {source - set(names)}"
    assert metadata["Name"] == "asyncio-purgatory"
    assert metadata["Version"] == purgatory.__version__
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_sdist_holds_what_the_tests_and_docs_need(sdist: Path) -> None:
    """The wheel was built from the sdist, so the sdist builds; it must also test and document.

    Every top-level directory of Python code (a new one too) and every file the docs build and
    the tests read must be in it (MANIFEST.in), so that ``make test`` runs from the sdist alone.
    """
    top = f"asyncio_purgatory-{purgatory.__version__}"
    with tarfile.open(sdist) as archive:
        names = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    needed = {"pyproject.toml", "README.md", "CHANGELOG.md", "Makefile", "mkdocs.yml"}
    for directory in ("purgatory", "tests", "examples", "benchmarks", "docs"):
        needed |= {
            path.relative_to(ROOT).as_posix()
            for path in (ROOT / directory).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
        }
    code_dirs = {
        directory.name
        for directory in ROOT.iterdir()
        if directory.is_dir()
        and not directory.name.startswith((".", "build", "dist"))
        and not directory.name.endswith(".egg-info")
        and any(directory.rglob("*.py"))
    }
    assert code_dirs <= {name.split("/")[0] for name in names}, code_dirs
    assert needed <= names, f"missing from the sdist: {sorted(needed - names)}"
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


def test_readme_runs_against_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", wheel)
    where = tmp_path / "elsewhere"  # not the source tree: only the installed package imports
    where.mkdir()
    check = (
        "import importlib.metadata, purgatory; "
        "print(purgatory.__file__); print(importlib.metadata.version('asyncio-purgatory'))"
    )
    file, version = run(python, "-c", check, cwd=where).split()
    assert Path(file).is_relative_to(venv), file
    assert version == purgatory.__version__
    readme = chains(ROOT / "README.md")
    assert readme
    for chain in readme:
        printed = run_chain(chain, python=str(python), cwd=where)
        for block, out in zip(chain, printed, strict=True):
            if block.output is not None:
                assert out == block.output, f"{block.where} printed something else"
