"""User code that re-enters the purgatory from inside the purgatory's own calls (issue 33).

A key's ``__hash__`` or ``__eq__``, a threshold's comparison, a generator of keys, a ``Mapping``,
an event log, an operation class's ``__hash__``: each runs in the middle of a watch, a trigger or
a timer's add, and may cancel, trigger, complete or shut down. The native core once held
borrowed pointers across such calls (a use after free: run these under ``PYTHONMALLOC=debug``
to see one crash) or took a path the reference does not; the pure modules had two of these bugs
too. Each test drives one such scenario and checks what both builds must agree on: the return
values, the counts, where every operation is, and the purgatory's invariants.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import pytest
from helpers import FlagOperation, manual_purgatory

from purgatory import DelayedOperationPurgatory, PurgatoryClosed
from purgatory._operation import EXPIRED_NOW
from purgatory._timer import SystemTimer
from purgatory.testing import check_invariants


class HostileKey:
    """A key equal to every other `HostileKey` of its name, whose ``__hash__`` or ``__eq__``
    runs `action` once, at its `at`-th call (1: the first)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.action: Callable[[], object] | None = None
        self.on = "eq"
        self.calls = 0
        self.at = 1

    def arm(self, action: Callable[[], object], on: str, at: int = 1) -> None:
        self.action, self.on, self.calls, self.at = action, on, 0, at

    def _maybe(self, on: str) -> None:
        if self.action is not None and self.on == on:
            self.calls += 1
            if self.calls == self.at:
                action, self.action = self.action, None
                action()

    def __hash__(self) -> int:
        self._maybe("hash")
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        self._maybe("eq")
        return isinstance(other, HostileKey) and other.name == self.name

    def __repr__(self) -> str:
        return f"HostileKey({self.name!r})"


class HostileThreshold(int):
    """An int threshold whose ``<=`` and ``<`` run `action` once, when armed."""

    action: Callable[[], object] | None = None

    @classmethod
    def arm(cls, action: Callable[[], object]) -> None:
        cls.action = action

    @classmethod
    def _maybe(cls) -> None:
        action = cls.action
        if action is not None:
            cls.action = None
            action()

    def __le__(self, other: object) -> bool:
        self._maybe()
        return int(self) <= other  # type: ignore[operator]

    def __lt__(self, other: object) -> bool:
        self._maybe()
        return int(self) < other  # type: ignore[operator]

    __hash__ = int.__hash__


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    HostileThreshold.action = None
    yield
    HostileThreshold.action = None


def shut_down(purgatory: DelayedOperationPurgatory[Any]) -> None:
    """`shutdown` run to its end from synchronous code (a driven clock has no reaper to await)."""
    coroutine = purgatory.shutdown()
    with pytest.raises(StopIteration):
        coroutine.send(None)


def counts(purgatory: DelayedOperationPurgatory[Any]) -> tuple[int, int, int, int, int]:
    stats = purgatory.statistics()
    return stats.watched, stats.delayed, stats.keys, stats.completed, stats.cancelled


# -- row 1: a key's __eq__ cancels the key whose lone watcher it is looking at -------------------


def test_key_eq_cancelling_the_key_while_its_released_lone_watcher_is_read() -> None:
    _clock, p = manual_purgatory()
    stored, probe = HostileKey("k"), HostileKey("k")
    first = FlagOperation(10.0, "first")
    assert not p.try_complete_else_watch(first, [stored], threshold=5)
    assert p.check_and_complete(stored, 5) == 0  # released: its marks are a dict now
    assert type(first._marks) is dict
    del first  # the lists and the timer hold it alone
    cancelled: list[str] = []  # (names only: nothing else holds the cancelled operation)
    # 1st __eq__: the lists' lookup of `probe`; 2nd: the lookup in the lone watcher's marks
    stored.arm(lambda: cancelled.extend(op.name for op in p.cancel_for_key(probe)), "eq", at=2)
    second = FlagOperation(10.0, "second")
    assert not p.try_complete_else_watch(second, [probe])
    gc.collect()
    assert cancelled == ["first"]
    assert p._lists.watching(probe) == [second]
    assert counts(p) == (1, 1, 1, 0, 1)
    check_invariants(p)
    second.ready = True
    assert p.check_and_complete(probe) == 1
    check_invariants(p)


# -- row 2: a key's __eq__ triggers another key at its threshold during a trigger -----------------


@pytest.mark.parametrize("on", ["eq", "hash"])
def test_key_triggering_the_other_key_while_the_lone_watchers_marks_are_read(on: str) -> None:
    _clock, p = manual_purgatory()
    k1, k2, probe = HostileKey("k1"), HostileKey("k2"), HostileKey("k1")
    op = FlagOperation(10.0)
    assert not p.try_complete_else_watch(op, {k1: 5, k2: 7})
    released: list[int] = []
    if on == "eq":  # 1st: the lists' lookup; 2nd: the marks'
        k1.arm(lambda: released.append(p.check_and_complete(k2, 7)), "eq", at=2)
    else:  # 1st: the lists' lookup; 2nd: the marks'
        probe.arm(lambda: released.append(p.check_and_complete(k2, 7)), "hash", at=2)
    assert p.check_and_complete(probe, 5) == 0
    gc.collect()
    assert released == [0]
    assert op._marks == {k1: None, k2: None}
    assert counts(p) == (2, 1, 2, 0, 0)
    check_invariants(p)
    op.ready = True
    assert p.check_and_complete(k2, 7) == 1
    assert p.purge() == 1
    assert counts(p) == (0, 0, 0, 1, 0)
    check_invariants(p)


def test_key_triggering_the_other_key_while_a_purge_reads_the_marks() -> None:
    """The purge reads an operation's threshold for each key it leaves: the same lookup."""
    _clock, p = manual_purgatory()
    k1, k2 = HostileKey("k1"), HostileKey("k2")
    op = FlagOperation(10.0, "mixed")
    other = FlagOperation(10.0, "other")
    assert not p.try_complete_else_watch(op, {k1: 5, k2: 7})
    assert not p.try_complete_else_watch(other, {k1: 6, k2: 8})  # ThresholdWatchers on both
    assert op.force_complete()
    seen: list[int] = []
    k1.arm(lambda: seen.append(p.check_and_complete(k2, 8)), "hash")
    assert p.purge() == 1  # the trigger of k2 took the finished operation off k2 itself
    gc.collect()
    assert seen == [0]
    assert counts(p) == (2, 1, 2, 1, 0)
    check_invariants(p)


# -- row 3: an operation class's __hash__, assigned after its first watch, shuts the purgatory down


class LateHash(FlagOperation):
    """A class whose __hash__ is assigned once its first operation was watched."""


def test_operation_hash_assigned_later_is_not_called_while_timed() -> None:
    """The timer once put an operation in a bucket keyed by the operation, so its class's
    ``__hash__`` ran there, and a hash that shut the purgatory down freed the wheel under the
    native core's feet. Buckets hold operations by identity now: the watch times the
    operation without calling it, and the purgatory stays open."""
    _clock, p = manual_purgatory()
    assert not p.try_complete_else_watch(LateHash(10.0), ["a"])  # the class is admitted
    fired: list[bool] = []

    def hostile_hash(self: object) -> int:
        if not fired:
            fired.append(True)
            shut_down(p)
            gc.collect()
        return object.__hash__(self)

    LateHash.__hash__ = hostile_hash  # type: ignore[method-assign]
    try:
        op = LateHash(10.0)
        assert not p.try_complete_else_watch(op, ["b"])
        gc.collect()
        assert fired == []
        assert not p.closed
        assert op._bucket is not None
        assert counts(p)[0] == 2
        check_invariants(p)
    finally:
        del LateHash.__hash__


class Unhashed(FlagOperation):
    """An operation class whose ``__hash__`` and ``__eq__`` (assigned after its first watch:
    the purgatory refuses such a class at admission) fail the test while `armed`: the timer, its
    wheel and the watcher lists' purge queue must never call them. (A key watched by several
    operations holds them in a ``dict``, which does: the tests give each operation keys of its
    own.)"""

    armed = False


def _unhashed_hash(self: Unhashed) -> int:
    if Unhashed.armed:
        Unhashed.armed = False  # (one report, not a cascade of them)
        raise AssertionError(f"{self.name} hashed")
    return object.__hash__(self)


def _unhashed_eq(self: Unhashed, other: object) -> bool:
    if Unhashed.armed:
        Unhashed.armed = False
        raise AssertionError(f"{self.name} compared")
    return self is other


@pytest.fixture
def unhashed() -> Iterator[None]:
    Unhashed.__hash__ = _unhashed_hash  # type: ignore[assignment,method-assign]
    Unhashed.__eq__ = _unhashed_eq  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        Unhashed.armed = False
        del Unhashed.__hash__, Unhashed.__eq__


def test_watch_cascade_and_cancel_never_call_an_operations_hash_or_eq() -> None:
    clock, p = manual_purgatory()
    assert not p.try_complete_else_watch(Unhashed(10.0, "admitted"), ["admitted"])
    assert len(p.cancel_for_key("admitted")) == 1  # (it would expire, queued for the purge)
    Unhashed.__hash__ = _unhashed_hash  # type: ignore[assignment,method-assign]
    Unhashed.__eq__ = _unhashed_eq  # type: ignore[assignment,method-assign]
    try:
        timeouts = [0.5, 0.5, 0.5, 30.0, 30.0, 30.0, 3600.0, 3600.0]
        ops = [Unhashed(timeout, f"op{i}") for i, timeout in enumerate(timeouts)]
        Unhashed.armed = True
        for i, op in enumerate(ops):  # level 0, the memo's bucket, the overflow levels
            assert not p.try_complete_else_watch(op, [f"k{i}"])
        # a settle: out of its bucket, unlisted first
        assert _only(p.cancel_for_key("k0")) is ops[0]
        assert _only(p.cancel_for_key("k2")) is ops[2]
        assert Unhashed.armed, "an operation was hashed or compared"
        clock.advance(0.6)  # op1 expires, and is queued for the purge (by identity)
        assert ops[1].is_expired
        assert p.purge() == 1
        for _ in range(58):  # to 29.6 s: the 30 s bucket's cascade falls due (29.18 s) and runs
            clock.advance(0.5)
        assert _only(p.cancel_for_key("k3")) is ops[3]  # from the part its cascade moved it to
        assert _only(p.cancel_for_key("k6")) is ops[6]  # from an overflow level's bucket
        assert Unhashed.armed, "an operation was hashed or compared"
        Unhashed.armed = False
        check_invariants(p)
        cancelled = [op.is_cancelled for op in ops]
        assert cancelled == [True, False, True, True, False, False, True, False]
        clock.advance(10.0)
        assert [op.is_expired for op in ops[4:6]] == [True, True]
        check_invariants(p)
    finally:
        Unhashed.armed = False
        del Unhashed.__hash__, Unhashed.__eq__


def test_the_timer_never_calls_what_it_times(unhashed: None) -> None:
    """`SystemTimer` on its own (no watcher lists, no purge queue): add, the memo's inline
    add, add_due, passes with cascades by slices and expiry, discard, drain and close."""
    now = [0.0]
    expired: list[Unhashed] = []

    def expire(due: list[Unhashed], at: float, outcome: str) -> int:
        for op in due:
            op._state |= EXPIRED_NOW
        expired.extend(due)
        return len(due)

    timer: SystemTimer[Unhashed] = SystemTimer(0.001, 8, lambda: now[0], expire, _no_housekeeping)
    timeouts = [0.002, 0.002, 0.005, 0.1, 0.1, 0.1, 3.0, 3.0, 100.0]
    ops = [Unhashed(timeout, f"op{i}") for i, timeout in enumerate(timeouts)]
    Unhashed.armed = True
    for op in ops:
        timer.add(op)
    due_now = Unhashed(1.0, "due now")
    timer.add_due(due_now)
    timer.discard(ops[4])
    assert len(timer) == len(ops)
    while now[0] < 4.0:
        now[0] += 0.001
        timer.run_pass(now[0], 2)
    assert Unhashed.armed, "an operation was hashed or compared"
    assert [op.name for op in expired] == ["due now"] + [
        op.name for op in ops[:8] if op is not ops[4]
    ]
    timer.drain(None)
    assert [op.name for op in expired[-1:]] == ["op8"]
    timer.add(ops[4])
    assert [op.name for op in timer.close()] == ["op4"]
    assert Unhashed.armed, "an operation was hashed or compared"
    assert all(op._bucket is None for op in [*ops, due_now])


def _no_housekeeping(taken: int, budget: int | None) -> bool:
    return False


def _only(ops: list[Any]) -> Any:
    assert len(ops) == 1
    return ops[0]


@pytest.mark.parametrize("how", ["force_complete", "expiry"])
def test_operation_hash_is_not_called_as_it_is_queued_for_the_purge(how: str) -> None:
    """Settling an operation still on a list queues it for the purge. The queue was keyed by
    the operation, so the insertion ran its class's ``__hash__`` (assigned after the class's
    first watch), which here triggers the operation's key: the trigger took the finished
    operation off its last list in the middle of its settle, and the queue had to be re-checked
    after it (found by the hostile differential test). The queue holds operations by identity
    now: the settle calls nothing, the trigger after it drops the operation from its list and
    from the queue's end, and the purge finds nothing."""
    clock, p = manual_purgatory()
    op = LateHash(0.05)
    assert not p.try_complete_else_watch(op, ["a"])
    fired: list[int] = []

    def hostile_hash(self: object) -> int:
        if not fired:
            fired.append(p.check_and_complete("a"))
        return object.__hash__(self)

    LateHash.__hash__ = hostile_hash  # type: ignore[method-assign]
    try:
        if how == "force_complete":
            assert op.force_complete()
        else:
            clock.advance(0.1)
        assert fired == []
        assert op.is_completed
        assert (op._listed, len(p._lists.queue)) == (1, 1)
        check_invariants(p)
        assert p.check_and_complete("a") == 0  # found finished and dropped, not counted again
        assert (op._listed, len(p._lists.queue), p.watched()) == (0, 0, 0)
        assert p.purge() == 0
        assert fired == []
        check_invariants(p)
    finally:
        del LateHash.__hash__


def test_settled_on_two_keys_every_way_and_purged_without_a_hash_or_eq() -> None:
    """Operations on two keys of their own each, settled every way a listed operation settles
    (``force_complete``; a trigger of one key and then of the other; a timer pass's expiry; a
    cancel of one key, and of both; a trigger at a threshold), then purged: the purge queue
    takes and gives them by identity, and the purge takes every settled one off every list."""
    clock, p = manual_purgatory()
    assert not p.try_complete_else_watch(Unhashed(10.0, "admitted"), ["admitted"])
    assert len(p.cancel_for_key("admitted")) == 1  # (cancelled on its only key: not queued)
    Unhashed.__hash__ = _unhashed_hash  # type: ignore[assignment,method-assign]
    Unhashed.__eq__ = _unhashed_eq  # type: ignore[assignment,method-assign]
    try:
        ops = [Unhashed(0.5 if i == 2 else 30.0, f"op{i}") for i in range(6)]
        Unhashed.armed = True
        for i, op in enumerate(ops[:5]):
            assert not p.try_complete_else_watch(op, [f"a{i}", f"b{i}"])
        assert not p.try_complete_else_watch(ops[5], {"a5": 5, "b5": 7})
        assert ops[0].force_complete()  # queued, on both lists
        ops[1].ready = True
        assert p.check_and_complete("a1") == 1  # completed, queued, off a1
        assert p.check_and_complete("b1") == 0  # off b1: its last list (and the queue's end)
        clock.advance(0.6)  # ops[2] expires, queued on both lists
        assert _only(p.cancel_for_key("a3")) is ops[3]  # queued, still on b3
        assert _only(p.cancel_for_key("a4")) is ops[4]
        assert p.cancel_for_key("b4") == []  # (cancelled already) off its last list
        ops[5].ready = True
        assert p.check_and_complete("a5", 5) == 1  # released at its threshold, completed
        assert Unhashed.armed, "an operation was hashed or compared"
        Unhashed.armed = False
        check_invariants(p)
        assert p._lists.queue == [ops[0], ops[2], ops[3], ops[5]]  # (list ==: by identity first)
        Unhashed.armed = True
        assert p.purge() == 2 + 2 + 1 + 1  # ops[0] and ops[2] on two lists, 3 and 5 on one
        assert Unhashed.armed, "an operation was hashed or compared"
        Unhashed.armed = False
        assert (p.watched(), len(p._lists), p._lists.queue) == (0, 0, [])
        assert [op._listed for op in ops] == [0] * 6
        outcomes = [(op.is_completed, op.is_expired, op.is_cancelled) for op in ops]
        assert outcomes == [(True, False, False)] * 2 + [(True, True, False)] + [
            (False, False, True)
        ] * 2 + [(True, False, False)]
        check_invariants(p)
    finally:
        Unhashed.armed = False
        del Unhashed.__hash__, Unhashed.__eq__


# -- row 5: the operation completed while its watch reads the keys -------------------------------


class _CompletingMapping(Mapping[Hashable, Any]):
    def __init__(self, op: FlagOperation) -> None:
        self.op = op

    def __getitem__(self, key: Hashable) -> Any:
        return None

    def __iter__(self) -> Iterator[Hashable]:
        self.op.ready = True
        self.op.force_complete()
        yield "k"

    def __len__(self) -> int:
        return 1


class _CompletingLog:
    """An event log whose record_watch completes the operation it records."""

    def record_watch(self, purgatory: str, op: Any, *args: Any) -> None:
        op.ready = True
        op.force_complete()

    def record_end(self, *args: Any) -> None:
        pass

    def flush(self) -> None:
        pass


def _completing_generator(op: FlagOperation) -> Iterator[Hashable]:
    op.ready = True
    op.force_complete()
    yield "k"


def _completing_threshold(op: FlagOperation) -> dict[Hashable, Any]:
    threshold = HostileThreshold(5)

    def complete() -> None:
        op.ready = True
        op.force_complete()

    HostileThreshold.arm(complete)
    return {"k": threshold}


def _completing_key_hash(op: FlagOperation) -> list[Hashable]:
    key = HostileKey("k")

    def complete() -> None:
        op.ready = True
        op.force_complete()

    key.arm(complete, "hash")
    return [key]


def _completing_key_hash_tuple(op: FlagOperation) -> tuple[Hashable, ...]:
    return tuple(_completing_key_hash(op))


@pytest.mark.parametrize(
    "keys_of",
    [
        _completing_generator,
        _CompletingMapping,
        _completing_threshold,
        _completing_key_hash,
        _completing_key_hash_tuple,
        None,  # the event log's record_watch
    ],
)
def test_operation_completed_while_its_watch_reads_the_keys(
    keys_of: Callable[[FlagOperation], Any] | None,
) -> None:
    _clock, p = manual_purgatory(event_log=_CompletingLog() if keys_of is None else None)
    op = FlagOperation(10.0)
    keys = ["k"] if keys_of is None else keys_of(op)
    assert p.try_complete_else_watch(op, keys)
    assert op.is_completed
    assert counts(p) == (0, 0, 0, 1, 0)
    assert getattr(op, "_listed", 0) == 0  # (never registered: never written)
    check_invariants(p)


# -- row 9: numbers beyond a C integer ---------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "timeout"),
    [
        ({"purge_interval": 2**64}, 1e-3),
        ({"purge_interval": 2**200}, 1e-3),
        ({"purge_interval": 2**64, "tick": 1e-20}, 1e-12),
        ({"tick": 1e-20}, 1e-12),
    ],
)
def test_arguments_beyond_a_c_integer(options: dict[str, Any], timeout: float) -> None:
    """Accepted as the reference accepts them (a C integer cannot hold 2**64, nor the ticks in
    a second of 1e-20 s: such an interval never trips, such a linger is the largest count)."""
    clock, p = manual_purgatory(**options)
    ops = [FlagOperation(timeout) for _ in range(3)]
    for i, op in enumerate(ops):
        assert not p.try_complete_else_watch(op, [i])
    ops[0].ready = True
    assert p.check_and_complete(0) == 1
    clock.advance(timeout * 2)
    assert [op.is_expired for op in ops] == [False, True, True]
    assert counts(p)[1:] == (0, 2, 1, 0)
    check_invariants(p)


# -- row 10: an object that is not a DelayedOperation but has its fields --------------------------


class Impostor:
    """Carries an operation's fields and methods, without being a DelayedOperation."""

    __slots__ = (
        "_bucket",
        "_deadline",
        "_future",
        "_keys",
        "_listed",
        "_marks",
        "_owner",
        "_result",
        "_state",
        "_timeout",
        "tries",
    )
    _is_async = False

    def __init__(self) -> None:
        self._state = 0
        self._owner = None
        self._bucket = None
        self._future = None
        self._timeout = 10.0
        self.tries = 0

    def try_complete(self) -> bool:
        self.tries += 1
        return False


@pytest.mark.parametrize("shape", ["lone", "set", "threshold"])
def test_an_impostor_watched_then_triggered(shape: str) -> None:
    _clock, p = manual_purgatory()
    impostor = Impostor()
    if shape != "lone":
        other = FlagOperation(10.0)
        p.try_complete_else_watch(other, {"k": 3} if shape == "threshold" else ["k"])
    assert not p.try_complete_else_watch(impostor, ["k"])
    assert p.check_and_complete("k") == 0
    assert p.check_and_complete("k", 5) == 0
    assert impostor.tries == 4
    assert p.statistics().keys == 1


# -- row 11: a shutdown from a key's __hash__ / __eq__ while the watch registers -----------------


@pytest.mark.parametrize("on", ["hash", "eq"])
@pytest.mark.parametrize("first", [True, False])
def test_shutdown_from_a_key_while_registering(on: str, first: bool) -> None:
    _clock, p = manual_purgatory()
    # `eq` needs a key equal to another one already watched: an operation on "k"
    stored, probe = HostileKey("k"), HostileKey("k")
    earlier = FlagOperation(10.0, "earlier")
    assert not p.try_complete_else_watch(earlier, [stored])
    target = stored if on == "eq" else probe
    target.arm(lambda: shut_down(p), on)
    op = FlagOperation(10.0)
    keys = (probe, "other") if first else ("other", probe)
    assert not p.try_complete_else_watch(op, keys)
    assert p.closed
    assert op.is_cancelled
    assert earlier.is_cancelled
    with pytest.raises(PurgatoryClosed):
        op._outcome()
    assert counts(p) == (0, 0, 0, 0, 2)
    check_invariants(p)


@pytest.mark.asyncio
async def test_shutdown_from_a_key_wakes_the_awaiter() -> None:
    _clock, p = manual_purgatory()
    key = HostileKey("k")
    key.arm(lambda: shut_down(p), "hash")
    with pytest.raises(PurgatoryClosed):
        await p.watch(FlagOperation(10.0), [key])
    check_invariants(p)


# -- row 12: a threshold whose comparison cancels its own key during the release ------------------


@pytest.mark.parametrize("in_order", [True, False])
def test_threshold_comparison_cancelling_its_key_during_the_release(in_order: bool) -> None:
    _clock, p = manual_purgatory()
    low, high = FlagOperation(10.0, "low"), FlagOperation(10.0, "high")
    # in order: a run of 5, 6; out of order: 6 in the run, 5 in the heap
    first, second = (low, high) if in_order else (high, low)
    for op in (first, second):
        threshold = HostileThreshold(5 if op is low else 6)
        assert not p.try_complete_else_watch(op, ["k"], threshold=threshold)
    cancelled: list[Any] = []
    HostileThreshold.arm(lambda: cancelled.extend(p.cancel_for_key("k")))
    assert p.check_and_complete("k", 10) == 0
    assert sorted(op.name for op in cancelled) == ["high", "low"]
    assert counts(p) == (0, 0, 0, 0, 2)
    check_invariants(p)


def test_threshold_comparison_cancelling_its_key_lone_watcher() -> None:
    _clock, p = manual_purgatory()
    op = FlagOperation(10.0)
    assert not p.try_complete_else_watch(op, ["k"], threshold=HostileThreshold(5))
    HostileThreshold.arm(lambda: p.cancel_for_key("k"))
    assert p.check_and_complete("k", 10) == 0
    assert op.is_cancelled
    assert counts(p) == (0, 0, 0, 0, 1)
    check_invariants(p)


# -- the doors: every C entry that receives an operation checks its type --------------------------


def test_timer_and_settle_refuse_what_is_not_an_operation() -> None:
    _clock, p = manual_purgatory()
    with pytest.raises((TypeError, AttributeError)):
        p._settled(object(), "completed")
    with pytest.raises((TypeError, AttributeError)):
        p._timer.add(object())
    check_invariants(p)


# -- a key's code cancelling or triggering a key the operation is already on, as it registers -----


@pytest.mark.parametrize("action", ["cancel", "trigger"])
def test_key_acting_on_a_key_the_watch_registered_already(action: str) -> None:
    """The operation is on its first key when the second key's __hash__ cancels that first key
    (or triggers it, completing the operation): it is counted off that list before its count
    was written, and ends as if before registration."""
    _clock, p = manual_purgatory()
    first, second = HostileKey("a"), HostileKey("b")
    op = FlagOperation(10.0)
    if action == "cancel":
        second.arm(lambda: p.cancel_for_key(first), "hash")
    else:

        def ready_then_trigger() -> None:
            op.ready = True
            p.check_and_complete(first)

        second.arm(ready_then_trigger, "hash")
    completed = p.try_complete_else_watch(op, (first, second))
    assert completed is (action == "trigger")
    assert op.is_cancelled is (action == "cancel")
    assert counts(p) == (0, 0, 0, int(action == "trigger"), int(action == "cancel"))
    assert op._listed == 0
    check_invariants(p)


# -- the threshold heap: a comparison in the middle of a sift -------------------------------------


class SiftThreshold(int):
    """An int threshold whose ``<`` and ``<=`` run `action` at the `at`-th comparison made once
    armed (both builds sift as `heapq` does: the same comparisons, in the same order)."""

    action: Callable[[], object] | None = None
    at = 0
    made = 0

    @classmethod
    def arm(cls, action: Callable[[], object], at: int) -> None:
        cls.action, cls.at, cls.made = action, at, 0

    @classmethod
    def _maybe(cls) -> None:
        if cls.action is None:
            return
        cls.made += 1
        if cls.made == cls.at:
            action, cls.action = cls.action, None
            action()

    def __le__(self, other: object) -> bool:
        self._maybe()
        return int(self) <= other  # type: ignore[operator]

    def __lt__(self, other: object) -> bool:
        self._maybe()
        return int(self) < other  # type: ignore[operator]

    __hash__ = int.__hash__


@pytest.fixture(autouse=True)
def _sift_disarmed() -> Iterator[None]:
    SiftThreshold.action = None
    yield
    SiftThreshold.action = None


def heap_of(p: DelayedOperationPurgatory[Any], offsets: list[int]) -> list[FlagOperation]:
    """Watchers of "k" at `offsets`: the first in the run, the others (lower) in the heap."""
    ops = []
    for offset in offsets:
        op = FlagOperation(10.0, str(offset))
        assert not p.try_complete_else_watch(op, ["k"], threshold=SiftThreshold(offset))
        ops.append(op)
    return ops


def released(
    p: DelayedOperationPurgatory[Any], ops: list[FlagOperation], reached: int
) -> list[str]:
    """The names of `ops` the next trigger of "k" at `reached` re-tries."""
    for op in ops:
        op.attempts = 0
    p.check_and_complete("k", reached)
    return [op.name for op in ops if op.attempts]


def hostile(
    p: DelayedOperationPurgatory[Any], action: str, cancelled: list[Any]
) -> Callable[[], None]:
    def act() -> None:
        if action == "trigger":
            p.check_and_complete("k", 20)
        elif action == "cancel":
            cancelled.extend(p.cancel_for_key("k"))
        else:
            raise TypeError("no order")

    return act


# The 12th comparison of the watch below is the push's second sift step: its first 10 are the
# threshold's order check against the 5 queued (`check_orders`, both ways), the 11th the run's
# tail against the heap's head.
@pytest.mark.parametrize(
    ("action", "raised", "left"),
    [
        ("cancel", RuntimeError, (0, 0, 0, 0, 5)),
        ("raise", TypeError, (5, 5, 1, 0, 0)),
        ("trigger", RuntimeError, (5, 5, 1, 0, 0)),
    ],
)
def test_threshold_comparison_mid_push(
    action: str, raised: type[Exception], left: tuple[int, ...]
) -> None:
    """A comparison in the middle of the heap's sift as a watch pushes its threshold cancels
    the key (the heap emptied under the sift), raises, or triggers the key (the heap popped
    under it): the watch fails as `heapq` fails on the reference's list ("list changed size"),
    with nothing of the newcomer left, nothing freed under the sift, and what stayed queued
    released in order. After the trigger the key's count of dead entries still holds: the
    nested release popped the newcomer before it was in ``at``, which the failed push counts
    again."""
    _clock, p = manual_purgatory()
    ops = heap_of(p, [100, 50, 40, 30, 20])
    newcomer = FlagOperation(10.0, "10")
    cancelled: list[Any] = []
    SiftThreshold.arm(hostile(p, action, cancelled), at=12)
    with pytest.raises(raised):
        p.try_complete_else_watch(newcomer, ["k"], threshold=SiftThreshold(10))
    assert SiftThreshold.action is None  # (it ran)
    assert counts(p) == left
    assert newcomer.attempts == 1
    assert not newcomer.is_completed
    check_invariants(p)
    if action == "cancel":
        assert len(cancelled) == 5
    else:
        assert released(p, ops, 1000) == ["100", "50", "40", "30", "20"]


@pytest.mark.parametrize(
    ("action", "at", "outcome"),
    [
        ("cancel", 1, None),  # choosing the head: the key is gone, the loop ends
        ("cancel", 3, RuntimeError),  # in the pop's sift: "list changed size"
        ("trigger", 2, None),  # the head taken by the nested trigger: looked at again
        ("raise", 2, TypeError),
        ("raise", 3, TypeError),  # in the pop's sift, the head off the heap already
        ("raise", 4, TypeError),
    ],
)
def test_threshold_comparison_mid_release(
    action: str, at: int, outcome: type[Exception] | None
) -> None:
    """A release compares the heads and sifts the heap as it pops; a comparison there cancels
    the key, triggers it, or raises: both builds stop or go on alike, nothing is freed under
    the release, and what is still queued is released later, in order, once. A pop whose sift
    raises has taken the head off the heap: its operation is released with the error, not
    lost (it is re-tried by the next trigger), and the heap is ordered again."""
    _clock, p = manual_purgatory()
    ops = heap_of(p, [100, 50, 40, 30, 20, 10])
    cancelled: list[Any] = []
    SiftThreshold.arm(hostile(p, action, cancelled), at=at)
    if outcome is None:
        assert p.check_and_complete("k", 35) == 0
    else:
        with pytest.raises(outcome):
            p.check_and_complete("k", 35)
    assert SiftThreshold.action is None
    check_invariants(p)
    if action == "cancel":
        assert {op.name for op in cancelled} == {op.name for op in ops}
        assert counts(p) == (0, 0, 0, 0, 6)
    else:
        assert released(p, ops, 1000) == [op.name for op in ops]
        check_invariants(p)


def test_threshold_heap_order_as_heapq() -> None:
    """The native heap sifts as `heapq` does: out-of-order thresholds end in the same layout
    (what a copy of ``heap`` shows) and are released in order, ties to the run."""
    _clock, p = manual_purgatory()
    offsets = [50, 7, 30, 2, 9, 30, 1, 8, 70, 3]
    for index, offset in enumerate(offsets):
        op = FlagOperation(10.0, f"{index}")
        assert not p.try_complete_else_watch(op, ["k"], threshold=offset)
    watchers = p._lists._lists["k"]
    expected: list[int] = []
    for offset in dict.fromkeys(offsets[1:]):  # (the second 30 joins the first's operations)
        heapq.heappush(expected, offset)
    assert (list(watchers.run), watchers.heap) == ([50], expected)
    check_invariants(p)


class HashThreshold(int):
    """An int threshold whose ``__hash__`` runs `action` at the `at`-th hash made once armed."""

    action: Callable[[], object] | None = None
    at = 0
    made = 0

    def __hash__(self) -> int:
        cls = type(self)
        if cls.action is not None:
            cls.made += 1
            if cls.made == cls.at:
                action, cls.action = cls.action, None
                action()
        return int.__hash__(self)

    def __eq__(self, other: object) -> bool:
        return int(self) == other


@pytest.mark.parametrize("action", ["trigger", "cancel"])
def test_threshold_hash_acting_on_its_key_mid_compaction(action: str) -> None:
    """The purge leaves three of five thresholds dead, which compacts the queue: its lookups
    (``threshold in at``) hash every queued threshold, and the 7th hash (the compaction's
    first) triggers the key past the live ones or cancels it. Both builds stop the compaction
    as the reference's iteration of a changed deque does, and the live watchers are where the
    nested call put them (the purge's counts are then off by what it took: README's known
    limit for a threshold acting in the middle of the lists' own steps)."""
    _clock, p = manual_purgatory()
    ops = []
    for offset in (10, 20, 30, 40, 50):
        op = FlagOperation(10.0, str(offset))
        assert not p.try_complete_else_watch(op, ["k"], threshold=HashThreshold(offset))
        ops.append(op)
    for op in ops[:3]:
        op.force_complete()

    def act() -> None:
        if action == "trigger":
            p.check_and_complete("k", 45)
        else:
            p.cancel_for_key("k")

    HashThreshold.action, HashThreshold.at, HashThreshold.made = act, 7, 0
    try:
        with pytest.raises(RuntimeError, match="deque mutated during iteration"):
            p._lists.purge(None)
    finally:
        HashThreshold.action = None
    for op in ops:
        op.attempts = 0
    p.check_and_complete("k", 1000)
    assert [op.name for op in ops if op.attempts] == (["40", "50"] if action == "trigger" else [])
    assert [op.is_cancelled for op in ops[3:]] == [action == "cancel"] * 2
