"""The centre's layering, read from the source: small classes, and drivers on the public handle.

A driver (the reaper, `ManualClock`, the load model's clock) moves a purgatory's time through the
public `Timer` handle only; reading a private name of another object would tie it to internals
that a user's own driver cannot reach. These tests read the code (``ast``), so they run in both
builds and fail on the line that breaks the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "purgatory"
MAX_CLASS_LINES = 500
DRIVERS = (
    ("_reaper.py", "Reaper"),
    ("testing/_clock.py", "ManualClock"),
    ("pipeline/_load.py", "LoadClock"),
)
# Private names of other modules a driver may read: the standard library's fast path to the
# running loop (what `asyncio.get_running_loop` calls, without its raise).
ALLOWED = {"asyncio._get_running_loop"}


def long_classes(package: Path) -> list[str]:
    """Every class of `package` longer than `MAX_CLASS_LINES`, as ``path:line name (lines)``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    found.append(f"{path.relative_to(package)}:{node.lineno} {node.name} ({lines})")
    return found


def private_reads(path: Path, class_name: str) -> list[str]:
    """The private names `class_name` in `path` reads on anything but itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    assert classes, f"no class {class_name} in {path}"
    found = []
    for node in ast.walk(classes[0]):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") or ast.unparse(node) in ALLOWED:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_class_of_the_package_is_over_500_lines() -> None:
    assert long_classes(PACKAGE) == []


@pytest.mark.parametrize(("module", "class_name"), DRIVERS)
def test_a_driver_reads_no_private_name(module: str, class_name: str) -> None:
    assert private_reads(PACKAGE / module, class_name) == []


def test_the_checks_see_what_they_refuse(tmp_path: Path) -> None:
    """Each check finds a long class and a private read it is shown (so neither passes empty)."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_CLASS_LINES))
    (tmp_path / "big.py").write_text(f"class Big:\n{body}\n", encoding="utf-8")
    (tmp_path / "driver.py").write_text(
        "class Driver:\n"
        "    def run(self, purgatory):\n"
        "        self._mine = purgatory._timer\n"
        "        return asyncio._get_running_loop()\n",
        encoding="utf-8",
    )
    assert long_classes(tmp_path) == [f"big.py:1 Big ({MAX_CLASS_LINES + 1})"]
    assert private_reads(tmp_path / "driver.py", "Driver") == ["driver.py:3 purgatory._timer"]


def package_imports(package: Path) -> dict[str, set[str]]:
    """Each module of `package` (``_timer``, ``testing._clock``) and the package's modules it
    imports, ``TYPE_CHECKING`` imports included: a circle there is a circle of the design, even
    when the interpreter never runs it."""
    graph: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        here = parts[:-1]  # the module's own package, for relative imports
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not node.level:
                continue
            base = list(here[: len(here) - node.level + 1])
            target = ".".join([*base, *(node.module or "").split(".")]).strip(".")
            if target and (package / target.replace(".", "/")).is_dir():
                # `from . import x` / `from .pkg import x`: x may itself be a module.
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    as_path = package / sub.replace(".", "/")
                    imported.add(sub if as_path.with_suffix(".py").is_file() else target)
            elif target:
                imported.add(target)
        graph[name] = imported - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of `graph`, each as the path that closes it (depth-first search)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return found


def test_the_core_modules_import_in_one_direction() -> None:
    """No module of the core imports, even for type checking, one that leads back to it: the
    sans-IO core (operation, timer, wheel, lists) below the asyncio helpers' users (the reaper,
    the purgatory) below the exporters. The package's ``__init__`` modules, which re-export
    everything, and the Spark pipeline (a user of the package) are left out."""
    graph = package_imports(PACKAGE)
    core = {
        name: {m for m in imported if "pipeline" not in m and m not in ("", "testing")}
        for name, imported in graph.items()
        if "pipeline" not in name and name not in ("", "testing")
    }
    assert "_reaper" in core
    assert "_asyncio" in core
    assert circles(core) == []


def test_only_one_module_of_the_core_imports_asyncio() -> None:
    """``_asyncio.py`` is where asyncio enters; the reaper and the binding use what it exports."""
    importers = []
    for path in sorted(PACKAGE.glob("_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(name == "asyncio" or name.startswith("asyncio.") for name in names):
                importers.append(path.name)
    # The exporters' reads hop threads, and the recorders are not the sans-IO core.
    assert sorted(set(importers)) == ["_asyncio.py", "_metrics.py"]


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    """The check finds a circle closed by a ``TYPE_CHECKING`` import (so it cannot pass empty)."""
    (tmp_path / "_a.py").write_text("from ._b import B\n", encoding="utf-8")
    (tmp_path / "_b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import A\n",
        encoding="utf-8",
    )
    (tmp_path / "_c.py").write_text("from ._a import A\n", encoding="utf-8")
    assert circles(package_imports(tmp_path)) == [["_a", "_b", "_a"]]
