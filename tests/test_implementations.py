"""The two implementations of the core (the native one and the pure-Python reference): which one
runs, that they show users the same API, and what a compiled build broke before (subclasses of
every shape, reference cycles with weak references under the cyclic GC, types and messages).

Like every core test module, this one runs twice in one session (tests/implementations.py): on
the default build, and as ``test_implementations.py[python]`` on the pure modules, imported a
second time with PURGATORY_NO_EXTENSIONS=1; these tests hold on both.
"""

from __future__ import annotations

import abc
import gc
import inspect
import json
import math
import os
import subprocess
import sys
import weakref
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from helpers import FlagOperation, manual_purgatory

import purgatory
from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory._wheel import TimingWheel

ROOT = Path(__file__).resolve().parents[1]
PURE_ONLY = os.environ.get("PURGATORY_NO_EXTENSIONS", "") not in ("", "0")


def run_python(code: str, *, pure: bool) -> str:
    env = dict(os.environ)
    env.pop("PURGATORY_NO_EXTENSIONS", None)
    if pure:
        env["PURGATORY_NO_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True
    )
    return done.stdout


def test_the_expected_implementation_runs() -> None:
    """`make test` says which implementation each run must have: a build that silently fell
    back to the pure modules would otherwise pass as the native one."""
    expected = os.environ.get("PURGATORY_EXPECT_IMPLEMENTATION")
    if expected is None:
        assert purgatory.IMPLEMENTATION in ("native", "python")
    else:
        assert expected == purgatory.IMPLEMENTATION


def test_no_extensions_selects_the_pure_modules() -> None:
    code = (
        "import sys, purgatory\n"
        "print(purgatory.IMPLEMENTATION, 'purgatory._native' in sys.modules)\n"
    )
    assert run_python(code, pure=True).split() == ["python", "False"]


@pytest.mark.skipif(PURE_ONLY, reason="PURGATORY_NO_EXTENSIONS: only the pure modules to show")
def test_help_and_signatures_are_the_same_on_both() -> None:
    """Every public callable's signature and docstring, and help() of every public class."""
    script = str(ROOT / "tests" / "api_surface.py")
    code = f"import runpy; runpy.run_path({script!r}, run_name='__main__')"
    native = json.loads(run_python(code, pure=False))
    pure = json.loads(run_python(code, pure=True))
    assert native["implementation"] == "native", "the native core is not built here"
    assert pure["implementation"] == "python"
    assert native["surface"].keys() == pure["surface"].keys()
    for name, shown in native["surface"].items():
        assert shown == pure["surface"][name], name


def test_native_methods_read_as_their_reference() -> None:
    """An installed method shows its reference's name, docstring and signature, as a decorated
    function does (``__wrapped__``)."""
    method = DelayedOperation.__dict__["force_complete"]
    assert method.__name__ == "force_complete"
    assert method.__qualname__ == "DelayedOperation.force_complete"
    assert method.__module__ == "purgatory"
    assert (method.__doc__ or "").startswith("Complete the operation now")
    assert str(inspect.signature(method)) == "(self) -> 'bool'"
    watch = DelayedOperationPurgatory.try_complete_else_watch
    assert list(inspect.signature(watch).parameters) == ["self", "op", "keys", "threshold"]


# -- subclasses of every shape ---------------------------------------------------------------


class Slotted(DelayedOperation[int]):
    __slots__ = ("__weakref__", "ready")

    def __init__(self, timeout: float) -> None:
        super().__init__(timeout)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> int:
        return 1


class WithDict(DelayedOperation[str]):
    def __init__(self, timeout: float, **extra: Any) -> None:
        super().__init__(timeout=timeout)  # by keyword: the reference's path
        self.__dict__.update(extra)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> str:
        return "dict"


class NoInit(DelayedOperation[None]):
    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> None:
        return None


def test_subclasses_of_every_shape_work() -> None:
    clock, p = manual_purgatory()
    a, b, c = Slotted(1.0), WithDict(1.0, label="x"), NoInit(0.5)
    assert b.label == "x"  # type: ignore[attr-defined]
    assert weakref.ref(a)() is a
    assert weakref.ref(b)() is b
    for op in (a, b, c):
        assert not p.try_complete_else_watch(op, ["k"])
    a.ready = b.ready = True
    assert p.check_and_complete("k") == 2
    clock.advance(0.5)
    assert c.is_expired
    assert (a.is_completed, b.is_completed) == (True, True)


def test_an_abstract_subclass_is_refused_with_the_interpreters_message() -> None:
    class Half(DelayedOperation[None]):
        def on_complete(self) -> None:
            return None

    with pytest.raises(TypeError, match="abstract") as caught:
        Half(1.0)  # type: ignore[abstract]

    # The message is object.__new__'s own, as for any abstract class of this interpreter.
    class Plain(abc.ABC):
        @abc.abstractmethod
        def try_complete(self) -> bool: ...

    with pytest.raises(TypeError) as reference:
        Plain()  # type: ignore[abstract]
    assert str(caught.value) == str(reference.value).replace("Plain", "Half")


def test_a_subclass_method_patched_after_the_watch_is_the_one_called() -> None:
    _, p = manual_purgatory()
    op = Slotted(1.0)
    p.try_complete_else_watch(op, ["k"])
    calls: list[str] = []

    def patched(self: Slotted) -> bool:
        calls.append("patched")
        return self.force_complete()

    Slotted.try_complete = patched  # type: ignore[method-assign]
    try:
        assert p.check_and_complete("k") == 1
    finally:
        del Slotted.try_complete
        Slotted.try_complete = Slotted.__dict__.get("try_complete", _slotted_try)  # type: ignore[method-assign]
    assert calls == ["patched"]


def _slotted_try(self: Slotted) -> bool:
    return self.force_complete() if self.ready else False


def test_generic_subscription_and_isinstance() -> None:
    alias = DelayedOperation[int]
    assert alias.__origin__ is DelayedOperation  # type: ignore[attr-defined]
    assert isinstance(Slotted(1.0), DelayedOperation)
    assert issubclass(Slotted, DelayedOperation)


def test_an_operation_without_super_init_is_named_as_such() -> None:
    class Forgot(DelayedOperation[None]):
        def __init__(self) -> None:
            pass

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            return None

    _, p = manual_purgatory()
    with pytest.raises(TypeError, match=r"super\(\)\.__init__\(timeout\)"):
        p.try_complete_else_watch(Forgot(), ["k"])
    with pytest.raises(AttributeError, match="_state"):
        Forgot()._state  # noqa: B018 - unset, as an unset slot is


# -- reference cycles, weak references and the cyclic GC --------------------------------------


class Cyclic(DelayedOperation[Any]):
    """An operation in cycles of every kind: with itself, its purgatory and another operation."""

    def __init__(self, timeout: float, purgatory: Any) -> None:
        super().__init__(timeout)
        self.me = self
        self.purgatory = purgatory
        self.partner: Cyclic | None = None
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> Any:
        return self  # the result refers back to the operation


def test_cycles_with_weak_references_are_collected() -> None:
    """Operations and purgatories in reference cycles, with weak references (and weak
    callbacks that run during the collection) are all freed, however each operation ended."""
    refs: list[weakref.ref[Any]] = []
    fired: list[int] = []
    # Six rounds: each purge interval (0, 1, 2) once with the rest expiring, once dropped
    # pending. (Each round's full collection walks the worker's whole heap: more rounds repeat
    # a case for a second each.)
    for round_ in range(6):
        clock, p = manual_purgatory(purge_interval=round_ % 3)
        ops = [Cyclic(0.01 * (i % 4), p) for i in range(40)]
        for i, op in enumerate(ops):
            op.partner = ops[i - 1]
            refs.append(weakref.ref(op, partial(lambda n, _: fired.append(n), i)))
            p.try_complete_else_watch(op, [f"k{i % 5}", ("t", i % 3)])
        for op in ops[::3]:
            op.ready = True
        p.check_and_complete("k0")
        for op in ops[1::5]:
            op.force_complete()
        p.cancel_for_key("k1")
        if round_ % 2:
            clock.advance(0.02)  # the rest expires; otherwise they are dropped pending
        refs.append(weakref.ref(p))
        del ops, op, p, clock
        gc.collect()
    for _ in range(3):
        gc.collect()
    assert [ref for ref in refs if ref() is not None] == []
    assert len(fired) == 6 * 40


def test_collections_during_watches_and_expiries_leave_everything_consistent() -> None:
    """The collector runs in the middle of the core's work (thresholds of 1 make it collect at
    almost every allocation)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        clock, p = manual_purgatory(purge_interval=2)
        for i in range(300):
            op = FlagOperation(0.001 * (i % 7))
            p.try_complete_else_watch(op, {f"k{i % 4}": i % 3, "all": None})
            if i % 2:
                op.ready = True
                p.check_and_complete(f"k{i % 4}", i % 5)
            if i % 11 == 0:
                clock.advance(0.003)
        clock.advance(1.0)
        assert p.num_delayed() == 0
    finally:
        gc.set_threshold(*thresholds)


# -- what a compiled build broke before --------------------------------------------------------


@pytest.mark.parametrize("size", [True, 8.0, "8"])
def test_a_wheel_size_that_is_not_an_int_is_refused(size: object) -> None:
    with pytest.raises(TypeError, match="wheel_size must be an int"):
        DelayedOperationPurgatory("p", wheel_size=size)  # type: ignore[arg-type]


def test_next_deadline_is_an_int_tick_or_inf() -> None:
    wheel = TimingWheel(8, 0)
    assert wheel.next_deadline() == math.inf
    entry = FlagOperation(1.0)
    wheel.add(entry, 5)
    deadline = wheel.next_deadline()
    assert type(deadline) is int
    assert deadline == 5


def test_a_trigger_from_another_thread_is_delivered() -> None:
    """check_and_complete_threadsafe from threads while the loop runs (the native trigger runs on
    the loop's thread, as the reference's does)."""
    import asyncio
    import threading

    async def main() -> int:
        async with DelayedOperationPurgatory[FlagOperation]("threads") as p:
            ops = [FlagOperation(30.0) for _ in range(50)]
            waits = [asyncio.ensure_future(p.watch(op, ["k"])) for op in ops]
            await asyncio.sleep(0)
            for op in ops:
                op.ready = True
            threads = [
                threading.Thread(target=p.check_and_complete_threadsafe, args=("k",))
                for _ in range(8)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            results = await asyncio.gather(*waits)
            return len(results)

    assert asyncio.run(main()) == 50


def test_each_world_runs_its_own_core(request: pytest.FixtureRequest) -> None:
    """This module runs twice in one session (tests/implementations.py): its ``[python]`` copy
    must see the pure modules, through its own imports and through a fresh one, and its other
    copy the run's own core; neither may see the other's classes."""
    from implementations import PURE, implementation_of

    import purgatory as imported_now

    world = implementation_of(request.node)
    assert purgatory.IMPLEMENTATION == imported_now.IMPLEMENTATION == world
    assert DelayedOperation is imported_now.DelayedOperation
    assert FlagOperation.__mro__[1] is DelayedOperation
    natively = type(vars(DelayedOperation)["force_complete"]).__name__ != "function"
    assert natively == (world != PURE)
