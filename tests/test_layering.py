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
    ("_asyncio.py", "Reaper"),
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
