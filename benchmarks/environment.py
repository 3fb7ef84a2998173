"""Where and with what a run happened: Python, machine, load, library version, git commit.

A results file holds the run of one commit: `describe_environment` names it, and says whether
the code (``purgatory/``, the benchmarks' modules) had uncommitted changes when the run started.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ("describe_environment", "load_average")

ROOT = Path(__file__).resolve().parent.parent


def load_average() -> str:
    """The 1/5/15-minute load averages, or "n/a"."""
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def _commit() -> tuple[str, bool]:
    """The short commit of HEAD and whether the code (purgatory/, benchmarks/*.py) differs from
    it; results files written into benchmarks/ do not count."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--", "purgatory", "benchmarks/*.py"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return commit, dirty


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_environment() -> dict[str, Any]:
    """The provenance block of the results JSON (the run fills in timing and config)."""
    import purgatory

    commit, dirty = _commit()
    git = f"commit {commit}" + (" + uncommitted changes" if dirty else "")
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "load_before": load_average(),
        "purgatory_version": purgatory.__version__,
        # The core that ran (``native`` or ``python``, `PURGATORY_NO_EXTENSIONS`).
        "purgatory_core": purgatory.IMPLEMENTATION,
        "git": git,
        "commit": commit,
        "dirty": dirty,
        "uvloop": _version("uvloop"),
        "command": " ".join(["python -m benchmarks", *sys.argv[1:]]),
    }
