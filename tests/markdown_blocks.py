"""Find the Python code blocks of the README and the docs, and run them as a reader would.

A reader copies one block into a file and runs it, so every ``python`` block runs on its own, in
a fresh interpreter, unless the line before its fence says otherwise with an HTML comment (which
the rendered page does not show):

- ``<!-- continues -->``: the block goes on from the previous block of the same file, in the
  same namespace (a tutorial that builds up step by step; the page's prose says so).
- ``<!-- not-run: reason -->``: the block is deliberately partial; it is only compiled.

A ``<!-- example: examples/NAME.py -->`` line is replaced by that file's source when the site is
built (``docs/hooks.py``); the example has tests of its own. A ``text`` block with
``title="Output"`` right after a Python block is what that block prints, compared exactly.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from helpers import run_process

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)(?P<info>.*)$")
CONTINUES = "<!-- continues -->"
NOT_RUN = re.compile(r"^<!-- not-run: (?P<reason>.+\S) -->$")
EXAMPLE = re.compile(r"^<!-- example: (?P<path>\S+) -->$")


@dataclass
class Block:
    """One fenced Python block of a Markdown file."""

    path: Path
    line: int  # 1-based line of the first line of code
    code: str
    continues: bool = False
    not_run: str | None = None
    output: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """The Markdown a user reads: the README and every page of the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def parse(path: Path) -> list[Block]:
    """The Python blocks of `path`, in order, with their markers and expected output."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    previous = ""  # the last non-blank line before the current one
    after_python: Block | None = None  # the Python block just closed, if only blanks followed
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            if lines[i].strip():
                previous = lines[i].strip()
                after_python = None
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        lang, info = match["lang"], match["info"]
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""
        ):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        first_line = i - len(body) + 1
        i += 1  # the closing fence
        text = textwrap.dedent("\n".join(body)) + "\n"
        if lang in ("python", "py"):
            not_run = NOT_RUN.match(previous)
            block = Block(
                path,
                first_line,
                text,
                continues=previous == CONTINUES,
                not_run=not_run["reason"] if not_run else None,
            )
            blocks.append(block)
            after_python = block
        elif lang == "text" and 'title="Output"' in info and after_python is not None:
            after_python.output = text
            after_python = None
        else:
            after_python = None
        previous = lines[i - 1].strip()
    return blocks


def chains(path: Path) -> list[list[Block]]:
    """The runnable blocks of `path`, grouped: a block and the blocks that continue it."""
    grouped: list[list[Block]] = []
    for block in parse(path):
        if block.not_run is not None:
            continue
        if block.continues:
            assert grouped, f"{block.where}: nothing before it to continue"
            grouped[-1].append(block)
        else:
            grouped.append([block])
    return grouped


def examples(path: Path) -> list[str]:
    """The example files whose source `path` shows (``<!-- example: ... -->`` lines)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [match["path"] for match in map(EXAMPLE.match, lines) if match]


# Runs in the child interpreter: executes the blocks in one namespace and reports what each
# printed. Tracebacks carry the Markdown file's own line numbers.
DRIVER = """
import contextlib, io, json, sys
blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
printed = []
for block in blocks:
    code = compile("\\n" * (block["line"] - 1) + block["code"], block["file"], "exec")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, namespace)
    printed.append(out.getvalue())
print(json.dumps(printed))
"""


#: Seconds a chain may run; one that starts Spark (a JVM, its first job) gets the tests' time for
#: a JVM's start on a loaded 2-core machine besides (`spark_support.STARTUP_SECONDS`).
PLAIN_SECONDS: Final = 60.0
SPARK_SECONDS: Final = 240.0


def run_chain(
    chain: list[Block], *, python: str = sys.executable, cwd: Path, timeout: float | None = None
) -> list[str]:
    """Run `chain` in a fresh `python` (warnings are errors); return what each block printed.
    `timeout`: by default `SPARK_SECONDS` for a chain that uses Spark, else `PLAIN_SECONDS`."""
    if timeout is None:
        spark = any("pyspark" in b.code or "get_session" in b.code for b in chain)
        timeout = SPARK_SECONDS if spark else PLAIN_SECONDS
    payload = json.dumps([{"file": str(b.path), "line": b.line, "code": b.code} for b in chain])
    done = run_process(python, "-W", "error", "-c", DRIVER, input=payload, cwd=cwd, timeout=timeout)
    assert done.returncode == 0, f"{chain[0].where} failed:\n{done.stderr}"
    printed: list[str] = json.loads(done.stdout.splitlines()[-1])
    return printed
