"""Both implementations of the core in one test run: each core test module is collected twice.

The package's public names are one core per process: the native classes where it is built, the
pure-Python ones with ``PURGATORY_NO_EXTENSIONS=1`` (read once, when ``purgatory._impl`` is
imported). The pure classes stay importable beside the native ones (``_PyDelayedOperation``, ...:
tests/test_twins.py drives them side by side), but the whole suite, written against the public
names and the package's own imports, runs on each core through this plugin.
CPython tests ``asyncio.Future`` and its pure twin in one process by importing the pure module
fresh with the accelerator blocked (``import_fresh_module(..., blocked=['_asyncio'])``); this
plugin does the same for the whole package. It imports ``purgatory`` a second time with the
switch set, keeps those modules (and the test-support modules that imported them) as the *pure
world*, and collects every core test module a second time inside that world, as
``tests/test_x.py[python]::...``. While a pure item runs, from its first fixture to its last
teardown, the pure world stands in ``sys.modules``, so an import inside a test, a fixture or a
worker thread it starts sees the same implementation as the module's own imports.

The native items keep their ids (``tests/test_x.py::...``); where the native core is not built,
or the whole run has ``PURGATORY_NO_EXTENSIONS`` set, there is one world only and nothing is
collected twice. ``--implementation=native|python|both`` chooses (default: both).

The differential state machine (test_differential_machine.py) uses the same pure world
(`pure_world`) to drive a purgatory of each build side by side in one process.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

PURE = "python"

#: Test modules that are not the core's: they use the core as users do, on the default build
#: only (the examples, the pipeline, the benchmarks, the docs, the packaging), or compare the
#: two builds themselves (the differential test's worker processes).
NOT_CORE = (
    "test_benchmark_",
    "test_minibroker_",
    "test_pipeline",
    "test_docs.py",
    "test_pictures.py",
    "test_metrics_recipe.py",
    "test_release.py",
    "test_asgi_servers.py",
    "test_load_model.py",
    "test_load_tail.py",
    "test_examples.py",
    "test_packaging.py",
    "test_differential.py",
    "test_differential_machine.py",
)

#: Core modules about the native core itself (its module object, its types): collected in the
#: native world only, as the pure build has nothing they could test.
NATIVE_ONLY = ("test_native_module.py",)

#: Modules of the tests' own that import the package: a pure test imports pure copies of them.
SUPPORT = (
    "helpers",
    "api_surface",
    "metrics_support",
    "virtual_time",
    "http_support",
    "differential_worker",
)


#: The environment inside the pure world, as a pure-only run has it: subprocesses a test starts
#: run the same core, and a test reading the switch sees it set (the expectation, where the run
#: states one, names the pure modules too).
PURE_ENVIRON = {"PURGATORY_NO_EXTENSIONS": "1", "PURGATORY_EXPECT_IMPLEMENTATION": PURE}


def is_core(path: Path) -> bool:
    """Whether a test file is one of the core's (collected once per implementation)."""
    return path.name.startswith("test_") and not path.name.startswith(NOT_CORE)


class Worlds:
    """The two sets of ``sys.modules`` entries, and which one stands there now."""

    def __init__(self) -> None:
        self.pure: dict[str, ModuleType] = {}
        self.native_held: dict[str, ModuleType] = {}
        self.inside = False
        #: The core's test modules: each world has its own copy (pickle finds a test's classes
        #: by their module's name).
        self.test_modules: set[str] = set()

    def _in_world(self, name: str) -> bool:
        if name == "purgatory._native":  # the extension is loaded once; the pure world ignores it
            return False
        return (
            name == "purgatory"
            or name.startswith("purgatory.")
            or name in SUPPORT
            or name in self.test_modules
        )

    def _take(self) -> dict[str, ModuleType]:
        """Take the world that stands in ``sys.modules`` out of it."""
        # What the world's names start with, tested first (in C): the differential machine
        # swaps the worlds twice a step, each time over every module the session imported.
        starts = ("purgatory", *SUPPORT, *self.test_modules)
        names = [name for name in sys.modules if name.startswith(starts) and self._in_world(name)]
        return {name: sys.modules.pop(name) for name in names}

    def build(self) -> None:
        """Import the package again with the native core switched off: the pure world."""
        with self.entered():
            import purgatory
            import purgatory.testing  # part of the world

            if purgatory.IMPLEMENTATION != PURE:
                raise RuntimeError("the pure world imported the native core")

    def import_module(self, name: str) -> ModuleType:
        """Import `name` (the package's or one of SUPPORT) inside the pure world: its pure copy,
        beside the default build's under the same name."""
        with self.entered():
            return importlib.import_module(name)

    @contextmanager
    def entered(self) -> Iterator[None]:
        """Stand the pure world in ``sys.modules`` (what gets imported inside joins it)."""
        if self.inside:
            yield
            return
        held = self._take()
        sys.modules.update(self.pure)
        environ = {name: os.environ.get(name) for name in PURE_ENVIRON}
        for name, value in PURE_ENVIRON.items():
            if name in os.environ or name == "PURGATORY_NO_EXTENSIONS":
                os.environ[name] = value
        self.inside = True
        try:
            yield
        finally:
            self.inside = False
            for name, previous in environ.items():
                if previous is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = previous
            self.pure = self._take()
            sys.modules.update(held)


class PureModule(pytest.Module):
    """A core test module imported a second time, inside the pure world."""

    def _getobj(self) -> Any:
        worlds: Worlds = self.config.stash[WORLDS]
        worlds.test_modules.add(self.path.stem)
        with worlds.entered():
            return super()._getobj()  # type: ignore[no-untyped-call]


WORLDS = pytest.StashKey[Worlds]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--implementation",
        choices=("native", PURE, "both"),
        default="both",
        help="which core the core's tests run on: native, python or both (default)",
    )
    parser.addoption(
        "--core-only",
        action="store_true",
        help="collect the core's test modules only (the quick edit-test loop: `make quick`)",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("--core-only") and collection_path.suffix == ".py":
        return not is_core(collection_path) or None
    return None


def pure_world(config: pytest.Config) -> Worlds:
    """The session's pure world, built on first use (a run of the native tests alone, as `make
    sanitize`'s, builds it only for a test that asks for it)."""
    worlds = config.stash[WORLDS]
    if not worlds.pure:
        worlds.build()
    return worlds


def _both(config: pytest.Config) -> bool:
    import purgatory

    return config.getoption("--implementation") == "both" and purgatory.IMPLEMENTATION != PURE


def pytest_configure(config: pytest.Config) -> None:
    worlds = Worlds()
    config.stash[WORLDS] = worlds
    if _both(config):
        pure_world(config)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    config = parent.config
    if not (
        file_path.suffix == ".py"
        and is_core(file_path)
        and file_path.name not in NATIVE_ONLY
        and _both(config)
    ):
        return None
    rel = file_path.relative_to(config.rootpath).as_posix()
    return PureModule.from_parent(parent, path=file_path, nodeid=f"{rel}[{PURE}]")


def implementation_of(item: pytest.Item) -> str:
    """Which core an item runs on."""
    import purgatory

    if item.getparent(PureModule) is not None:
        return PURE
    return str(purgatory.IMPLEMENTATION)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    if item.getparent(PureModule) is None:
        return (yield)
    with item.config.stash[WORLDS].entered():
        return (yield)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    choice = config.getoption("--implementation")
    if choice == "both":
        return
    import purgatory

    if choice != purgatory.IMPLEMENTATION:  # the run's own world is not the one asked for
        raise pytest.UsageError(
            f"--implementation={choice}, but this run's core is {purgatory.IMPLEMENTATION} "
            "(PURGATORY_NO_EXTENSIONS=1 selects the pure modules)"
        )
