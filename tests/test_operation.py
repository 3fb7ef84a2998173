"""`DelayedOperation` (`purgatory._operation`): its timeout, completing outside a purgatory, and
what its awaiters get, whatever `on_complete` raises."""

from __future__ import annotations

import ast
import asyncio
import math
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import Custom, FlagOperation, Raises, loop_errors, manual_purgatory

import purgatory._operation
from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
)
from purgatory.testing import check_invariants

#: The event loops run in virtual time (conftest.py): an expiry costs no wall time.
pytestmark = pytest.mark.virtualclock


@pytest.mark.parametrize("timeout", [-0.001, math.nan, math.inf, -math.inf])
def test_operation_rejects_bad_timeouts(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        FlagOperation(timeout)


def test_an_int_beyond_every_float_is_a_bad_timeout_not_an_overflow() -> None:
    with pytest.raises(ValueError, match="finite number of seconds"):
        FlagOperation(10**400)


@pytest.mark.parametrize("timeout", ["1", None, True])
def test_operation_rejects_non_numbers(timeout: object) -> None:
    with pytest.raises(TypeError, match="timeout"):
        FlagOperation(timeout)  # type: ignore[arg-type]


def test_zero_and_integer_timeouts_are_fine() -> None:
    assert FlagOperation(0).timeout == 0.0
    assert FlagOperation(3).timeout == 3.0


def test_force_complete_outside_a_purgatory_runs_on_complete_once() -> None:
    op = FlagOperation(1)
    assert op.force_complete()
    assert not op.force_complete()
    assert op.calls == ["complete"]
    assert op.is_completed
    assert not op.is_expired
    assert not op.is_cancelled


# -- awaiting an operation ------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("path", ["check", "threadsafe", "force", "expiry"])
async def test_a_base_exception_in_on_complete_reaches_every_awaiter(path: str) -> None:
    loop_errors()  # the loop's reports of the raise: recorded, not logged
    error = Custom("from on_complete")
    async with DelayedOperationPurgatory[FlagOperation]("awaiters") as p:
        op = Raises(0.02 if path == "expiry" else 30, "on_complete", error)
        first = asyncio.create_task(p.watch(op, ["k"]))
        await asyncio.sleep(0)
        second = asyncio.create_task(outcome_of(op))
        await asyncio.sleep(0)
        op.ready = True
        if path == "check":
            p.check_and_complete("k")
        elif path == "threadsafe":
            thread = threading.Thread(target=p.check_and_complete_threadsafe, args=("k",))
            thread.start()
            thread.join()
        elif path == "force":
            assert op.force_complete() is True
        results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
        assert list(results) == [error, error]
        with pytest.raises(Custom):
            await op


def test_a_base_exception_in_on_complete_under_the_manual_clock() -> None:
    clock, p = manual_purgatory()
    error = Custom("manual")
    op = Raises(0.01, "on_complete", error)
    p.try_complete_else_watch(op, ["k"])
    clock.advance(0.01)
    assert op.is_expired
    assert op._result is error
    check_invariants(p)


async def outcome_of(op: DelayedOperation[Any]) -> Any:
    return await op


@pytest.mark.asyncio
async def test_awaiting_an_operation_never_watched_raises() -> None:
    op = FlagOperation(1)
    with pytest.raises(RuntimeError, match="never watched"):
        await asyncio.wait_for(outcome_of(op), 5.0)


def test_on_expiration_needs_no_override() -> None:
    """Only try_complete and on_complete are abstract: on_complete already sees is_expired."""

    class Minimal(DelayedOperation[str]):
        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> str:
            return "expired" if self.is_expired else "done"

    clock, p = manual_purgatory()
    op = Minimal(0.5)
    p.try_complete_else_watch(op, ["k"])
    clock.advance(0.5)
    assert op.is_expired
    assert op._result == "expired"

    class Incomplete(DelayedOperation[None]):  # on_complete stays abstract
        def try_complete(self) -> bool:
            return False

    with pytest.raises(TypeError, match="on_complete"):
        Incomplete(1.0)  # type: ignore[abstract]
    check_invariants(p)


# -- the operation protocol: who writes which field -------------------------------------------

PACKAGE = Path(purgatory._operation.__file__).parent
#: The fields of the operation protocol: the core's (the pure-Python modules' slots).
OPERATION_FIELDS = frozenset(purgatory._operation.FIELDS)


def ownership_table(docstring: str) -> dict[str, set[str]]:
    """The table of the operation protocol in `docstring`: field -> the writers it names.

    A reST simple table: the rows between its second and third rule; a row whose first column
    is blank goes on with the row above.
    """
    lines = docstring.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+\s+=+", line)]
    assert len(rules) == 3, "no table of fields and writers found"
    split = lines[rules[0]].index(" ") + 1
    table: dict[str, set[str]] = {}
    fields: list[str] = []
    for line in lines[rules[1] + 1 : rules[2]]:
        named = re.findall(r"``(\w+)``", line[:split])
        if named:
            fields = named
        for field in fields:
            table.setdefault(field, set()).update(re.findall(r"``([\w.]+)``", line[split:]))
    return table


def field_writes(package: Path) -> list[tuple[str, str, str]]:
    """Every write of an operation field in `package`: (field, writer, where).

    A write is an assignment, augmented assignment, ``del`` or ``setattr`` of an attribute
    named like a field, on anything but ``self`` of a class other than `DelayedOperation`
    (whose own attributes those are). The writer is ``module.Class.method`` or
    ``module.function`` (a nested function counts as the one it is in).
    """
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        module = ".".join(parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for scope, node in _walk_scopes(tree, []):
            for target, field in _written_fields(node):
                owner_class = scope[0] if len(scope) > 1 else None
                if (
                    isinstance(target, ast.Name)
                    and target.id == "self"
                    and owner_class not in (None, "DelayedOperation")
                ):
                    continue
                writer = ".".join([module, *scope[:2]])
                found.append((field, writer, f"{path.name}:{getattr(node, 'lineno', 0)}"))
    return found


def _walk_scopes(node: ast.AST, scope: list[str]) -> list[tuple[list[str], ast.AST]]:
    """Each node with the names of the classes and functions around it, outermost first."""
    found = []
    for child in ast.iter_child_nodes(node):
        inner = scope
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            inner = [*scope, child.name]
        found.append((inner if inner is scope else scope, child))
        found.extend(_walk_scopes(child, inner))
    return found


def _written_fields(node: ast.AST) -> list[tuple[ast.expr, str]]:
    """(the object written, the field) of each operation field `node` writes."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign | ast.Delete):
        targets = list(node.targets)
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) in ("setattr", "object.__setattr__", "delattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in OPERATION_FIELDS
    ):
        return [(node.args[0], str(node.args[1].value))]
    flat: list[ast.expr] = []
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets.extend(target.elts)
        else:
            flat.append(target)
    return [
        (target.value, target.attr)
        for target in flat
        if isinstance(target, ast.Attribute) and target.attr in OPERATION_FIELDS
    ]


def _allowed(writer: str, writers: set[str]) -> bool:
    return any(writer == named or writer.startswith(f"{named}.") for named in writers)


def test_the_ownership_table_covers_every_field() -> None:
    table = ownership_table(purgatory._operation.__doc__ or "")
    assert set(table) == OPERATION_FIELDS


def test_every_write_of_an_operation_field_is_by_a_writer_the_table_names() -> None:
    table = ownership_table(purgatory._operation.__doc__ or "")
    writes = field_writes(PACKAGE)
    assert len(writes) > 30  # the scan sees the package's writes
    strays = [
        f"{where} {writer} writes {field}"
        for field, writer, where in writes
        if not _allowed(writer, table[field])
    ]
    assert strays == []
    # ... and each writer the table names does write the field (no stale row).
    stale = [
        f"{named} named for {field}"
        for field, named_writers in table.items()
        for named in named_writers
        if not any(f == field and _allowed(w, {named}) for f, w, _ in writes)
    ]
    assert stale == []


def test_the_ownership_check_sees_a_stray_write(tmp_path: Path) -> None:
    """A write from a class the table does not name, in any of the forms, is found."""
    (tmp_path / "_stray.py").write_text(
        "class Stray:\n"
        "    def poke(self, op):\n"
        "        op._state = 2\n"
        "        op._listed -= 1\n"
        "        self._state = 0\n"  # its own attribute
        "        setattr(op, '_owner', None)\n"
        "        (op._keys, x) = ((), 1)\n"
        "        del op._marks\n",
        encoding="utf-8",
    )
    writes = [(field, writer) for field, writer, _ in field_writes(tmp_path)]
    assert sorted(writes) == [
        ("_keys", "_stray.Stray.poke"),
        ("_listed", "_stray.Stray.poke"),
        ("_marks", "_stray.Stray.poke"),
        ("_owner", "_stray.Stray.poke"),
        ("_state", "_stray.Stray.poke"),
    ]


# -- an operation whose __init__ forgot super().__init__ --------------------------------------


class Forgot(DelayedOperation[None]):
    """The usual mistake: a subclass's __init__ that never calls super().__init__(timeout)."""

    def __init__(self, timeout: float) -> None:
        self.wanted = timeout

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        pass


NOT_SET_UP = r"Forgot object is not a set-up DelayedOperation \(did its __init__ call super\(\)"


@pytest.mark.parametrize("read", ["is_completed", "is_expired", "is_cancelled", "timeout"])
def test_what_an_operation_that_was_not_set_up_says_when_read(read: str) -> None:
    with pytest.raises(TypeError, match=NOT_SET_UP):
        getattr(Forgot(1.0), read)


def test_the_repr_of_an_operation_that_was_not_set_up_says_why_and_never_raises() -> None:
    assert repr(Forgot(1.0)) == (
        "<Forgot not set up: its __init__ did not call super().__init__(timeout)>"
    )


@pytest.mark.asyncio
async def test_watching_or_awaiting_an_operation_that_was_not_set_up_says_why() -> None:
    _clock, p = manual_purgatory()
    with pytest.raises(TypeError, match=NOT_SET_UP):
        p.try_complete_else_watch(Forgot(1.0), ["k"])
    with pytest.raises(TypeError, match=NOT_SET_UP):
        await p.watch(Forgot(1.0), ["k"])
    with pytest.raises(TypeError, match=NOT_SET_UP):
        await Forgot(1.0)
    assert p.statistics().watched == 0
