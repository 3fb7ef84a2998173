"""The native core as a module (PEP 489 multi-phase init, PEP 630 heap types, a module state).

Each module object has its own state and its own types; a C body reads the state of the module
that made its method, and runs only once that module has pulled the reference's helpers from its
own package (the facade no longer pushes them). These hold on the native build only: the
``[python]`` copy of this module has no extension to look at.
"""

from __future__ import annotations

import gc
import importlib.util
import re
import weakref
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import purgatory
from purgatory import DelayedOperation
from purgatory._impl import native

pytestmark = pytest.mark.skipif(
    purgatory.IMPLEMENTATION != "native", reason="the native core's module: not in the pure build"
)

CSRC = Path(__file__).resolve().parents[1] / "purgatory" / "_csrc"  # the checkout's sources
HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE
CORES = (
    "OperationCore",
    "BucketCore",
    "WheelCore",
    "TimerCore",
    "ThresholdCore",
    "ListsCore",
    "RuleCore",
    "PurgatoryCore",
    "NativeMethod",
)


def a_second_instance() -> ModuleType:
    """A second module object of the same extension, as a sub-interpreter's import makes one
    (a multi-phase module is not cached per process: each spec's exec makes a fresh state)."""
    spec = importlib.util.find_spec("purgatory._native")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_types_are_heap_types_immutable_as_the_static_ones_were() -> None:
    for name in CORES:
        core = getattr(native, name)
        assert core.__flags__ & HEAPTYPE, name
        with pytest.raises(TypeError):
            core.anything = 1  # as on a static type
    assert native.OperationCore.__module__ == "purgatory._operation"
    assert "__new__" not in vars(native.OperationCore)
    with pytest.raises(TypeError):
        native.NativeMethod()  # only `install` and `function` make one


def test_the_facade_pushes_nothing_into_the_core() -> None:
    """The helpers are pulled by the C (`native_pull_helpers`); `bind` is gone."""
    assert not hasattr(native, "bind")


def test_each_module_object_has_its_own_types_and_state() -> None:
    other = a_second_instance()
    for name in CORES:
        assert getattr(other, name) is not getattr(native, name), name
    assert not issubclass(DelayedOperation, other.OperationCore)


def test_a_c_body_runs_only_for_the_packages_own_module() -> None:
    """The package's module pulled its helpers at its first C call and runs its C bodies; a
    second instance, which is not the package's ``_impl.native``, never pulls and always runs the
    reference (and so never mixes another module's types or helpers into its state)."""
    calls: list[Any] = []

    def reference(due: list[Any], now: Any, outcome: str = "expired", **kw: Any) -> int:
        calls.append(due)
        return -1

    ours = native.function(reference, "_operation.expire_due")
    assert ours([], 0, purge_queue={}, ended=None) == 0  # the C body: nothing due, none expired
    assert calls == []
    theirs = a_second_instance().function(reference, "_operation.expire_due")
    assert theirs([], 0, purge_queue={}, ended=None) == -1
    assert len(calls) == 1


class _Watcher:
    """A threshold watcher that is not an operation: its state and marks read as attributes."""

    __slots__ = ("_marks", "_state")

    def __init__(self, threshold: int) -> None:
        self._marks = threshold
        self._state = 0


class _Lists:
    """What `release` calls on the lists for a watcher already finished (none here)."""

    def left(self, op: Any) -> None:
        raise AssertionError("no watcher finished")


def test_the_threshold_types_methods_read_the_state_of_the_class_that_defines_them() -> None:
    """`ThresholdCore`'s own methods are no NativeMethod: `release` and `pop` reach the module
    state through their defining class (PEP 573), whatever subclass `self` is of. A second
    instance's type, whose state never pulled the reference's helpers, works on its own (the
    `threshold_of` of a watcher that is not an operation is then imported by name)."""
    other = a_second_instance()

    class Watchers(other.ThresholdCore):  # type: ignore[misc,name-defined]
        __slots__ = ()

    watchers = Watchers({})
    members = [_Watcher(threshold) for threshold in (3, 1, 2)]
    for member in members:
        assert watchers.add(member, member._marks)
    assert watchers.pop(members[0], default="missing", key="k") is None
    assert watchers.pop(members[0], "missing", "k") == "missing"
    watchers.release(5, _Lists())
    assert list(watchers.plain) == [members[1], members[2]]  # in threshold order
    assert (watchers.at, list(watchers.run), watchers.heap) == ({}, [], [])


def test_the_wheels_queue_setter_checks_buckets_of_its_own_module() -> None:
    """The `_heap` setter runs outside any C body: it finds its module's state through the type's
    MRO (a subclass's, here a second instance's), so a bucket of another module's type is
    refused as anything else that is not a bucket is."""
    other = a_second_instance()

    class Wheel(other.WheelCore):  # type: ignore[misc,name-defined]
        __slots__ = ()

    wheel = Wheel()
    ours = other.BucketCore()
    wheel._heap = [(0, 0, 0, ours)]
    assert wheel._heap == [(0, 0, 0, ours)]
    with pytest.raises(TypeError):
        wheel._heap = [(0, 0, 0, native.BucketCore())]
    assert wheel._heap == [(0, 0, 0, ours)]  # unchanged


def test_a_dropped_module_object_is_collected_with_its_types() -> None:
    """The module's traverse and clear cover its state: the cycle module -> state -> types ->
    module (each heap type keeps its module) is collected once nothing else holds it."""
    other = a_second_instance()
    core = weakref.ref(other.OperationCore)
    dropped = weakref.ref(other)
    del other
    gc.collect()
    assert dropped() is None
    assert core() is None


def test_the_c_has_no_static_type_and_no_private_api() -> None:
    """Heap types only, and CPython's public API only (a private name such as ``_PyDict_Pop`` may
    change or go in any release): what a sub-interpreter or a free-threaded build needs first."""
    sources = sorted(CSRC.glob("*.[ch]"))
    assert sources
    for source in sources:
        text = source.read_text()
        assert not re.findall(r"static\s+PyTypeObject\s+\w+\s*=", text), source.name
        assert not re.findall(r"\b_Py\w+", text), source.name
