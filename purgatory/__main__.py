"""``python -m purgatory --version``: the version, and which core runs here and why.

The pure-Python modules take over silently wherever the native core is missing (a pure-Python
wheel, an interpreter no wheel is built for, an install without a compiler) or switched off:
both behave the same and only speed differs, so nothing else would tell. This command says it
in two lines a bug report can quote::

    $ python -m purgatory --version
    asyncio-purgatory 0.1.0 (CPython 3.13.1, Linux x86_64) from /venv/.../purgatory
    core: native (the C extension purgatory._native)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
from collections.abc import Sequence

from . import IMPLEMENTATION, __version__
from ._impl import _disabled

__all__ = ("core", "main", "version")

#: The distribution's name on the package index (the import name is ``purgatory``).
DISTRIBUTION = "asyncio-purgatory"


def core() -> str:
    """Which core runs, and why: one line."""
    if IMPLEMENTATION == "native":
        return "core: native (the C extension purgatory._native)"
    if _disabled():
        value = os.environ.get("PURGATORY_NO_EXTENSIONS", "")
        return (
            f"core: python (the pure-Python modules): switched off by "
            f"PURGATORY_NO_EXTENSIONS={value} in the environment"
        )
    if importlib.util.find_spec(f"{__package__}._native") is None:
        return (
            "core: python (the pure-Python modules): the native core is not built in this "
            "installation (a pure-Python wheel, an interpreter no wheel is built for, or a "
            "build without a C compiler: pip install -v shows why)"
        )
    return "core: python (the pure-Python modules)"  # pragma: no cover - not reached


def version() -> str:
    """The version, the interpreter and where the package is; then `core`'s line."""
    where = os.path.dirname(os.path.abspath(__file__))
    interpreter = f"{platform.python_implementation()} {platform.python_version()}"
    machine = f"{platform.system()} {platform.machine()}"
    return f"{DISTRIBUTION} {__version__} ({interpreter}, {machine}) from {where}\n{core()}"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m purgatory [--version]``: both print the version and the core."""
    parser = argparse.ArgumentParser(
        prog="python -m purgatory",
        description="Print the version of asyncio-purgatory and which core runs here "
        "(native: the C extension; python: the pure-Python modules) and why.",
    )
    parser.add_argument(
        "--version", action="store_true", help="print the version and the core (the default)"
    )
    parser.parse_args(argv)
    print(version())
    return 0


if __name__ == "__main__":
    sys.exit(main())
