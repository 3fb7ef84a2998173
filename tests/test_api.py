"""The public face: exported names, argument checking, error types and messages."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import subprocess
import sys

import pytest
from helpers import FlagOperation

import purgatory
from purgatory import (
    DelayedOperation,
    DelayedOperationPurgatory,
    OperationCancelled,
    PurgatoryClosed,
    PurgatoryError,
    PurgatoryFull,
)
from purgatory.testing import ManualClock, check_invariants


def test_all_is_exactly_the_public_names() -> None:
    public = {name for name in vars(purgatory) if not name.startswith("_")}
    public -= {"annotations", "testing", "pipeline", "asgi"}
    assert set(purgatory.__all__) == public
    assert isinstance(purgatory.__all__, tuple)
    for name in purgatory.__all__:
        assert getattr(purgatory, name).__module__ == "purgatory", name
    assert ManualClock.__module__ == "purgatory.testing"


def test_import_pulls_in_only_the_standard_library() -> None:
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import purgatory, purgatory.testing, purgatory.asgi\n"
        "names = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(n for n in names if n not in sys.stdlib_module_names "
        "and n not in ('purgatory', '__main__')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_arrow_event_log_says_what_to_install_without_pyarrow(tmp_path: object) -> None:
    code = (
        "import sys\n"
        "sys.modules['pyarrow'] = None\n"
        "import purgatory\n"
        "assert 'ArrowEventLog' in purgatory.__all__\n"
        "try:\n"
        f"    purgatory.ArrowEventLog({str(tmp_path)!r})\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'asyncio-purgatory[arrow]'" in out.stdout


def test_exception_family() -> None:
    for error in (OperationCancelled, PurgatoryClosed, PurgatoryFull):
        assert issubclass(error, PurgatoryError)
    assert issubclass(PurgatoryClosed, OperationCancelled)


@pytest.mark.parametrize("timeout", [-0.001, math.nan, math.inf, -math.inf])
def test_operation_rejects_bad_timeouts(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        FlagOperation(timeout)


@pytest.mark.parametrize("timeout", ["1", None, True])
def test_operation_rejects_non_numbers(timeout: object) -> None:
    with pytest.raises(TypeError, match="timeout"):
        FlagOperation(timeout)  # type: ignore[arg-type]


def test_zero_and_integer_timeouts_are_fine() -> None:
    assert FlagOperation(0).timeout == 0.0
    assert FlagOperation(3).timeout == 3.0


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"purge_interval": -1}, ValueError),
        ({"purge_interval": 1.5}, TypeError),
        ({"tick": 0}, ValueError),
        ({"tick": -1.0}, ValueError),
        ({"tick": math.nan}, ValueError),
        ({"tick": math.inf}, ValueError),
        ({"tick": "1ms"}, TypeError),
        ({"wheel_size": 1}, ValueError),
        ({"wheel_size": 8.0}, TypeError),
        ({"max_pending": 0}, ValueError),
        ({"max_pending": 2.5}, TypeError),
        ({"clock": object()}, TypeError),
    ],
)
def test_purgatory_rejects_bad_arguments(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        DelayedOperationPurgatory("bad", **kwargs)  # type: ignore[arg-type]


def test_purgatory_rejects_a_non_string_name() -> None:
    with pytest.raises(TypeError, match="name"):
        DelayedOperationPurgatory(42)  # type: ignore[arg-type]


@pytest.mark.parametrize("seconds", [-1.0, math.nan, math.inf])
def test_manual_clock_never_goes_backwards(seconds: float) -> None:
    clock = ManualClock(5.0)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(seconds)
    assert clock.now() == 5.0


def test_manual_clock_rejects_bad_start() -> None:
    with pytest.raises(ValueError, match="finite"):
        ManualClock(math.nan)
    with pytest.raises(TypeError):
        ManualClock("0")  # type: ignore[arg-type]


def make() -> tuple[ManualClock, DelayedOperationPurgatory[FlagOperation]]:
    clock = ManualClock()
    return clock, DelayedOperationPurgatory("api", clock=clock)


def test_empty_keys_are_rejected_and_nothing_is_registered() -> None:
    _, p = make()
    op = FlagOperation(1)
    with pytest.raises(ValueError, match="at least one key"):
        p.try_complete_else_watch(op, [])
    assert (p.watched(), p.num_delayed()) == (0, 0)
    assert not p.try_complete_else_watch(op, ["k"])  # still usable


def test_a_string_is_not_a_collection_of_keys() -> None:
    _, p = make()
    with pytest.raises(TypeError, match="collection of keys"):
        p.try_complete_else_watch(FlagOperation(1), "topic-0")


def test_an_operation_is_watched_once() -> None:
    _, p = make()
    op = FlagOperation(1)
    p.try_complete_else_watch(op, ["a"])
    with pytest.raises(ValueError, match="already watched"):
        p.try_complete_else_watch(op, ["b"])
    other = DelayedOperationPurgatory[FlagOperation]("other", clock=ManualClock())
    with pytest.raises(ValueError, match="already watched"):
        other.try_complete_else_watch(op, ["a"])
    done = FlagOperation(1)
    done.force_complete()
    with pytest.raises(ValueError, match="finished"):
        p.try_complete_else_watch(done, ["a"])
    check_invariants(p)


def test_a_subclass_that_forgot_super_init_gets_a_clear_error() -> None:
    class Forgetful(FlagOperation):
        def __init__(self) -> None:
            pass

    _, p = make()
    with pytest.raises(TypeError, match=r"super\(\).__init__"):
        p.try_complete_else_watch(Forgetful(), ["a"])


def test_value_equality_is_refused() -> None:
    @dataclasses.dataclass
    class ByValue(DelayedOperation[None]):
        label: str

        def __post_init__(self) -> None:
            super().__init__(1.0)

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            return None

        def on_expiration(self) -> None:
            return None

    p = DelayedOperationPurgatory[ByValue]("eq", clock=ManualClock())
    with pytest.raises(TypeError, match="eq=False"):
        p.try_complete_else_watch(ByValue("x"), ["a"])


def test_max_pending_rejects_without_registering_but_admits_instant_completions() -> None:
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("cap", clock=clock, max_pending=2)
    assert not p.try_complete_else_watch(FlagOperation(1), ["a"])
    assert not p.try_complete_else_watch(FlagOperation(1), ["a"])
    with pytest.raises(PurgatoryFull, match="max_pending=2"):
        p.try_complete_else_watch(FlagOperation(1), ["a", "b"])
    assert (p.num_delayed(), p.watched(), p.statistics().keys) == (2, 2, 1)
    instant = FlagOperation(1)
    instant.ready = True
    assert p.try_complete_else_watch(instant, ["a"])
    clock.advance(1)
    assert not p.try_complete_else_watch(FlagOperation(1), ["b"])
    check_invariants(p)


def test_unbound_purgatory_refuses_threadsafe_triggers() -> None:
    _, p = make()
    with pytest.raises(RuntimeError, match="not bound to an event loop"):
        p.check_and_complete_threadsafe("a")


def test_loop_clock_purgatory_needs_a_running_loop() -> None:
    p = DelayedOperationPurgatory[FlagOperation]("loopless")
    with pytest.raises(RuntimeError, match="inside a running asyncio loop"):
        p.try_complete_else_watch(FlagOperation(1), ["a"])
    assert p.watched() == 0


def test_closed_purgatory_refuses_watches() -> None:
    _, p = make()
    asyncio.run(p.shutdown())
    with pytest.raises(PurgatoryClosed):
        p.try_complete_else_watch(FlagOperation(1), ["a"])
    assert p.closed


def test_statistics_is_a_frozen_snapshot() -> None:
    clock, p = make()
    op = FlagOperation(0.5)
    p.try_complete_else_watch(op, ["a", "b"])
    stats = p.statistics()
    assert (stats.watched, stats.delayed, stats.keys) == (2, 1, 2)
    assert stats.next_deadline_in == pytest.approx(0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.watched = 0  # type: ignore[misc]
    clock.advance(0.5)
    stats = p.statistics()
    assert (stats.delayed, stats.expired, stats.completed) == (0, 1, 0)
    assert stats.next_deadline_in == math.inf


def test_reprs_show_the_public_path_and_state() -> None:
    _, p = make()
    op = FlagOperation(1)
    assert "new" in repr(op)
    p.try_complete_else_watch(op, ["a"])
    assert "watched" in repr(op)
    assert repr(p).startswith("<DelayedOperationPurgatory 'api' open")
    op.ready = True
    p.check_and_complete("a")
    assert "completed" in repr(op)
    assert repr(DelayedOperationPurgatory).endswith("'purgatory.DelayedOperationPurgatory'>")


def test_force_complete_outside_a_purgatory_runs_on_complete_once() -> None:
    op = FlagOperation(1)
    assert op.force_complete()
    assert not op.force_complete()
    assert op.calls == ["complete"]
    assert op.is_completed
    assert not op.is_expired
    assert not op.is_cancelled


def test_a_loop_clock_purgatory_refuses_a_second_loop() -> None:
    p = DelayedOperationPurgatory[FlagOperation]("one-loop")

    async def use() -> None:
        p.try_complete_else_watch(FlagOperation(30), ["a"])

    asyncio.run(use())
    with pytest.raises(RuntimeError, match="another event loop"):
        asyncio.run(use())
    assert p.num_delayed() == 1


class Joiner(FlagOperation):
    """Completes on its trigger after watching a newcomer on the same key (a re-entrant watch)."""

    def __init__(self, purgatory: DelayedOperationPurgatory[FlagOperation], key: str) -> None:
        super().__init__(10, "joiner")
        self.purgatory = purgatory
        self.key = key
        self.newcomer = FlagOperation(10, "newcomer")

    def try_complete(self) -> bool:
        if self.ready:
            self.purgatory.try_complete_else_watch(self.newcomer, [self.key])
        return super().try_complete()


def test_a_lone_watcher_completing_while_a_newcomer_joins_its_key() -> None:
    """The lone operation of a key leaves it; one that joined during its attempt stays."""
    _, p = make()
    joiner = Joiner(p, "k")
    p.try_complete_else_watch(joiner, ["k"])
    assert (p.watched(), p.statistics().keys) == (1, 1)
    joiner.ready = True
    assert p.check_and_complete("k") == 1
    assert p.watched() == 1
    check_invariants(p)
    joiner.newcomer.ready = True
    assert p.check_and_complete("k") == 1
    assert (p.watched(), p.statistics().keys) == (0, 0)


def test_a_key_listed_twice_is_watched_once_per_listing() -> None:
    _, p = make()
    op = FlagOperation(1)
    p.try_complete_else_watch(op, ["a", "a", "b"])
    check_invariants(p)
    assert p.cancel_for_key("a") == [op]
    assert op.is_cancelled
    check_invariants(p)
