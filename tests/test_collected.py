"""Each core object cleared by a collection, then used: an error, never a crash (issue 33).

A collection breaks a cycle by clearing its objects' fields one after the other (tp_clear), and
a release may run code (a ``__del__``) that calls a method of the object being cleared, with
some of its fields gone. Once the object is cleared, that code may also have kept it. The
native core keeps a flag per object saying its fields were checked (a core's ``ready``, an
operation's set-up bits, the threshold watchers' ``at``); its tp_clear resets the flag first and
again before each release, so that a method finds the object not set up and takes the
reference's path, which finds the fields unset (an ``AttributeError``, as for a pure object
whose slots the collection cleared) or a ``TypeError``. A bucket has no such flag: its methods
read every field it clears as possibly unset.

The code is run by `_Reaching.__del__`: an object in an older generation than the cycle, held
by one field of the object only, so released in the middle of the object's clear (the field's
release), which reaches the object by its address (the collection has cleared the weak
references to it by then) and keeps it. Run these under AddressSanitizer (``make sanitize``)
or ``PYTHONMALLOC=debug`` to turn a read of a freed or unset field into a crash.

No call reached that way stores an attribute in the instance ``__dict__`` of a Python class
(``FlagOperation.__init__`` does: ``self.name = ...``): on CPython 3.11 that corrupts memory
whatever the class, with or without this package (the object reached is alive: the collection
and the released container still hold it). ``subtype_clear`` clears such an instance's
attribute values (``_PyObject_ClearInstanceAttributes``) but not the byte array keeping their
insertion order, in front of the values, so each attribute stored again afterwards is appended
to that array a second time; once the class has made a couple of dozen instances (each one
shrinks the values array of the next, down to the attributes the class uses), the array has no
room left and the store writes the bytes before the block. ``PYTHONMALLOC=debug`` reports it
when the block is freed, a debug interpreter's assertion as it is written; AddressSanitizer does
not see it (the interpreter, which writes it, is not instrumented). Only ``ctypes`` reaches an
instance in or after its clear: the collection has cleared the weak references to it, it is in
no generation that ``gc.get_objects`` or ``gc.get_referrers`` reads, and what a ``__del__`` run
by a release in the clear can reach is not garbage. So ``__init__`` during a collection is
tested where user code can run it: in a finaliser of the operation's own cycle, which runs
before anything is cleared (test_an_operation_reinitialised_by_a_finaliser_of_its_cycle).
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import FlagOperation, manual_purgatory

from purgatory._purge_rule import PurgeRule
from purgatory._thresholds import ThresholdWatchers
from purgatory._timer import SystemTimer
from purgatory._watchers import WatcherLists
from purgatory._wheel import Bucket, TimingWheel

Calls = list[tuple[str, Callable[[Any], object]]]
Outcome = tuple[str, str]


class _Reaching:
    """Reaches the object at `address` as it is released (`calls` on it, their outcomes kept)."""

    def __init__(self, address: int, calls: Calls, kept: list[Any], outcomes: list[Outcome]):
        self.address = address
        self.calls = calls
        self.kept = kept
        self.outcomes = outcomes

    def __del__(self) -> None:
        obj = ctypes.cast(self.address, ctypes.py_object).value
        self.kept.append(obj)
        self.outcomes.extend(_run(obj, self.calls))


def _run(obj: Any, calls: Calls) -> Iterator[Outcome]:
    for name, call in calls:
        try:
            call(obj)
        except Exception as exc:  # noqa: BLE001 - the outcome is the point
            yield name, type(exc).__name__
        else:
            yield name, "returned"


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _collect_while_reached(
    make: Callable[[], Any], hold: Callable[[Any, Any], None], calls: Calls
) -> tuple[list[Outcome], list[Outcome]]:
    """Make an object in use (`make`: a C method ran, so its fields were checked), give one
    of its fields (`hold`) a container holding the object itself (a cycle) and a `_Reaching` of
    an older generation; collect the young generation: the calls run as that field is released,
    and again on the cleared object kept. The outcomes: while being cleared, and after."""
    kept: list[Any] = []
    during: list[Outcome] = []
    reaching = _Reaching(0, calls, kept, during)
    gc.collect()  # `reaching` into the oldest generation: not collected with the cycle
    obj = make()
    reaching.address = id(obj)
    hold(obj, reaching)
    del obj, reaching
    gc.collect(0)
    assert len(kept) == 1, "the release did not run in the collection"
    after = list(_run(kept[0], calls))
    kept.clear()
    return during, after


def _check(during: list[Outcome], after: list[Outcome], calls: Calls) -> None:
    """Every call ran at both times and returned or raised an `Exception` (the test would not
    get here after a crash)."""
    names = [name for name, _ in calls]
    assert [name for name, _ in during] == names
    assert [name for name, _ in after] == names


# -- one test per type ------------------------------------------------------------------------


def test_an_operation_cleared_by_a_collection(no_automatic_collection: None) -> None:
    _clock, p = manual_purgatory()
    calls: Calls = [
        ("force_complete", lambda op: op.force_complete()),
        ("is_completed", lambda op: op.is_completed),
        ("_state", lambda op: op._state),
        ("_listed", lambda op: op._listed),
        ("watch", lambda op: p.try_complete_else_watch(op, ["k"])),
        # (no __init__: it stores attributes in the instance __dict__; see the module docstring)
    ]

    def hold(op: FlagOperation, reaching: _Reaching) -> None:
        op._result = [op, reaching]  # (the last field cleared)

    during, after = _collect_while_reached(lambda: FlagOperation(10.0), hold, calls)
    _check(during, after, calls)
    # cleared: every field unset (a pure operation's slots), so not set up; never watched
    assert dict(after)["force_complete"] == "AttributeError"
    assert dict(after)["_state"] == "AttributeError"
    assert dict(after)["watch"] != "returned"
    assert p.watched() == 0


class _Finaliser:
    """Holds an operation that holds it (a cycle): its ``__del__`` runs `calls` on the
    operation as the collection finalises the cycle (PEP 442), before it clears any of it, and
    keeps the operation in `kept` if told to (a resurrection: the collection then frees none of
    the cycle)."""

    def __init__(self, op: FlagOperation, calls: Calls, keep: bool, kept: list[Any]) -> None:
        self.op = op
        self.calls = calls
        self.keep = keep
        self.kept = kept
        self.outcomes: list[Outcome] = []

    def __del__(self) -> None:
        self.outcomes.extend(_run(self.op, self.calls))
        if self.keep:
            self.kept.append(self.op)


@pytest.mark.parametrize("keep", [False, True], ids=["freed", "kept"])
def test_an_operation_reinitialised_by_a_finaliser_of_its_cycle(
    no_automatic_collection: None, keep: bool
) -> None:
    """``__init__`` run on an operation during its collection, the way user code can: from the
    ``__del__`` of an object of its garbage cycle that holds it. The collection finalises the
    cycle before it clears any of it, so the operation is whole and is set up again (a timeout
    of 1 s for its 10). Dropped by the finaliser, it is then cleared and freed; kept (and
    watched) by it, nothing of the cycle is cleared, and it works as any operation does."""
    clock, p = manual_purgatory()
    # Each instance a class makes shrinks the attribute values array of the next (CPython
    # 3.11), down to the attributes the class uses: a store of an attribute after the clear of
    # those values would write before the array (see the module docstring), which
    # PYTHONMALLOC=debug reports. Made here so that the operation below has such an array
    # whatever ran before in this process.
    made = [FlagOperation(10.0) for _ in range(32)]
    del made
    calls: Calls = [("__init__", lambda op: FlagOperation.__init__(op, 1.0, "reinitialised"))]
    if keep:
        calls.append(("watch", lambda op: p.try_complete_else_watch(op, ["k"])))
    kept: list[Any] = []
    op = FlagOperation(10.0)
    finaliser = _Finaliser(op, calls, keep, kept)
    op._result = [finaliser]
    outcomes = finaliser.outcomes
    del op, finaliser

    gc.collect()
    assert outcomes == [(name, "returned") for name, _ in calls]
    if not keep:
        assert not any(
            isinstance(obj, FlagOperation) and obj.name == "reinitialised"
            for obj in gc.get_objects()
        ), "the operation outlived its collection"
        assert (p.watched(), p.num_delayed()) == (0, 0)
        return
    [op] = kept
    assert (op.name, op.is_completed, p.watched(), p.num_delayed()) == (
        "reinitialised",
        False,
        1,
        1,
    )
    clock.advance(0.5)
    assert not op.is_completed
    clock.advance(0.5)  # its new timeout
    assert (op.is_completed, op.calls, p.num_delayed()) == (True, ["complete", "expire"], 0)
    assert p.purge() == 1


def test_watcher_lists_cleared_by_a_collection(no_automatic_collection: None) -> None:
    op = FlagOperation(10.0)
    calls: Calls = [
        ("register", lambda lists: lists.register(op, ("k",), None)),
        ("trigger", lambda lists: lists.trigger("k", None, lambda _op: None)),
        ("purge", lambda lists: lists.purge(None)),
        ("len", len),
    ]

    def hold(lists: WatcherLists[Any], reaching: _Reaching) -> None:
        lists._lists.update(me=lists, reaching=reaching)  # (the first field cleared)

    def make() -> WatcherLists[Any]:
        lists: WatcherLists[Any] = WatcherLists()
        lists.register(FlagOperation(10.0), ("other",), None)  # (in use: its fields checked)
        return lists

    during, after = _collect_while_reached(make, hold, calls)
    _check(during, after, calls)
    assert set(dict(during).values()) == {"AttributeError"}
    assert set(dict(after).values()) == {"AttributeError"}


def test_threshold_watchers_cleared_by_a_collection(no_automatic_collection: None) -> None:
    op, other = FlagOperation(10.0), FlagOperation(10.0)
    calls: Calls = [
        ("add", lambda t: t.add(op, 5)),
        ("release", lambda t: t.release(7, WatcherLists())),
        ("pop", lambda t: t.pop(other, None, "k")),
        ("holds", lambda t: t.holds(other, "k")),
        ("len", len),
        ("iter", list),
        ("compact", lambda t: t.compact()),
        ("clear", lambda t: t.clear()),
    ]

    def make() -> ThresholdWatchers[Any]:
        watchers: ThresholdWatchers[Any] = ThresholdWatchers({})
        watchers.add(other, 3)
        return watchers

    def hold(watchers: ThresholdWatchers[Any], reaching: _Reaching) -> None:
        watchers.plain.update({watchers: None, reaching: None})  # (cleared after `at`)

    during, after = _collect_while_reached(make, hold, calls)
    _check(during, after, calls)
    assert "returned" not in dict(during).values()


def test_a_purge_rule_cleared_by_a_collection(no_automatic_collection: None) -> None:
    _clock, p = manual_purgatory()
    calls: Calls = [("due", lambda rule: rule.due())]

    def make() -> PurgeRule:
        rule = PurgeRule(WatcherLists(), 1000, p._timer, bounded=True)
        assert not rule.due()  # (in use: its fields checked; it scheduled the time bound)
        rule._armed = True  # (its `due` schedules through the timer)
        return rule

    def hold(rule: PurgeRule, reaching: _Reaching) -> None:
        rule._idle_at = [rule, reaching]  # type: ignore[assignment] # (the last field cleared)
        rule._armed = False
        assert not rule.due()  # (the assignment made it check its fields again: done here)
        rule._armed = True

    during, after = _collect_while_reached(make, hold, calls)
    _check(during, after, calls)
    assert dict(during) == {"due": "AttributeError"}  # (its timer is gone)


def test_a_timer_cleared_by_a_collection(no_automatic_collection: None) -> None:
    op = FlagOperation(10.0)
    op._deadline = 0
    due = FlagOperation(0.0)
    calls: Calls = [
        ("add", lambda timer: timer.add(op)),
        ("add_due", lambda timer: timer.add_due(due)),
        ("run_pass", lambda timer: timer.run_pass(0.5, 10)),
        ("next_pass_tick", lambda timer: timer.next_pass_tick()),
        ("discard", lambda timer: timer.discard(op)),
    ]

    def make() -> SystemTimer[Any]:
        timer: SystemTimer[Any] = SystemTimer(
            0.001, 16, lambda: 0.0, lambda *args: 0, lambda *args: False
        )
        timer.add(FlagOperation(10.0))  # (in use: its fields checked)
        return timer

    def hold(timer: SystemTimer[Any], reaching: _Reaching) -> None:
        timer._in_flight.append([timer, reaching])  # (cleared fifth)

    during, after = _collect_while_reached(make, hold, calls)
    _check(during, after, calls)
    assert dict(during)["add"] == dict(after)["add"] == "AttributeError"
    assert dict(during)["run_pass"] == dict(after)["run_pass"] == "AttributeError"


def test_a_purgatory_cleared_by_a_collection(no_automatic_collection: None) -> None:
    op = FlagOperation(10.0)
    calls: Calls = [
        ("watch", lambda p: p.try_complete_else_watch(op, ["k"])),
        ("check_and_complete", lambda p: p.check_and_complete("k")),
        ("check_at", lambda p: p.check_and_complete("k", 5)),
        ("_settled", lambda p: p._settled(op, "completed")),
        ("purge", lambda p: p.purge()),
        ("statistics", lambda p: p.statistics()),
    ]

    def make() -> Any:
        _clock, p = manual_purgatory()
        assert not p.try_complete_else_watch(FlagOperation(10.0), ["other"])
        return p

    def hold(p: Any, reaching: _Reaching) -> None:
        p._sync_types.update({p, reaching})  # (cleared tenth)

    during, after = _collect_while_reached(make, hold, calls)
    _check(during, after, calls)
    assert "returned" not in dict(during).values()
    assert "returned" not in dict(after).values()
    assert op._owner is None


def test_a_bucket_cleared_by_a_collection(no_automatic_collection: None) -> None:
    """A bucket has no flag: its methods read its fields as possibly unset, and a cleared one
    works as an empty bucket (its entries were released) that still takes entries."""
    wheel = TimingWheel(4, start_tick=0)
    added = FlagOperation(10.0)
    calls: Calls = [
        ("take", lambda b: b.__setitem__(id(added), added)),
        ("len", len),
        ("iter", list),
        ("values", lambda b: b.values()),
        ("remove", lambda b: b.remove(added)),
        ("older", lambda b: b.older),
        ("clear", lambda b: b.clear()),
    ]

    def make() -> Bucket:
        bucket = Bucket(wheel, 0)
        entry = FlagOperation(10.0)
        bucket[id(entry)] = entry
        entry._bucket = bucket
        return bucket

    def hold(bucket: Bucket, reaching: _Reaching) -> None:
        bucket.wheel = [bucket, reaching]  # type: ignore[misc,assignment] # (cleared second)

    during, after = _collect_while_reached(make, hold, calls)
    _check(during, after, calls)
    assert added._bucket is None


def test_a_timing_wheel_cleared_by_a_collection(no_automatic_collection: None) -> None:
    entry = FlagOperation(10.0)
    calls: Calls = [
        ("add", lambda w: w.add(entry, 9)),
        ("advance", lambda w: w.advance(3)),
        ("next_deadline", lambda w: w.next_deadline()),
        ("remove", lambda w: w.remove(entry)),
        ("len", len),
    ]

    def make() -> TimingWheel:
        wheel = TimingWheel(4, start_tick=0)
        wheel.add(FlagOperation(10.0), 2)
        return wheel

    def hold(wheel: TimingWheel, reaching: _Reaching) -> None:
        wheel._todo.extend([wheel, reaching])  # (cleared fifth)

    during, after = _collect_while_reached(make, hold, calls)
    _check(during, after, calls)
    assert dict(during)["add"] == dict(after)["add"] == "AttributeError"
    assert dict(during)["advance"] == dict(after)["advance"] == "AttributeError"
