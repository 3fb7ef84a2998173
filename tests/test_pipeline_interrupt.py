"""Ctrl-C on a command's job (`purgatory.pipeline._spark.stop_on_interrupt`): raised at once on a
classic session; on Spark Connect held back while the main thread is inside a client call (a
`KeyboardInterrupt` raised inside one kills gRPC's channel thread, and the queries' stop then
waits forever), delivered again until it can be raised. The session is a stand-in that counts
its cancellations; the real SIGINT machinery delivers the interrupts."""

from __future__ import annotations

import signal
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from purgatory.pipeline import _spark


class Session:
    """Counts what the handler's thread cancels: `interruptAll` (Spark Connect's)."""

    def __init__(self) -> None:
        self.interrupted = threading.Event()

    def interruptAll(self) -> list[str]:  # (Spark Connect's name)
        self.interrupted.set()
        return []


def frames(*modules: str) -> Any:
    """A chain of frames, innermost first, in `modules`."""
    frame = None
    for name in reversed(modules):
        frame = types.SimpleNamespace(f_globals={"__name__": name}, f_back=frame)
    return frame


def in_module(name: str) -> Callable[[threading.Event], None]:
    """A function whose frame is in module `name`: it waits until `done` is set."""
    code = "def wait(done):\n    while not done.is_set():\n        time.sleep(0.005)\n"
    scope: dict[str, Any] = {"__name__": name, "time": time}
    exec(code, scope)  # (a frame in another module's name, for the handler to see)
    return cast(Callable[[threading.Event], None], scope["wait"])


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bool], Session]]:
    """Install the handler on the real SIGINT (connect or not); restore everything after."""
    # (Signals reach only the main thread's handlers: elsewhere a SIGINT would stop the run.)
    assert threading.current_thread() is threading.main_thread()
    monkeypatch.setattr(_spark, "_silence_py4j", lambda: None)
    monkeypatch.setattr(_spark, "is_connect", lambda spark: spark.connect)
    previous = signal.getsignal(signal.SIGINT)
    _spark._INTERRUPTED.clear()
    _spark._ENDED.clear()

    def install(connect: bool) -> Session:
        session = Session()
        session.connect = connect  # type: ignore[attr-defined]
        _spark.stop_on_interrupt(cast(SparkSession, session))
        return session

    try:
        yield install
    finally:
        for thread in threading.enumerate():
            if thread.name.startswith("purgatory-interrupt"):
                thread.join(timeout=5)
        time.sleep(0.5)  # (a delivery in flight meets the handler, not Python's)
        signal.signal(signal.SIGINT, previous)
        _spark._INTERRUPTED.clear()
        _spark._ENDED.clear()


def test_a_client_call_holds_the_interrupt_until_it_returns(
    installed: Callable[[bool], Session],
) -> None:
    session = installed(True)
    done = threading.Event()
    wait = in_module("grpc._channel")
    threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()  # (the user's Ctrl-C)
    threading.Timer(1.2, done.set).start()
    held: list[float] = []

    def call_then_go_on() -> None:
        started = time.monotonic()
        wait(done)  # the Ctrl-C comes in here; returns after 1.2 s, deliveries held back
        held.append(time.monotonic() - started)
        while True:  # raised here, out of the call, at the next delivery
            time.sleep(0.005)

    with pytest.raises(KeyboardInterrupt):
        call_then_go_on()
    assert held
    assert held[0] >= 1.1
    assert _spark.interrupted()
    assert session.interrupted.wait(5)  # the session's operations were interrupted at once


def test_a_ctrl_c_held_back_is_not_raised_once_the_command_ended(
    installed: Callable[[bool], Session],
) -> None:
    # A call cancelled by the interrupt fails with Spark's error, which the command line
    # catches and says; a held-back Ctrl-C raised after that would come out as a traceback.
    installed(True)
    done = threading.Event()
    wait = in_module("grpc._channel")
    threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()
    # (Ended while still in the call: a delivery in between would come in this test's frame.)
    threading.Timer(0.6, _spark.command_ended).start()  # (as the command line does)
    threading.Timer(0.7, done.set).start()
    wait(done)  # the Ctrl-C comes in here and is held back
    time.sleep(4 * _spark._REDELIVER)  # no KeyboardInterrupt here
    assert _spark.interrupted()


def test_a_ctrl_c_outside_a_client_call_raises_at_once(
    installed: Callable[[bool], Session],
) -> None:
    session = installed(True)
    threading.Timer(0.2, signal.raise_signal, (signal.SIGINT,)).start()
    with pytest.raises(KeyboardInterrupt):
        time.sleep(5)
    assert session.interrupted.wait(5)


def test_a_second_ctrl_c_raises_even_inside_a_call(
    installed: Callable[[bool], Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The user's way out of a call that does not return: the second Ctrl-C is not held back.
    # (No delivery again meanwhile: it would come in this test's own frame.)
    monkeypatch.setattr(_spark, "_REDELIVER", 60.0)
    installed(True)
    handler = signal.getsignal(signal.SIGINT)
    assert callable(handler)
    inside = frames("grpc._channel", "pyspark.sql.connect.streaming.query", "__main__")
    assert handler(signal.SIGINT, inside) is None
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, inside)


def test_a_classic_session_raises_at_once_inside_any_call(
    installed: Callable[[bool], Session],
) -> None:
    installed(False)
    handler = signal.getsignal(signal.SIGINT)
    assert callable(handler)
    with pytest.raises(KeyboardInterrupt):
        handler(signal.SIGINT, frames("grpc._channel", "py4j.clientserver"))


@pytest.mark.parametrize(
    ("modules", "inside"),
    [
        (("grpc._channel", "pyspark.sql.connect.client.core", "__main__"), True),
        (("pyspark.sql.connect.client.reattach", "__main__"), True),
        (("pyspark.sql.connect.dataframe", "purgatory.pipeline._job_follow"), False),
        (("py4j.java_gateway", "__main__"), False),
        ((), False),
    ],
)
def test_what_counts_as_a_client_call(modules: tuple[str, ...], inside: bool) -> None:
    assert _spark._in_client_call(frames(*modules)) is inside
