"""The documentation cannot rot: its code runs, its site builds strictly, its reference is whole.

Every Python block of the README and of ``docs/`` runs in a fresh interpreter (see
`markdown_blocks` for the markers), the site builds with MkDocs in strict mode (any warning
fails), and the built pages are checked for what a reader needs: every public name in the API
reference, with Kafka's name beside it, and no reference to files outside the repository.
"""

from __future__ import annotations

import ast
import asyncio
import doctest
import importlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import run_process
from http_support import exits_cleanly, uvicorn_url
from markdown_blocks import ROOT, Block, chains, doc_files, examples, parse, run_chain

import purgatory
import purgatory.asgi
import purgatory.otel
import purgatory.pipeline
import purgatory.prometheus
import purgatory.testing

CHAINS = [chain for path in doc_files() for chain in chains(path)]
BLOCKS = [block for path in doc_files() for block in parse(path)]
NOT_RUN = [block for block in BLOCKS if block.not_run is not None]
EXAMPLES = [(path, example) for path in doc_files() for example in examples(path)]
# What users never see: the project's internal notes live outside the repository.
OUTSIDE = re.compile(r"shared/|\bAPI\.md|\bSTYLE\.md|\bWORKLOAD\.md")
# ... and its issue tracker is not theirs: "as issue 7 reported" means nothing to a reader.
INTERNAL = re.compile(r"\bissues? \d+|\bissue-\d+|\bissues \d+ and \d+", re.IGNORECASE)


def test_every_page_has_runnable_code_and_few_exceptions() -> None:
    """Guards the extraction itself: a parser that finds nothing would pass every test below."""
    assert len(CHAINS) >= 8
    assert any(chain[0].path.name == "README.md" for chain in CHAINS)
    assert len(NOT_RUN) <= 3, [block.where for block in NOT_RUN]


@pytest.mark.parametrize("chain", CHAINS, ids=[chain[0].where for chain in CHAINS])
def test_code_block_runs(chain: list[Block], tmp_path: Path) -> None:
    printed = run_chain(chain, cwd=tmp_path)
    for block, out in zip(chain, printed, strict=True):
        if block.output is not None:
            assert out == block.output, f"{block.where} printed something else"


def test_code_blocks_type_check(tmp_path: Path) -> None:
    """The docs' code is typed as the project's own: mypy --strict, each chain as one module.

    The configuration is the strict flags plus the project's one allowance: pyarrow, which the
    optional event-log and pipeline modules import, ships no type information.
    """
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    for index, chain in enumerate(CHAINS):
        module = blocks / f"block_{index:02d}.py"
        module.write_text(
            f"# {chain[0].where}\n" + "".join(block.code for block in chain), encoding="utf-8"
        )
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n\n[mypy-pyarrow,pyarrow.*]\nignore_missing_imports = True\n")
    done = subprocess.run(
        [
            *(sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11"),
            *("--cache-dir", os.devnull, "--config-file", str(config), str(blocks)),
        ],
        cwd=ROOT,  # where `purgatory` is found as source, whatever the install mode
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_partial_blocks_compile() -> None:
    """Blocks marked not-run are still valid Python."""
    for block in NOT_RUN:
        compile(block.code, block.where, "exec")


def test_shown_examples_exist_and_are_tested() -> None:
    tested = (ROOT / "tests" / "test_examples.py").read_text(encoding="utf-8")
    assert EXAMPLES
    for page, example in EXAMPLES:
        assert (ROOT / example).is_file(), f"{page.name} shows {example}, which does not exist"
        assert Path(example).stem in tested, f"{example} has no test in tests/test_examples.py"


def test_readme_blocks_stand_alone() -> None:
    """Each README block works when copied on its own."""
    readme = [block for block in BLOCKS if block.path.name == "README.md"]
    assert readme
    assert not [block.where for block in readme if block.continues or block.not_run]


def test_docstring_examples() -> None:
    """Any ``>>>`` example in the package's docstrings runs (doctest).

    ``purgatory.pipeline`` (the Spark extra) is left to its own tests: importing it needs pyspark.
    """
    package = Path(purgatory.__file__).parent
    failed = 0
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if "pipeline" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        failed += doctest.testmod(importlib.import_module(name), raise_on_error=False).failed
    assert failed == 0


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built the way ``make docs`` builds it: strict, warnings are errors."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    return out


def test_api_reference_documents_every_public_name(site: Path) -> None:
    api_source = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    api_html = (site / "api.html").read_text(encoding="utf-8")
    modules = (purgatory, purgatory.testing, purgatory.asgi, purgatory.pipeline)
    for module in (*modules, purgatory.prometheus, purgatory.otel):
        for name in module.__all__:
            qualified = f"{module.__name__}.{name}"
            assert f"::: {qualified}\n" in api_source, f"{qualified} missing from docs/api.md"
            assert f'id="{qualified}"' in api_html, f"{qualified} not rendered"


def public_members(cls: type) -> list[str]:
    return [name for name in vars(cls) if not name.startswith("_")]


@pytest.mark.parametrize(
    "cls", [purgatory.DelayedOperation, purgatory.DelayedOperationPurgatory], ids=str
)
def test_kafka_table_covers_every_public_member(cls: type) -> None:
    """Each public method and property has a row in the table of Kafka's names."""
    table = (ROOT / "docs" / "api.md").read_text(encoding="utf-8").split("## Operations")[0]
    missing = [name for name in public_members(cls) if f"{cls.__qualname__}.{name}]" not in table]
    assert not missing, f"no row in the Kafka table of docs/api.md for {missing}"


def test_site_has_every_page(site: Path) -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert (site / page.with_suffix(".html").name).is_file(), page.name
    assert (site / "assets" / "benchmarks" / "w2.png").is_file()
    benchmarks = (site / "benchmarks.html").read_text(encoding="utf-8")
    assert "Targets" in benchmarks
    assert "<!-- benchmark-results -->" not in benchmarks
    for page, example in EXAMPLES:
        html = (site / page.with_suffix(".html").name).read_text(encoding="utf-8")
        assert f"<!-- example: {example} -->" not in html
        source = (ROOT / example).read_text(encoding="utf-8")
        classes = re.findall(r"^class (\w+)", source, re.MULTILINE)
        assert classes, example
        assert all(name in html for name in classes), f"{example} not shown in {page.name}"


def test_the_site_shows_the_pictures_the_code_draws(site: Path) -> None:
    """The life-cycle picture the site publishes is the one ``docs/draw.py`` draws from the
    code now (the build's hook draws it: tests/test_pictures.py keeps the committed copy the
    same), and the pictures the pages show are in the site."""
    sys.path.insert(0, str(ROOT / "docs"))  # the drawing script is a script, not a package
    import draw

    drawn = draw.lifecycle_svg()
    assert (site / "assets" / "lifecycle.svg").read_text(encoding="utf-8") == drawn
    for picture in ("metrics-demo.png", "pipeline-sweep.png", "pipeline-load.png"):
        assert (site / picture).read_bytes()[:4] == b"\x89PNG", picture


# Files that still name a file outside the repository, to be reworded by their owner; each
# must still do so (delete its entry once it no longer does).
STILL_REFERS_OUTSIDE: set[str] = set()


def test_nothing_outside_the_repository_is_referenced(site: Path) -> None:
    """What users read (README, docs, changelog, the package, the examples) is self-contained."""
    sources = [*doc_files(), ROOT / "CHANGELOG.md"]
    for directory in ("purgatory", "examples"):
        sources += sorted((ROOT / directory).rglob("*.py"))
    for path in sources:
        found = OUTSIDE.findall(path.read_text(encoding="utf-8"))
        name = path.relative_to(ROOT).as_posix()
        if name in STILL_REFERS_OUTSIDE:
            assert found, f"{name} is clean now: remove it from STILL_REFERS_OUTSIDE"
            continue
        assert not found, f"{name} refers to {found}"
    for page in site.rglob("*.html"):
        found = OUTSIDE.findall(page.read_text(encoding="utf-8"))
        assert not found, f"built {page.relative_to(site)} refers to {found}"


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_code_lines_fit_the_page(block: Block) -> None:
    """Code on a page fits its column without scrolling: 80 columns (``docs/ruff.toml``).

    ``ruff format`` wraps the code; this catches what it leaves long (comments, docstrings). The
    README, read on a wider page, keeps the project's 100.
    """
    limit = 100 if block.path.name == "README.md" else 80
    long = [line for line in block.code.splitlines() if len(line) > limit]
    assert not long, f"{block.where}: {long}"


def is_command_line_tool(path: Path) -> bool:
    """Whether a module of the package (`path` relative to it) is a command-line tool's:
    ``python -m purgatory`` (its ``__main__``) or the Spark pipeline."""
    return path.parts[0] == "pipeline" or path.name == "__main__.py"


def test_the_package_reports_only_as_the_errors_page_says() -> None:
    """docs/errors.md: the core never prints nor warns, and logs only on the ``purgatory`` logger.

    (The command-line tools, ``python -m purgatory`` and the Spark pipeline, print what they
    are asked for and are not checked here.)
    """
    package = Path(purgatory.__file__).parent
    for path in sorted(package.rglob("*.py")):
        if is_command_line_tool(path.relative_to(package)):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{where} prints"
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = [alias.name for alias in node.names]
                if isinstance(node, ast.ImportFrom):
                    modules.append(node.module or "")
                assert "warnings" not in modules, f"{where} imports warnings"
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("getLogger"):
                names = [ast.literal_eval(arg) for arg in node.args]
                assert names == ["purgatory"], f"{where} logs on {names}"


def test_what_users_read_names_no_internal_issue() -> None:
    """No issue number where a user reads: the docs, the changelog, the package, the examples,
    the benchmark reports the docs point to, and ``python -m benchmarks --help``."""
    sources = [*doc_files(), ROOT / "CHANGELOG.md", *sorted((ROOT / "benchmarks").glob("*.md"))]
    for directory in ("purgatory", "examples"):
        sources += sorted((ROOT / directory).rglob("*.py"))
    found = {
        path.relative_to(ROOT).as_posix(): INTERNAL.findall(path.read_text(encoding="utf-8"))
        for path in sources
    }
    assert not {name: hits for name, hits in found.items() if hits}
    helped = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "W1" in helped
    assert not INTERNAL.findall(helped)
    assert not OUTSIDE.findall(helped)


def test_internal_reference_pattern() -> None:
    """The pattern above catches the phrasings that were found, and not ordinary prose."""
    for text in ("as issue 7 reported", "(issue 8)", "the issue-8 targets", "Issues 7 and 8"):
        assert INTERNAL.search(text), text
    for text in ("an issue with 3 keys", "issues and pull requests", "tissue 4"):
        assert not INTERNAL.search(text), text


def test_the_built_site_names_no_internal_issue(site: Path) -> None:
    for page in site.rglob("*.html"):
        found = INTERNAL.findall(page.read_text(encoding="utf-8"))
        assert not found, f"built {page.relative_to(site)} refers to {found}"


def test_the_site_ships_no_build_leftovers(site: Path) -> None:
    """Only what a reader's browser needs: no tool settings, caches, build hooks or sources."""
    files = [path.relative_to(site) for path in site.rglob("*") if path.is_file()]
    assert len(files) > 20, files
    leftovers = [
        path.as_posix()
        for path in files
        if path.suffix in {".py", ".pyc", ".toml", ".cfg", ".ini", ".md"}
        or any(part.startswith(".") or part == "__pycache__" for part in path.parts)
    ]
    assert not leftovers


def test_the_site_searches_from_the_disk(site: Path) -> None:
    """``make docs`` says to open build/site/index.html: search must work from file:// too.

    From file:// a page can load scripts but not fetch JSON, nor start a Web Worker. The offline
    plugin writes the search index as a script as well, the theme loads that script when the
    page is a file, and the Worker shim (served from the site itself, not from a CDN) starts the
    search worker there. Nothing a page loads comes from the network.
    """
    index = (site / "search" / "search_index.js").read_text(encoding="utf-8")
    assert index.startswith("var __index = {")
    (bundle,) = (site / "assets" / "javascripts").glob("bundle.*.min.js")
    assert "search/search_index.js" in bundle.read_text(encoding="utf-8")
    shim = "assets/javascripts/iframe-worker-shim.js"
    assert "window.Worker" in (site / shim).read_text(encoding="utf-8")
    # 404.html is for a web server (its links are absolute paths); the disk never shows it.
    pages = sorted(page for page in site.glob("*.html") if page.name != "404.html")
    assert len(pages) > 10
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert f'<script src="{shim}">' in html, page.name
        assert 'class="md-search"' in html, page.name
        fetched = re.findall(
            r"<script[^>]* src=\"(https?:[^\"]+)|<link[^>]* href=\"(https?:[^\"]+)", html
        )
        remote = [url for script, link in fetched for url in (script, link) if url]
        canonical = [url for url in remote if f'rel="canonical" href="{url}"' in html]
        assert remote == canonical, f"{page.name} loads {remote} from the network"


# -- the docstrings' examples -----------------------------------------------------------------


def literal_blocks(docstring: str) -> list[str]:
    """The reST literal blocks of `docstring` (a paragraph ending in ``::``, then the indented
    lines after it), dedented: its examples."""
    lines = textwrap.dedent(docstring).splitlines()
    blocks: list[str] = []
    for i, line in enumerate(lines):
        if not line.rstrip().endswith("::") or i + 1 >= len(lines) or lines[i + 1].strip():
            continue
        indent = len(line) - len(line.lstrip())
        body: list[str] = []
        for after in lines[i + 2 :]:
            if after.strip() and len(after) - len(after.lstrip()) <= indent:
                break
            body.append(after)
        blocks.append(textwrap.dedent("\n".join(body)).strip("\n") + "\n")
    return blocks


def docstring_examples() -> dict[tuple[str, str, int], str]:
    """Every example of the package's docstrings (the command-line tools' aside: their own tests
    run them): (module, qualified name or "", index) -> code."""
    found: dict[tuple[str, str, int], str] = {}
    package = Path(purgatory.__file__).parent
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if is_command_line_tool(path.relative_to(package)):
            continue
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes: list[tuple[str, ast.AST]] = [("", tree)]
        while scopes:
            name, node = scopes.pop()
            docstring = ast.get_docstring(node, clean=False)  # type: ignore[arg-type]
            for index, block in enumerate(literal_blocks(docstring or "")):
                found[module, name, index] = block
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    scopes.append((f"{name}.{child.name}".lstrip("."), child))
    return found


@dataclass(frozen=True)
class Context:
    """What a docstring example takes from its surroundings (`before`: the names it uses
    without defining them), and how the test uses what it defines (`after`)."""

    before: str
    after: str


_FETCH = """
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.testing import ManualClock

LOG_END = 3


class DelayedFetch(DelayedOperation[dict[str, int]]):
    def __init__(self, offset: int, timeout: float) -> None:
        super().__init__(timeout)
        self.offset = offset

    def try_complete(self) -> bool:
        return self.force_complete() if self.offset < LOG_END else False

    def on_complete(self) -> dict[str, int]:
        return {"next_offset": LOG_END}


purgatory = DelayedOperationPurgatory[DelayedFetch]("fetch", clock=ManualClock())
"""

_PRODUCE = """
import asyncio
import urllib.request

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.testing import ManualClock


class DelayedProduce(DelayedOperation[str]):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> str:
        return "REQUEST_TIMED_OUT"
"""

#: Each docstring example, and how it runs. An example added to a docstring fails the test
#: below until it has its entry here.
CONTEXTS = {
    ("purgatory.asgi", "", 0): Context(
        _FETCH,
        """
with TestClient(Starlette(routes=[Route("/fetch", fetch)])) as client:
    assert client.get("/fetch", params={"offset": 1}).json() == {"next_offset": 3}
""",
    ),
    ("purgatory.asgi", "drain_on_signals", 0): Context(
        """
import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.asgi import drain_on_signals


class Parked(DelayedOperation[str]):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> str:
        return "answered at the signal" if self.is_expired else "completed"


Waiters = DelayedOperationPurgatory[Parked]
""",
        """
handed: list[int] = []
signal.signal(signal.SIGTERM, lambda signum, frame: handed.append(signum))  # the server's


async def serve() -> str:
    app = Starlette()
    async with lifespan(app):
        waiting = asyncio.create_task(app.state.waiters.watch(Parked(30.0), ["k"]))
        await asyncio.sleep(0)
        signal.raise_signal(signal.SIGTERM)
        return await waiting


assert asyncio.run(serve()) == "answered at the signal"
assert handed == [signal.SIGINT]  # then handed to the server as its graceful stop
""",
    ),
    ("purgatory.prometheus", "", 0): Context(
        _PRODUCE + "\nPORT = {port}\n",
        """
asyncio.run(main())
url = f"http://127.0.0.1:{PORT}/metrics"
with urllib.request.urlopen(url, timeout=10) as response:
    assert "# TYPE purgatory_delayed gauge" in response.read().decode()
""",
    ),
    ("purgatory.prometheus", "", 1): Context(
        _PRODUCE
        + """
from prometheus_client import REGISTRY, generate_latest

produce = DelayedOperationPurgatory[DelayedProduce]("produce", clock=ManualClock())
""",
        """
assert b'purgatory_parked_seconds_count{outcome="expired",purgatory="produce"}' in (
    generate_latest(REGISTRY)
)
""",
    ),
    ("purgatory.otel", "", 0): Context(
        _PRODUCE
        + """
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

reader = InMemoryMetricReader()
""",
        """
from opentelemetry import metrics as api

api.set_meter_provider(MeterProvider(metric_readers=[reader]))
asyncio.run(main())
""",
    ),
}


def test_every_docstring_example_has_its_context() -> None:
    assert set(docstring_examples()) == set(CONTEXTS)


@pytest.mark.parametrize("where", sorted(CONTEXTS), ids=lambda where: ":".join(map(str, where)))
def test_docstring_example_runs(where: tuple[str, str, int], tmp_path: Path) -> None:
    """Each example, as its docstring shows it, in a fresh interpreter (warnings are errors),
    with what it needs around it. A server's port becomes a free one (9464 may be taken)."""
    example = docstring_examples()[where]
    context = CONTEXTS[where]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = (
        textwrap.dedent(context.before).replace("{port}", str(port))
        + example.replace("9464", str(port))
        + textwrap.dedent(context.after)
    )
    done = run_process(sys.executable, "-W", "error", "-c", code, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, f"{where}:\n{code}\n{done.stderr}"


# -- the FastAPI recipe, served for real --------------------------------------------------------

#: Runs the chain of docs/asgi.md's blocks (its FastAPI recipe is the last) as a module of a
#: reader's would, adds a route of the test's own (how many requests are parked), and serves
#: the recipe's `api` with uvicorn on a free port, as ``uvicorn module:api`` does.
SERVE_RECIPE = """
import json, sys
import uvicorn
from starlette.requests import Request

namespace = {"__name__": "recipe"}
for block in json.load(sys.stdin):
    code = compile("\\n" * (block["line"] - 1) + block["code"], block["file"], "exec")
    exec(code, namespace)
api = namespace["api"]


@api.get("/test/parked")
def parked(request: Request) -> dict[str, int]:
    return {"delayed": request.app.state.waiters.num_delayed()}


uvicorn.run(api, host="127.0.0.1", port=0)
"""
#: Requests parked when the recipe's server gets SIGTERM.
RECIPE_PARKED = 10


async def serve_recipe() -> tuple[asyncio.subprocess.Process, str, list[str]]:
    """The FastAPI recipe under uvicorn, in a process of its own; its URL and its log so far."""
    (chain,) = [c for c in CHAINS if c[0].path.name == "asgi.md" and "FastAPI(" in c[-1].code]
    payload = json.dumps([{"file": str(b.path), "line": b.line, "code": b.code} for b in chain])
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SERVE_RECIPE,
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None
    process.stdin.write(payload.encode())
    process.stdin.close()
    url, log = await uvicorn_url(process, bound=60)
    return process, url, log


@pytest.mark.asyncio
async def test_the_fastapi_recipe_answers_every_parked_request_at_once_on_sigterm() -> None:
    """docs/asgi.md's FastAPI block, copied as is and served by uvicorn: with requests parked
    for 30 s, SIGTERM answers each within a second (its messages, ``expired``) and uvicorn
    exits 0 with nothing in its log but its own lines."""
    process, base, log = await serve_recipe()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(60)) as http:
            parked = [
                asyncio.create_task(http.get(f"{base}/boxes/inbox", params={"timeout": 30}))
                for _ in range(RECIPE_PARKED)
            ]
            async with asyncio.timeout(30):
                while (await http.get(f"{base}/test/parked")).json()["delayed"] < RECIPE_PARKED:
                    await asyncio.sleep(0.05)
            clock = asyncio.get_running_loop().time
            signalled = clock()
            process.terminate()  # SIGTERM, as Kubernetes or systemd stops a server
            answers = await asyncio.gather(*parked)
            answered_in = clock() - signalled
        assert [answer.status_code for answer in answers] == [200] * RECIPE_PARKED
        assert all(answer.json() == {"messages": [], "expired": True} for answer in answers)
        assert answered_in < 1.0, f"answered {answered_in:.2f} s after SIGTERM"
        await exits_cleanly(process, log, bound=30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
