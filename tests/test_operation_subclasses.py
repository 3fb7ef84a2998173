"""How the core treats user subclasses of `DelayedOperation` (issue 33, rows 4, 6, 7 and 8): names
that shadow the core's fields, staticmethod callbacks, a ``__getattribute__`` of the class's own,
and copies. Each test holds on both implementations (the suite runs once per build); the last
ones run the same probe on both in one run and compare what each printed, messages included.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import manual_purgatory

from purgatory import DelayedOperation
from purgatory._impl import native
from purgatory._operation import FIELDS, _OperationCore
from purgatory.testing import check_invariants

ROOT = Path(__file__).resolve().parents[1]


# -- row 4: a class attribute named as one of the core's fields ------------------------------------


def _namespace(**extra: Any) -> dict[str, Any]:
    def try_complete(self: Any) -> bool:
        return False

    def on_complete(self: Any) -> str:
        return "done"

    return {"try_complete": try_complete, "on_complete": on_complete, **extra}


@pytest.mark.parametrize("field", FIELDS)
def test_a_class_attribute_named_as_a_field_is_refused_as_the_class_is_made(field: str) -> None:
    with pytest.raises(TypeError) as refused:
        type("Shadows", (DelayedOperation,), _namespace(**{field: None}))
    assert str(refused.value) == (
        f"Shadows defines {field}, the name of a field the core keeps on every operation (see "
        f"purgatory._operation): a class attribute or slot named {field} would hide it; rename it"
    )


@pytest.mark.parametrize("field", ["_result", "_state"])
def test_a_slot_named_as_a_field_is_refused(field: str) -> None:
    with pytest.raises(TypeError, match=f"defines {field},"):
        type("Slots", (DelayedOperation,), _namespace(__slots__=(field,)))


def test_a_field_name_from_a_mixin_is_refused_naming_the_mixin() -> None:
    class Mixin:
        _future = None

    with pytest.raises(TypeError, match=r"\.Op defines _future \(inherited from \S*\.Mixin\), "):

        class Op(Mixin, DelayedOperation[str]):
            def try_complete(self) -> bool:
                return False

            def on_complete(self) -> str:
                return "done"


class Annotated(DelayedOperation[str]):
    """Annotates a field of the core without a value: no attribute, nothing hidden."""

    _result: str

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        return "annotated"


@pytest.mark.asyncio
async def test_an_annotation_of_a_field_is_not_an_attribute_and_the_operation_completes() -> None:
    _clock, purgatory = manual_purgatory()
    op = Annotated(1.0)
    assert not purgatory.try_complete_else_watch(op, ["k"])
    op.ready = True
    assert purgatory.check_and_complete("k") == 1
    assert await op == "annotated"
    check_invariants(purgatory)


# -- row 6: staticmethod callbacks on a slotted class ----------------------------------------------

CALLS: list[str] = []


class Static(DelayedOperation[str]):
    """Its callbacks are staticmethods: called without the operation."""

    __slots__ = ()

    @staticmethod
    def try_complete() -> bool:
        CALLS.append("try")
        return False

    @staticmethod
    def on_complete() -> str:
        CALLS.append("complete")
        return "static"

    @staticmethod
    def on_expiration() -> None:
        CALLS.append("expire")


def test_staticmethod_callbacks_are_called_without_the_operation_after_many_watches() -> None:
    """The class's first watch takes the reference's path; the later ones the core's cached
    methods, which must not hand a staticmethod the operation."""
    CALLS.clear()
    clock, purgatory = manual_purgatory()
    outcomes = []
    for round_ in range(3):
        op = Static(1.0)
        assert not purgatory.try_complete_else_watch(op, ["k"])
        assert purgatory.check_and_complete("k") == 0
        if round_ == 1:
            assert op.force_complete()
        else:
            clock.advance(2.0)
        outcomes.append((op.is_completed, op.is_expired, op._result))
    assert outcomes == [(True, True, "static"), (True, False, "static"), (True, True, "static")]
    # per round: the watch's two attempts, the trigger's one, then on_complete (and on_expiration)
    expired = ["try", "try", "try", "complete", "expire"]
    assert [*expired, "try", "try", "try", "complete", *expired] == CALLS
    check_invariants(purgatory)


class ClassLevel(DelayedOperation[str]):
    """Its callbacks are classmethods: called with the class."""

    __slots__ = ()

    @classmethod
    def try_complete(cls) -> bool:
        CALLS.append(f"try {cls.__name__}")
        return False

    @classmethod
    def on_complete(cls) -> str:
        return f"{cls.__name__} done"

    @classmethod
    def on_expiration(cls) -> None:
        CALLS.append(f"expire {cls.__name__}")


def test_classmethod_callbacks_are_called_with_the_class_after_many_watches() -> None:
    CALLS.clear()
    clock, purgatory = manual_purgatory()
    for _ in range(2):
        op = ClassLevel(1.0)
        assert not purgatory.try_complete_else_watch(op, ["k"])
        assert purgatory.check_and_complete("k") == 0
        clock.advance(2.0)
        assert op._result == "ClassLevel done"
    assert ["try ClassLevel"] * 3 + ["expire ClassLevel"] == CALLS[:4] == CALLS[4:]
    check_invariants(purgatory)


# -- row 7: a __getattribute__ of the class's own --------------------------------------------------

SEEN: list[str] = []


class Instrumented(DelayedOperation[str]):
    """Records every attribute read of its instances, as instrumentation or a proxy would."""

    __slots__ = ("ready",)

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False

    def __getattribute__(self, name: str) -> Any:
        SEEN.append(name)
        return object.__getattribute__(self, name)

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        return "instrumented"

    def on_expiration(self) -> None:
        pass


def _public(names: list[str]) -> list[str]:
    return [name for name in names if not name.startswith("_")]


def test_a_getattribute_of_the_class_sees_the_methods_the_core_calls() -> None:
    clock, purgatory = manual_purgatory()
    seen = {}
    for round_ in range(2):  # the class's first watch, then the core's path for a known class
        SEEN.clear()
        op = Instrumented(1.0)
        SEEN.clear()
        purgatory.try_complete_else_watch(op, ["k"])
        seen[f"watch {round_}"] = _public(SEEN)
        SEEN.clear()
        purgatory.check_and_complete("k")
        seen[f"trigger {round_}"] = _public(SEEN)
        op.ready = True
        SEEN.clear()
        purgatory.check_and_complete("k")
        seen[f"completing trigger {round_}"] = _public(SEEN)
    op = Instrumented(1.0)
    purgatory.try_complete_else_watch(op, ["k"])
    SEEN.clear()
    op.force_complete()
    seen["force_complete"] = _public(SEEN)
    op = Instrumented(1.0)
    purgatory.try_complete_else_watch(op, ["k"])
    SEEN.clear()
    clock.advance(2.0)
    seen["expiry"] = _public(SEEN)
    assert op.is_expired
    attempt = ["try_complete", "ready"]
    completing = [*attempt, "force_complete", "on_complete"]
    assert seen == {
        "watch 0": attempt * 2,
        "trigger 0": attempt,
        "completing trigger 0": completing,
        "watch 1": attempt * 2,
        "trigger 1": attempt,
        "completing trigger 1": completing,
        "force_complete": ["force_complete", "on_complete"],
        "expiry": ["on_complete", "on_expiration"],
    }
    check_invariants(purgatory)


class Redirected(DelayedOperation[str]):
    """A proxy of sorts: its __getattribute__ answers for the callbacks the purgatory calls."""

    __slots__ = ("ready",)

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False

    def __getattribute__(self, name: str) -> Any:
        if name == "try_complete":
            return lambda: (
                object.__getattribute__(self, "force_complete")() if self.ready else False
            )
        if name == "on_complete":
            return lambda: "redirected"
        if name == "on_expiration":
            return lambda: SEEN.append("redirected expiration")
        return object.__getattribute__(self, name)

    def try_complete(self) -> bool:
        raise AssertionError("not the one the class's __getattribute__ gives")

    def on_complete(self) -> str:
        raise AssertionError("not the one the class's __getattribute__ gives")


@pytest.mark.parametrize("path", ["trigger", "force_complete", "expiry"])
def test_the_callbacks_a_getattribute_gives_are_the_ones_called(path: str) -> None:
    SEEN.clear()
    clock, purgatory = manual_purgatory()
    for _ in range(2):  # the class's first watch, then the core's path for a known class
        op = Redirected(1.0)
        assert not purgatory.try_complete_else_watch(op, ["k"])
        if path == "trigger":
            op.ready = True
            assert purgatory.check_and_complete("k") == 1
        elif path == "force_complete":
            assert op.force_complete()
        else:
            clock.advance(1.0)
            assert op.is_expired
        assert op._result == "redirected"
    assert (["redirected expiration"] * 2 if path == "expiry" else []) == SEEN
    check_invariants(purgatory)


WRITES: list[str] = []


class RecordsWrites(DelayedOperation[str]):
    """Records every attribute write of its instances."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        WRITES.append(name)
        object.__setattr__(self, name, value)

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> str:
        return "recorded"


def test_a_setattr_of_the_class_sees_the_writes_of_init() -> None:
    WRITES.clear()
    RecordsWrites(1.0)
    assert WRITES == ["_timeout", "_state", "_owner", "_bucket", "_future"]


def test_a_frozen_dataclass_refuses_the_writes_of_init() -> None:
    @dataclasses.dataclass(frozen=True, eq=False)
    class Frozen(DelayedOperation[str]):
        timeout_given: float

        def __post_init__(self) -> None:
            DelayedOperation.__init__(self, self.timeout_given)

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> str:
            return "frozen"

    with pytest.raises(
        dataclasses.FrozenInstanceError, match=r"^cannot assign to field '_timeout'$"
    ):
        Frozen(1.0)


# -- row 8: copies ---------------------------------------------------------------------------------


class Plain(DelayedOperation[list[int]]):
    """A subclass with a __dict__."""

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False
        self.items = [1, 2]

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> list[int]:
        return self.items


class Slotted(DelayedOperation[list[int]]):
    """A slotted subclass."""

    __slots__ = ("items", "ready")

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False
        self.items = [1, 2]

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> list[int]:
        return self.items


def _fields(op: object) -> dict[str, Any]:
    found = {}
    for name in (*FIELDS, "items", "ready"):
        try:
            found[name] = getattr(op, name)
        except AttributeError:
            found[name] = "<unset>"
    return found


def test_the_core_names_its_fields_as_slots_on_both_implementations() -> None:
    """`copyreg` finds a class's slots in ``__slots__``: the native core's are the reference's."""
    assert _OperationCore.__dict__["__slots__"] == FIELDS
    if native is not None:
        assert native.OperationCore.__dict__["__slots__"] == FIELDS


@pytest.mark.parametrize("cls", [Plain, Slotted])
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy])
def test_a_copy_of_a_new_operation_is_a_new_operation_of_its_own(
    cls: type[Plain | Slotted], how: Any
) -> None:
    original = cls(2.5)
    twin = how(original)
    assert type(twin) is cls
    assert _fields(twin) == _fields(original)
    assert _fields(twin)["_state"] == 0
    assert _fields(twin)["_result"] == "<unset>"
    assert (twin.items is original.items) == (how is copy.copy)
    clock, purgatory = manual_purgatory()
    assert not purgatory.try_complete_else_watch(original, ["k"])
    assert not purgatory.try_complete_else_watch(twin, ["k"])  # a copy is watched on its own
    twin.ready = True
    assert purgatory.check_and_complete("k") == 1
    assert twin.is_completed
    assert not original.is_completed
    clock.advance(3.0)
    assert original.is_expired
    check_invariants(purgatory)


@pytest.mark.asyncio
@pytest.mark.parametrize("cls", [Plain, Slotted])
@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy])
async def test_a_copy_of_a_finished_operation_is_finished_and_belongs_to_no_purgatory(
    cls: type[Plain | Slotted], how: Any
) -> None:
    _clock, purgatory = manual_purgatory()
    op = cls(1.0)
    purgatory.try_complete_else_watch(op, ["k"])
    op.ready = True
    purgatory.check_and_complete("k")
    assert await op == [1, 2]  # (an awaited operation has a future: it is not copied)
    twin = how(op)
    assert twin.is_completed
    assert twin._owner is None
    assert twin._future is None
    assert await twin == [1, 2]
    assert not twin.force_complete()
    assert repr(twin) == repr(op)


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy, pickle.dumps])
def test_a_watched_pending_operation_is_not_copied(how: Any) -> None:
    clock, purgatory = manual_purgatory()
    op = Slotted(1.0)
    purgatory.try_complete_else_watch(op, ["k"])
    with pytest.raises(TypeError) as refused:
        how(op)
    assert str(refused.value) == (
        "cannot copy <Slotted watched timeout=1.0>: it is watched, held by its purgatory's timer "
        "and keys, which would hold no copy of it; copy an operation before it is watched, or "
        "once it finished"
    )
    clock.advance(2.0)
    assert op.is_expired
    check_invariants(purgatory)


@pytest.mark.parametrize("cls", [Plain, Slotted])
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickles_of_every_protocol_round_trip(cls: type[Plain | Slotted], protocol: int) -> None:
    op = cls(1.5)
    op.force_complete()
    back = pickle.loads(pickle.dumps(op, protocol))
    assert _fields(back) == {**_fields(op), "_owner": None, "_future": None}


# -- the same probe on both implementations, in one run --------------------------------------------

PROBE = textwrap.dedent(
    """
    import copy, pickle
    from purgatory import DelayedOperation
    from purgatory.testing import ManualClock
    from purgatory import DelayedOperationPurgatory

    def attempt(what, fn):
        try:
            print(what, "->", repr(fn()))
        except Exception as exc:
            print(what, "->", type(exc).__name__, exc)

    def body(**extra):
        return {"try_complete": lambda self: False, "on_complete": lambda self: "done", **extra}

    for field in ("_result", "_future", "_state", "_timeout", "_owner", "_listed"):
        attempt(f"shadow {field}", lambda: type("C", (DelayedOperation,), body(**{field: 0})))
        attempt(f"slot {field}", lambda: type("C", (DelayedOperation,), body(__slots__=(field,))))

    calls = []
    class S(DelayedOperation):
        __slots__ = ("ready",)
        def __init__(self, t):
            super().__init__(t)
            self.ready = False
        @staticmethod
        def try_complete():
            calls.append("try"); return False
        @staticmethod
        def on_complete():
            calls.append("complete"); return "s"
        @staticmethod
        def on_expiration():
            calls.append("expire")

    clock = ManualClock()
    p = DelayedOperationPurgatory("probe", clock=clock)
    for i in range(3):
        op = S(1.0)
        attempt("watch", lambda: p.try_complete_else_watch(op, ["k"]))
        attempt("trigger", lambda: p.check_and_complete("k"))
        attempt("force", op.force_complete)
        attempt("state", lambda: (op.is_completed, op.is_expired, op._result))
    print(calls)

    class F(DelayedOperation):
        def __init__(self, t):
            super().__init__(t)
            self.ready = False
        def try_complete(self):
            return self.force_complete() if self.ready else False
        def on_complete(self):
            return "f"

    def fields(o):
        found = {}
        for n in ("_state", "_timeout", "_owner", "_bucket", "_future", "_result", "_keys",
                  "_listed", "_marks", "_deadline", "ready"):
            try:
                found[n] = getattr(o, n)
            except AttributeError:
                found[n] = "<unset>"
        return found

    new, pending, done = F(1.0), F(1.0), F(1.0)
    p.try_complete_else_watch(pending, ["k"])
    done.force_complete()
    for name, op in (("new", new), ("pending", pending), ("done", done)):
        for how in (copy.copy, copy.deepcopy):
            attempt(f"{how.__name__} {name}", lambda: fields(how(op)))
        attempt(f"reduce {name}", lambda: op.__reduce_ex__(4)[2])
    """
)


def _run(pure: bool) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PURGATORY_NO_EXTENSIONS"}
    if pure:
        env["PURGATORY_NO_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=True,
    )
    return done.stdout


def test_both_implementations_print_the_same_for_the_probe() -> None:
    native, pure = _run(pure=False), _run(pure=True)
    assert "shadow _result -> TypeError C defines _result," in pure
    assert "force -> True" in pure  # (the probe reached its copies: it ran every part)
    assert "copy pending -> TypeError cannot copy" in pure
    assert native == pure
