"""The native core's C functions longer than a reviewer reads at once.

A function of the core is a definition in the files' own style (the return type on its own line,
the name at the start of the next, the body's braces at the start of a line), counted from its
name's line to its closing brace. Those over the limit (50 lines unless ``--limit`` says) are
printed, longest first, as ``file:line name length``; the exit status is 1 if there is any, so
that a test (tests/test_c_function_lengths.py) holds the files to it. A long function is split
into named steps, as ``watchers.c``'s trigger is (``trigger_candidates``, ``trigger_loop``,
``trigger_end``), not exempted. Macros that expand to functions are not counted (they are
tables of small bodies, read once).

Usage: python tools/c_function_lengths.py [--limit N] [FILE.c ...]   (default: purgatory/_csrc/*.c)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import NamedTuple

CSRC = Path(__file__).resolve().parents[1] / "purgatory" / "_csrc"
LIMIT = 50

#: A definition's name line: an identifier at the start of the line, its parameter list opened.
_NAME = re.compile(r"^([A-Za-z_]\w*)\(")


class Function(NamedTuple):
    """One C function: where it starts, its name and its length in lines."""

    path: Path
    line: int
    name: str
    length: int


def _return_type(line: str) -> bool:
    """Whether `line` can be a definition's return type (not code, a comment or a directive)."""
    return bool(line) and not line.startswith((" ", "#", "/", "*", "}")) and line[-1] not in ";,)"


def functions(path: Path) -> list[Function]:
    """The function definitions of one C file (see the module's docstring for the style read)."""
    lines = path.read_text().splitlines()
    found: list[Function] = []
    i = 0
    while i < len(lines):
        match = _NAME.match(lines[i])
        if match is None or i == 0 or not _return_type(lines[i - 1]):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i] != "{":
            if not lines[i] or lines[i].rstrip().endswith(";"):  # a declaration, no body
                break
            i += 1
        if i == len(lines) or lines[i] != "{":
            i = start + 1
            continue
        while i < len(lines) and lines[i] != "}":
            i += 1
        found.append(Function(path, start + 1, match.group(1), i - start + 1))
        i += 1
    return found


def too_long(paths: list[Path], limit: int = LIMIT) -> list[Function]:
    """The functions of `paths` over `limit` lines, longest first."""
    every = [f for path in paths for f in functions(path)]
    return sorted((f for f in every if f.length > limit), key=lambda f: -f.length)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = args.files or sorted(CSRC.glob("*.c"))
    long = too_long(paths, args.limit)
    for f in long:
        print(f"{f.path.name}:{f.line} {f.name} {f.length}")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
