"""Both implementations whole in one process: the pure classes (``_Py...``) beside the native ones.

Each core module keeps its pure class under a ``_Py`` name, never patched, and where the core is
built binds the public name to the native class `purgatory._impl.twin` made from it (the same
namespace over the C core, a C body for each hot method). These tests hold the two apart: the
pure classes carry no C and build pure parts; the native classes are the pure namespace over the
C core, their cold methods the very same functions; and a pure purgatory and a native one, each
fed operations of either class, driven side by side through one script, show the same.

Like every core test module this one also runs in the pure world (``[python]``), where there is
one class per name: the checks of the pure classes run there too, those that need the native
classes are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import importlib.util
import pickle
import types
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import pytest

from purgatory import _operation, _purgatory, _purge_rule, _thresholds, _timer, _watchers, _wheel
from purgatory._impl import native, twin
from purgatory.testing import ManualClock, check_invariants

NEEDS_NATIVE = pytest.mark.skipif(
    native is None, reason="the pure modules alone run here: there is no native class to compare"
)

#: Each twinned class: its module, its name, and the methods with a C body on the native build.
TWINS: dict[str, tuple[types.ModuleType, tuple[str, ...]]] = {
    "Bucket": (_wheel, ()),
    "TimingWheel": (
        _wheel,
        ("add", "remove", "advance", "next_deadline", "_push", "_add_level", "_advance_clock"),
    ),
    "SystemTimer": (_timer, ("add", "add_due", "run_pass", "next_pass_tick")),
    "ThresholdWatchers": (_thresholds, ()),  # (its C core has methods of its own, no NativeMethod)
    "WatcherLists": (_watchers, ("register", "trigger", "purge")),
    "PurgeRule": (_purge_rule, ("due",)),
    "DelayedOperationPurgatory": (
        _purgatory,
        ("try_complete_else_watch", "check_and_complete", "_settled"),
    ),
    "DelayedOperation": (_operation, ("__init__", "force_complete")),
}
#: The functions a native class has a copy of, with a ``__class__`` cell of its own (``super()``).
RECELLED = {("Bucket", "__init__"), ("DelayedOperation", "__init_subclass__")}
#: The parts a class builds or calls, each its own implementation's: (pure, native) names.
PARTS: dict[str, dict[str, tuple[Any, Any]]] = {
    "TimingWheel": {"_Bucket": (_wheel, "Bucket")},
    "SystemTimer": {"_Wheel": (_wheel, "TimingWheel")},
    "WatcherLists": {"_Thresholds": (_thresholds, "ThresholdWatchers")},
    "DelayedOperationPurgatory": {
        "_Lists": (_watchers, "WatcherLists"),
        "_Timer": (_timer, "SystemTimer"),
        "_Rule": (_purge_rule, "PurgeRule"),
        "_expire_due": (_operation, "expire_due"),
    },
}


def pure(name: str) -> type:
    module, _ = TWINS[name]
    cls: type = getattr(module, f"_Py{name}")
    return cls


def public(name: str) -> type:
    module, _ = TWINS[name]
    cls: type = getattr(module, name)
    return cls


def extension_types() -> set[int]:
    """The ids of every type the extension defines (none where it is not built): the pure world
    stands beside the one extension module the process loaded, which it does not import."""
    if importlib.util.find_spec("purgatory._native") is None:
        return set()
    module = importlib.import_module("purgatory._native")
    return {id(value) for value in vars(module).values() if isinstance(value, type)}


def is_native_method(value: object) -> bool:
    return type(value).__name__ == "NativeMethod" and id(type(value)) in extension_types()


# -- the pure classes: whole, no C --------------------------------------------------------------


@pytest.mark.parametrize("name", TWINS)
def test_a_pure_class_carries_no_native_code(name: str) -> None:
    cls = pure(name)
    assert cls.__name__ == name  # (CPython's `_PyFuture = Future`: the class keeps its name)
    c_types = extension_types()
    for base in cls.__mro__:
        assert id(base) not in c_types, f"{base!r} of the extension in {name}'s MRO"
        methods = [key for key, value in vars(base).items() if is_native_method(value)]
        assert not methods, f"{base.__qualname__} has native methods {methods}"


def test_a_pure_purgatory_builds_pure_parts() -> None:
    """Its lists, timer, wheel, buckets, rule, threshold watchers and expiry loop are the pure
    ones, whatever build the process runs."""
    clock = ManualClock()
    p = _purgatory._PyDelayedOperationPurgatory[Any]("pure", clock=clock)
    a, b = PureKeyOp("a", 30.0), PureKeyOp("b", 30.0)
    p.try_complete_else_watch(a, {"k": 1, "j": None})
    p.try_complete_else_watch(b, {"k": 2})  # two watchers at thresholds: a ThresholdWatchers
    assert type(p._lists) is _watchers._PyWatcherLists
    assert type(p._lists._lists["k"]) is _thresholds._PyThresholdWatchers
    assert type(p._timer) is _timer._PySystemTimer
    assert type(p._timer.wheel) is _wheel._PyTimingWheel
    assert {type(bucket) for bucket in p._timer.wheel.buckets()} == {_wheel._PyBucket}
    assert type(p._rule) is _purge_rule._PyPurgeRule
    expire: Any = p._timer._expire  # (the purgatory's partial)
    assert expire.func is _operation.expire_due
    check_invariants(p)
    asyncio.run(p.shutdown())
    assert p._timer.wheel.__class__ is _wheel._PyTimingWheel  # (the fresh wheel of its close)


# -- the native classes: the pure namespace over the C core -----------------------------------


@NEEDS_NATIVE
@pytest.mark.parametrize("name", TWINS)
def test_a_native_class_is_the_pure_namespace_over_its_c_core(name: str) -> None:
    cls, reference = public(name), pure(name)
    _, hot = TWINS[name]
    assert cls is not reference
    core = cls.__mro__[1]
    assert id(core) in extension_types(), f"{name}'s first base {core!r} is not a C core"
    assert reference.__mro__[1] not in cls.__mro__  # the pure core replaced
    assert (cls.__qualname__, cls.__doc__) == (reference.__qualname__, reference.__doc__)
    assert getattr(cls, "__final__", False) == getattr(reference, "__final__", False)
    assert cls.__dict__["__slots__"] == ()
    native_methods = {key for key, value in vars(cls).items() if is_native_method(value)}
    assert native_methods == set(hot)
    for key in hot:  # each C body in front of the reference's own function
        assert vars(cls)[key].__wrapped__ is vars(reference)[key]
    for key, (module, part) in PARTS.get(name, {}).items():
        native_part = "native_expire_due" if part == "expire_due" else part
        pure_part = part if part == "expire_due" else f"_Py{part}"
        assert getattr(reference, key) is getattr(module, pure_part)
        assert getattr(cls, key) is getattr(module, native_part)
    for key, value in vars(reference).items():
        function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
        if not isinstance(function, types.FunctionType) or key in hot or key in PARTS.get(name, {}):
            continue
        if key in vars(core):  # the C core's own (ThresholdWatchers' queue methods)
            assert vars(cls).get(key) is None
            continue
        copied = vars(cls)[key]
        copied = copied.__func__ if isinstance(copied, classmethod | staticmethod) else copied
        if (name, key) in RECELLED:
            assert copied is not function
            assert copied.__code__ is function.__code__
            assert copied.__closure__ is not None
            cell = copied.__closure__[copied.__code__.co_freevars.index("__class__")]
            assert cell.cell_contents is cls
        else:
            assert copied is function, f"{name}.{key} is not the reference's function"


@NEEDS_NATIVE
def test_super_in_the_copied_methods_resolves_on_the_native_class() -> None:
    """``DelayedOperation.__init_subclass__`` and ``Bucket.__init__`` use ``super()``: their
    copies run on the native classes, their originals on the pure ones."""
    assert NativeKeyOp.__mro__[2:4] == (_operation.DelayedOperation, native.OperationCore)
    assert PureKeyOp.__mro__[2:4] == (_operation._PyDelayedOperation, _operation._OperationCore)
    assert PureKeyOp._is_async is False  # (the original's)
    assert NativeKeyOp._is_async is False  # (set by the copied __init_subclass__)
    with pytest.raises(TypeError, match="_state"):

        class Shadowing(_operation.DelayedOperation[None]):
            _state = 0

    wheel = _wheel.TimingWheel(8)
    bucket = _wheel.Bucket(wheel, 3)
    assert (type(bucket), bucket.level, bucket.wheel, len(bucket)) == (_wheel.Bucket, 3, wheel, 0)
    pure_bucket = _wheel._PyBucket(_wheel._PyTimingWheel(8), 3)
    assert isinstance(pure_bucket, dict)
    assert not isinstance(bucket, dict)


@pytest.mark.parametrize("base", ["DelayedOperation", "_PyDelayedOperation"])
def test_a_field_shadowed_is_refused_on_either_class(base: str) -> None:
    cls = getattr(_operation, base)
    with pytest.raises(TypeError, match="_result"):
        types.new_class("Shadowing", (cls,), exec_body=lambda ns: ns.update(_result=None))


def test_twin_refuses_what_it_cannot_copy() -> None:
    """A class attribute of an unknown kind is refused, not shared by accident; so are a hot
    name without a function and a class whose first base is not a pure core."""
    if native is None:
        pytest.skip("the pure modules alone run here: twin needs the extension")

    class Core:
        __slots__ = ("x",)

    class Odd(Core):
        __slots__ = ()
        strange = object()

    with pytest.raises(TypeError, match="cannot copy strange"):
        twin(Odd, native.RuleCore)
    del Odd.strange
    with pytest.raises(TypeError, match="missing is not a function of its own"):
        twin(Odd, native.RuleCore, hot=("missing",))
    with pytest.raises(TypeError, match="is not a pure core"):
        twin(_purge_rule.PurgeRule, native.RuleCore)  # (the native class: its base is the C core)


# -- side by side: the same script on every pairing of purgatory and operation classes --------


class KeyOp:
    """A mixin of the script's operations: completes once `ready`; records its callbacks."""

    name: str
    ready: bool
    calls: list[str]

    def setup(self, name: str) -> None:
        self.name = name
        self.ready = False
        self.calls = []

    def try_complete(self) -> bool:
        self.calls.append("try")
        return self.force_complete() if self.ready else False  # type: ignore[attr-defined]

    def on_complete(self) -> str:
        self.calls.append("complete")
        return f"{self.name}: {'expired' if self.is_expired else 'done'}"  # type: ignore[attr-defined]

    def on_expiration(self) -> None:
        self.calls.append("expire")


class NativeKeyOp(KeyOp, _operation.DelayedOperation[str]):
    """The script's operation on the public class (the native one where the core is built)."""

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(timeout)
        self.setup(name)


class PureKeyOp(KeyOp, _operation._PyDelayedOperation[str]):
    """The script's operation on the pure class."""

    def __init__(self, name: str, timeout: float) -> None:
        super().__init__(timeout)
        self.setup(name)


class Log:
    """An event log (the `purgatory.EventLog` protocol) keeping its records, operations named."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def record_watch(  # noqa: PLR0917 - the protocol's signature
        self,
        purgatory: str,
        op: Any,
        keys: tuple[Hashable, ...],
        thresholds: tuple[Any, ...] | None,
        watched_at: float,
        deadline: float,
    ) -> None:
        self.records.append(("watch", purgatory, op.name, keys, thresholds, watched_at, deadline))

    def record_end(self, purgatory: str, op: Any, outcome: str, ended_at: float) -> None:
        self.records.append(("end", purgatory, op.name, outcome, ended_at))

    def flush(self) -> None:
        self.records.append(("flush",))


async def outcome_of(op: Any) -> str:
    try:
        return str(await op)
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return f"{type(exc).__name__}: {exc}"


def script(purgatory_class: type, op_class: Callable[[str, float], Any]) -> list[Any]:
    """Watch, trigger, force, expire, cancel, purge, drain and shut down a purgatory of
    `purgatory_class` with operations of `op_class`, each on a plain key and a threshold key;
    everything observed, in order."""
    clock = ManualClock()
    log = Log()
    p = purgatory_class("twins", clock=clock, purge_interval=2, event_log=log)
    seen: list[Any] = []

    def step(what: str, result: object) -> None:
        check_invariants(p)
        seen.append((what, result, p.statistics(), p.watched(), p.num_delayed(), repr(p)))

    ops = [op_class(f"o{i}", 0.5 if i % 3 == 0 else 30.0) for i in range(12)]
    for i, op in enumerate(ops):
        step(f"watch {op.name}", p.try_complete_else_watch(op, {f"k{i % 3}": None, "t": 10 * i}))
    ready = op_class("ready", 1.0)
    ready.ready = True
    step("watch ready", p.try_complete_else_watch(ready, ["k0", "k1"], threshold=5))
    ops[1].ready = ops[4].ready = True
    step("trigger k1", p.check_and_complete("k1"))
    ops[2].ready = ops[5].ready = ops[8].ready = True
    step("trigger t at 25", p.check_and_complete("t", 25))
    step("trigger t at 80", p.check_and_complete("t", 80))
    step("force o7", (ops[7].force_complete(), ops[7].force_complete()))
    step("cancel k2", [op.name for op in p.cancel_for_key("k2")])
    step("expire", clock.advance(0.5))
    step("purge", p.purge())
    late = [op_class(f"late{i}", 60.0) for i in range(4)]
    for i, op in enumerate(late):
        step(f"watch {op.name}", p.try_complete_else_watch(op, {"k9": None, "t": 100 + i}))

    def answer(op: Any) -> None:
        if op.name == "late1":
            op.force_complete()

    step("drain", p.drain(answer))
    after = op_class("after", 60.0)
    step("watch while draining", p.try_complete_else_watch(after, {"k9": None, "t": 200}))
    step("pass", clock.advance(0.001))
    unfinished = op_class("unfinished", 60.0)
    step("watch unfinished", p.try_complete_else_watch(unfinished, ["k10"]))
    asyncio.run(p.shutdown())
    step("shutdown", p.closed)
    every = [*ops, ready, *late, after, unfinished]
    states = [repr(op).split(" ", 1)[1] for op in every]  # (its class named first)
    seen.append(
        [
            (op.name, state, op.calls, asyncio.run(outcome_of(op)))
            for op, state in zip(every, states, strict=True)
        ]
    )
    seen.append(log.records)
    return seen


PURGATORIES = {"native": "DelayedOperationPurgatory", "pure": "_PyDelayedOperationPurgatory"}
OPERATIONS = {"native": NativeKeyOp, "pure": PureKeyOp}


@pytest.mark.parametrize("ops", ["pure", "native"])
@pytest.mark.parametrize("purgatory", ["pure", "native"])
def test_every_pairing_shows_what_the_pure_pair_shows(purgatory: str, ops: str) -> None:
    """A pure purgatory and a native one, each with pure or native operations (the C reads an
    operation that is not its own through its attributes, or hands it to the reference: rule
    3 of purgatory/_csrc/README.md), give the same outcomes, counts, callbacks and records."""
    if native is None and "native" in (purgatory, ops):
        pytest.skip("the pure modules alone run here: there is no native class to pair")
    reference = script(_purgatory._PyDelayedOperationPurgatory, PureKeyOp)
    observed = script(getattr(_purgatory, PURGATORIES[purgatory]), OPERATIONS[ops])
    assert len(observed) == len(reference)
    for got, expected in zip(observed, reference, strict=True):
        assert got == expected


def test_the_script_sees_what_it_should() -> None:
    """The script is not vacuous: it completes, expires, cancels, drains and refuses nothing."""
    seen = script(_purgatory._PyDelayedOperationPurgatory, PureKeyOp)
    stats = seen[-3][2]
    assert (stats.completed, stats.expired, stats.drained, stats.cancelled) == (8, 4, 5, 2)
    assert stats.purges >= 2
    outcomes = {name: outcome for name, _, _, outcome in seen[-2]}
    assert (outcomes["o1"], outcomes["o3"], outcomes["o10"]) == (
        "o1: done",
        "o3: expired",
        "o10: expired",
    )
    assert outcomes["o11"] == "OperationCancelled: the operation was cancelled"
    assert outcomes["unfinished"].startswith("PurgatoryClosed")
    assert {record[0] for record in seen[-1]} == {"watch", "end", "flush"}


# -- copies ------------------------------------------------------------------------------------


def copies(op: Any) -> Iterator[Any]:
    yield copy.copy(op)
    yield copy.deepcopy(op)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        yield pickle.loads(pickle.dumps(op, protocol))


@pytest.mark.parametrize("cls", [NativeKeyOp, PureKeyOp])
def test_operations_of_both_classes_copy_and_pickle(cls: type[Any]) -> None:
    fresh = cls("fresh", 2.5)
    for twin_op in copies(fresh):
        assert type(twin_op) is cls
        assert (twin_op.name, twin_op.timeout, twin_op.is_completed) == ("fresh", 2.5, False)
    clock = ManualClock()
    p = _purgatory.DelayedOperationPurgatory[Any]("copies", clock=clock)
    done = cls("done", 1.0)
    p.try_complete_else_watch(done, ["k"])
    with pytest.raises(TypeError, match="cannot copy"):
        copy.copy(done)
    done.ready = True
    p.check_and_complete("k")
    for twin_op in copies(done):
        assert (type(twin_op), twin_op.is_completed, twin_op.calls) == (cls, True, done.calls)
        assert twin_op._owner is None
        assert asyncio.run(outcome_of(twin_op)) == "done: done"
