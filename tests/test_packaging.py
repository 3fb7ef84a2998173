"""Release hygiene: what ``python -m build`` makes is what a user should get, and it works.

The sdist and the wheel are built once per session the way a release would build them (an
isolated build from the sdist), then checked: ``twine check``, the wheel's files (the package with
its ``py.typed`` and the license, nothing else), the sdist's (what the tests and the docs need,
nothing a run leaves behind), one version everywhere, the README as the package index shows it
(every link absolute, and pointing at a page or file that exists), and the README's examples and
``purgatory.asgi`` run against the wheel installed in a fresh virtualenv, outside the source
tree, so that nothing but the installed package can be imported.
"""

from __future__ import annotations

import email.message
import email.parser
import re
import shutil
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest
from helpers import run_process
from markdown_blocks import FENCE, ROOT, chains, run_chain

import purgatory


def run(*command: str | Path, cwd: Path = ROOT, timeout: float = 300) -> str:
    done = run_process(*command, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


#: What a run of the tools leaves in the tree, never part of a distribution.
LEFTOVER_DIRS = frozenset(
    {
        "__pycache__",
        ".ruff_cache",
        ".mypy_cache",
        ".pytest_cache",
        ".hypothesis",
        ".venv",
        "build",
        "dist",
        "site",
        "pipeline-out",
        "spark-warehouse",
        "metastore_db",
        "runs",  # benchmarks/runs: the results files of `python -m benchmarks`
    }
)


def left_behind(name: str) -> bool:
    """`name` (a relative path) is a cache, bytecode or a build output."""
    path = PurePosixPath(name)
    return bool(LEFTOVER_DIRS.intersection(path.parts[:-1])) or path.suffix in (".pyc", ".pyo")


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


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        info = f"asyncio_purgatory-{purgatory.__version__}.dist-info"
        return email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())


def sdist_names(sdist: Path) -> set[str]:
    """The sdist's file names, relative to its top directory (directories left out)."""
    top = f"asyncio_purgatory-{purgatory.__version__}/"
    with tarfile.open(sdist) as archive:
        return {m.name.removeprefix(top) for m in archive.getmembers() if not m.isdir()}


def test_names_carry_the_one_version(wheel: Path, sdist: Path) -> None:
    """The wheel is this interpreter's and platform's: it carries the compiled native core."""
    version = purgatory.__version__
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert re.fullmatch(
        rf"asyncio_purgatory-{re.escape(version)}-{tag}-{tag}-\w+\.whl", wheel.name
    ), wheel.name
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
    native = [name for name in names if re.fullmatch(r"purgatory/_native\.[\w.-]+\.so", name)]
    assert len(native) == 1, f"the compiled native core is not in the wheel: {names}"
    assert not [name for name in names if name.startswith("purgatory/_csrc/")]
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
    needed = {
        "pyproject.toml",
        "setup.py",
        "README.md",
        "CHANGELOG.md",
        "Makefile",
        "mkdocs.yml",
        "LICENSE",
    }
    for directory in ("purgatory", "tests", "examples", "benchmarks", "docs"):
        needed |= {
            path.relative_to(ROOT).as_posix()
            for path in (ROOT / directory).rglob("*")
            if path.is_file()
            and not left_behind(path.relative_to(ROOT).as_posix())
            and path.suffix != ".so"  # the compiled core of an editable install
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


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel alone in a fresh virtualenv: its python, and a directory outside the tree."""
    base = tmp_path_factory.mktemp("installed")
    venv = base / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps", wheel)
    where = base / "elsewhere"  # not the source tree: only the installed package imports
    where.mkdir()
    return python, where


#: The core's tests run against the installed wheel (its compiled core, not the checkout's).
WHEEL_SUITE = (
    "test_operation.py",
    "test_purgatory.py",
    "test_wheel.py",
    "test_thresholds.py",
    "test_watchers.py",
    "test_implementations.py",
)


def test_the_installed_wheel_passes_the_cores_tests(installed: tuple[Path, Path]) -> None:
    """The wheel alone runs the native core (it was compiled as the wheel was built) and passes
    the core's tests: the test tools come from this environment, after the wheel's own
    site-packages, so that ``purgatory`` is the wheel's."""
    python, where = installed
    site = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    tools = str(Path(pytest.__file__).parents[1])
    Path(site, "test-tools.pth").write_text(tools + "\n", encoding="utf-8")
    code = "import purgatory; print(purgatory.IMPLEMENTATION, purgatory.__file__)"
    implementation, file = run(python, "-c", code, cwd=where).split()
    assert implementation == "native"
    assert Path(file).is_relative_to(python.parent.parent), file
    tests = [str(ROOT / "tests" / name) for name in WHEEL_SUITE]
    output = run(
        python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, cwd=where, timeout=600
    )
    assert " passed" in output, output
    assert "failed" not in output, output


def test_readme_runs_against_the_installed_wheel(installed: tuple[Path, Path]) -> None:
    python, where = installed
    check = (
        "import importlib.metadata, purgatory; "
        "print(purgatory.__file__); print(importlib.metadata.version('asyncio-purgatory'))"
    )
    file, version = run(python, "-c", check, cwd=where).split()
    assert Path(file).is_relative_to(python.parent.parent), file
    assert version == purgatory.__version__
    readme = chains(ROOT / "README.md")
    assert readme
    for chain in readme:
        printed = run_chain(chain, python=str(python), cwd=where)
        for block, out in zip(chain, printed, strict=True):
            if block.output is not None:
                assert out == block.output, f"{block.where} printed something else"


# Run by the installed wheel's python, which has no framework: a client that goes away cancels
# the parked operation.
ASGI_CHECK = """
import asyncio, sys
import purgatory.asgi
from purgatory import DelayedOperation, DelayedOperationPurgatory

class Never(DelayedOperation[None]):
    def try_complete(self): return False
    def on_complete(self): return None
    def on_expiration(self): pass

async def main():
    gone = asyncio.Event()
    async def receive():
        await gone.wait()
        return {"type": "http.disconnect"}
    async with DelayedOperationPurgatory("p") as p:
        op = Never(60)
        watching = p.watch(op, ["k"])
        waiting = asyncio.create_task(purgatory.asgi.cancel_on_disconnect(receive, watching))
        while not p.num_delayed():
            await asyncio.sleep(0)
        gone.set()
        try:
            await waiting
        except purgatory.asgi.ClientDisconnected:
            print("disconnected", op.is_cancelled, p.num_delayed())

asyncio.run(main())
print(purgatory.asgi.__file__)
frameworks = {"starlette", "uvicorn", "httpx", "anyio"}
print(sorted(m for m in sys.modules if m.split(".")[0] in frameworks))
"""


def test_the_asgi_helper_works_from_the_installed_wheel(installed: tuple[Path, Path]) -> None:
    python, where = installed
    result, file, frameworks = run(python, "-c", ASGI_CHECK, cwd=where).splitlines()
    assert result == "disconnected True 0"
    assert Path(file).is_relative_to(python.parent.parent), file
    assert frameworks == "[]"


def test_sdist_holds_nothing_a_run_leaves_behind(sdist: Path) -> None:
    """No cache, bytecode or build output; in a git checkout, nothing git does not track.

    ``make test`` runs ruff, mypy, pytest and the docs build in the tree before this test builds
    the sdist, so their caches are there to be (wrongly) picked up.
    """
    names = sdist_names(sdist)
    assert not sorted(filter(left_behind, names)), "the sdist ships what a run left behind"
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return  # an unpacked sdist: the check above is all there is
    tracked = run("git", "ls-files", "--cached", "--others", "--exclude-standard").splitlines()
    made_by_setuptools = {"PKG-INFO", "setup.cfg"}
    extra = {
        name
        for name in names - set(tracked) - made_by_setuptools
        if not name.startswith("asyncio_purgatory.egg-info/")
    }
    assert not extra, f"the sdist ships files that are not the project's: {sorted(extra)}"


def test_the_license_is_in_both(wheel: Path, sdist: Path) -> None:
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    info = f"asyncio_purgatory-{purgatory.__version__}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(f"{info}/licenses/LICENSE").decode() == license_text
    assert "LICENSE" in sdist_names(sdist)
    metadata = wheel_metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]


def mkdocs_setting(key: str) -> str:
    """A top-level ``key: value`` of mkdocs.yml."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    match = re.search(rf"^{key}: (\S+)$", config, re.MULTILINE)
    assert match, f"mkdocs.yml has no {key}"
    return match[1]


def published_urls() -> tuple[str, str]:
    """The documentation site's and the repository's URLs, as mkdocs.yml gives them."""
    site, repo = mkdocs_setting("site_url"), mkdocs_setting("repo_url")
    assert site.startswith("https://"), site
    assert site.endswith("/"), site
    assert repo.startswith("https://"), repo
    assert not repo.endswith("/"), repo
    return site, repo


def test_the_metadata_links_the_docs_and_the_repository(wheel: Path) -> None:
    site, repo = published_urls()
    urls = dict(url.split(", ", 1) for url in wheel_metadata(wheel).get_all("Project-URL") or [])
    assert urls == {
        "Documentation": site,
        "Repository": repo,
        "Changelog": f"{site}changelog.html",
    }
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["urls"] == urls


# A Markdown link or image, an autolink, an HTML attribute, a link reference definition.
LINKS = (
    re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?[^)]*\)"),
    re.compile(r"<([a-z][a-z0-9+.-]*:[^>\s]+)>", re.IGNORECASE),
    re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE),
    re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE),
)


def link_targets(markdown: str) -> list[str]:
    """Every link and image target of `markdown`'s prose (code blocks and code spans left out)."""
    prose: list[str] = []
    fence: str | None = None
    for line in markdown.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match["fence"]
        elif fence is not None and line.strip().startswith(fence) and not line.strip(fence[0]):
            fence = None
        elif fence is None:
            prose.append(line)
    text = re.sub(r"(`+).+?\1", "", "\n".join(prose))
    return [target for pattern in LINKS for target in pattern.findall(text)]


def broken_links(markdown: str) -> list[str]:
    """The targets of `markdown` that would not work on the package index.

    A link must be absolute (the index has no page beside the README); one into the
    documentation site must name a page or file the site is built from, and one into the
    repository a file or directory that exists.
    """
    site, repo = published_urls()
    broken = []
    for target in link_targets(markdown):
        url = target.split("#", 1)[0]
        if not url.startswith("https://"):
            broken.append(f"{target} (not an absolute https URL)")
        elif url.startswith(site) and url != site:
            name = url.removeprefix(site)
            source = (
                ROOT / "docs" / (name[: -len(".html")] + ".md" if name.endswith(".html") else name)
            )
            if not source.is_file():
                broken.append(f"{target} (the site has no {name}: no docs/{source.name})")
        elif url.startswith(f"{repo}/"):
            match = re.fullmatch(r"/(?:blob|tree)/main/(.+)", url.removeprefix(repo))
            if not match or not (ROOT / match[1]).exists():
                broken.append(f"{target} (no such file in the repository)")
    return broken


def test_link_check_finds_what_breaks() -> None:
    """The checker itself: a relative link, an image, a missing page are all caught."""
    site, repo = published_urls()
    markdown = (
        "See [the docs](docs/index.md), ![chart](docs/pipeline-sweep.png),\n"
        f"[gone]({site}nowhere.html), [ok]({site}asgi.html#the-application), <{site}>,\n"
        f'[file]({repo}/blob/main/no/such.py), <img src="w2.png">, `[code](x.md)`\n\n'
        "```python\nprint('[not a link](y.md)')\n```\n\n[ref]: CHANGELOG.md\n"
    )
    assert [entry.split(" ")[0] for entry in broken_links(markdown)] == [
        "docs/index.md",
        "docs/pipeline-sweep.png",
        f"{site}nowhere.html",
        f"{repo}/blob/main/no/such.py",
        "w2.png",
        "CHANGELOG.md",
    ]


def test_readme_works_as_the_package_index_page(wheel: Path) -> None:
    """The README is the index page (the wheel's description): its links work there."""
    site, _ = published_urls()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert wheel_metadata(wheel).get_payload() == readme
    targets = link_targets(readme)
    assert len(targets) >= 10, targets  # the parser found them
    assert not broken_links(readme)
    assert site in readme  # where the documentation is, for a reader of the index page
    assert site in (purgatory.__doc__ or "")  # ... and for one who has only the wheel
