"""`purgatory.asgi`: a parked request is tied to its connection, on a real server and alone.

The server tests run a plain ASGI application (no framework) under a real uvicorn on a free
loopback port, in the test's own event loop, and a real HTTP client (httpx) over TCP: a client
that goes away is a real socket close, and only uvicorn's ``http.disconnect`` tells the handler.
The other tests drive `cancel_on_disconnect` with a hand-made ``receive``, on event loops in
virtual time (conftest.py). The server tests run on the real clock (marked ``realclock``): their
loop waits on real sockets, and a virtual clock would fire the server's and the client's pending
timeouts instead of waiting for the other end; their bounds only turn a hang into a failure.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import httpx
import pytest
import uvicorn
from helpers import FlagOperation, until
from http_support import BOUND, client, uvicorn_serving

from purgatory import DelayedOperationPurgatory, OperationCancelled, PurgatoryClosed
from purgatory.asgi import (
    CLIENT_CLOSED_REQUEST,
    ClientDisconnected,
    Message,
    Receive,
    cancel_on_disconnect,
    drain_on_signals,
    wait_for_disconnect,
)

pytestmark = pytest.mark.virtualclock

Scope = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
Handler = asyncio.Task[str]


class LongPoll:
    """A plain ASGI application: each request parks a `FlagOperation` on the key ``"k"``.

    It records how each request ended (``"answered"``, ``"disconnected"``) and sets `ended`.
    """

    def __init__(self, purgatory: DelayedOperationPurgatory[FlagOperation]) -> None:
        self.purgatory = purgatory
        self.operations: list[FlagOperation] = []
        self.outcomes: list[str] = []
        self.ended = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        op = FlagOperation(timeout=60)
        self.operations.append(op)
        try:
            result = await cancel_on_disconnect(receive, self.purgatory.watch(op, ["k"]))
        except ClientDisconnected:
            self.outcomes.append("disconnected")
            await send({"type": "http.response.start", "status": CLIENT_CLOSED_REQUEST})
            await send({"type": "http.response.body", "body": b""})
            return
        finally:
            self.ended.set()
        self.outcomes.append("answered")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": result.encode()})


class Parked(NamedTuple):
    """What `one_parked_request` yields."""

    purgatory: DelayedOperationPurgatory[FlagOperation]
    app: LongPoll
    server: uvicorn.Server
    poll: asyncio.Task[httpx.Response]


@asynccontextmanager
async def one_parked_request() -> AsyncIterator[Parked]:
    """`LongPoll` under a real server, and one real client's request parked in it."""
    async with DelayedOperationPurgatory[FlagOperation]("asgi") as purgatory:
        app = LongPoll(purgatory)
        async with uvicorn_serving(app, lifespan="off") as (server, base), client() as http:
            poll = asyncio.create_task(http.get(f"{base}/"))
            await until(lambda: purgatory.num_delayed() == 1, "parked", BOUND)
            yield Parked(purgatory, app, server, poll)


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_a_client_that_disconnects_mid_wait_cancels_its_operation() -> None:
    async with one_parked_request() as (purgatory, app, server, poll):
        poll.cancel()  # httpx closes the socket mid-response, as a closed tab would
        await asyncio.wait((poll,), timeout=BOUND)
        assert poll.cancelled()
        async with asyncio.timeout(BOUND):
            await app.ended.wait()  # set only once the handler's wait has ended
        (op,) = app.operations
        assert app.outcomes == ["disconnected"]
        assert op.is_cancelled
        assert not op.is_completed
        assert op.calls == []
        assert purgatory.num_delayed() == 0
        assert purgatory.statistics().cancelled == 1
        assert purgatory.cancel_for_key("k") == []  # nothing left pending on the key
        await until(lambda: not server.server_state.tasks, "handler finished", BOUND)


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_a_client_that_stays_gets_the_outcome() -> None:
    async with one_parked_request() as (purgatory, app, _, poll):
        app.operations[0].ready = True
        assert purgatory.check_and_complete("k") == 1
        response = await asyncio.wait_for(poll, BOUND)
        assert (response.status_code, response.text) == (200, "op done")
        assert app.outcomes == ["answered"]
        stats = purgatory.statistics()
        assert (stats.completed, stats.cancelled, stats.delayed) == (1, 0, 0)


def receive_from(*messages: Message) -> tuple[Receive, asyncio.Event]:
    """A ``receive`` that returns `messages`, then blocks until the returned event is set."""
    queue = list(messages)
    gone = asyncio.Event()

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    return receive, gone


@asynccontextmanager
async def parked_handler(
    receive: Receive,
) -> AsyncIterator[tuple[DelayedOperationPurgatory[FlagOperation], FlagOperation, Handler, int]]:
    """`cancel_on_disconnect` over a parked watch, run as a task: the purgatory, the operation,
    the handler's task, and how many tasks the loop then has."""
    async with DelayedOperationPurgatory[FlagOperation]("asgi") as purgatory:
        op = FlagOperation(timeout=60)
        handler = asyncio.create_task(cancel_on_disconnect(receive, purgatory.watch(op, ["k"])))
        await until(lambda: purgatory.num_delayed() == 1, "parked")
        yield purgatory, op, handler, len(asyncio.all_tasks())


@pytest.mark.asyncio
async def test_the_disconnect_cancels_the_operation_before_the_helper_returns() -> None:
    receive, gone = receive_from({"type": "http.request", "body": b"", "more_body": False})
    async with parked_handler(receive) as (purgatory, op, handler, tasks):
        gone.set()
        with pytest.raises(ClientDisconnected):
            await handler
        assert op.is_cancelled  # already: no waiting for it
        assert purgatory.num_delayed() == 0
        assert len(asyncio.all_tasks()) == tasks - 3  # the handler and its two tasks are gone


@pytest.mark.asyncio
async def test_when_the_handler_itself_is_cancelled_both_tasks_go_with_it() -> None:
    """A server that does cancel its handler: the operation is cancelled with it, at once."""
    receive, _ = receive_from()  # the client never leaves
    async with parked_handler(receive) as (purgatory, op, handler, tasks):
        handler.cancel()
        await asyncio.wait((handler,), timeout=BOUND)
        assert handler.cancelled()
        assert op.is_cancelled
        assert purgatory.num_delayed() == 0
        assert purgatory.statistics().cancelled == 1
        assert len(asyncio.all_tasks()) == tasks - 3  # the handler and its two tasks are gone


@pytest.mark.asyncio
async def test_a_failing_receive_propagates_and_cancels_the_watch() -> None:
    """An error from ``receive()`` is not a disconnect: it propagates; the watch is cancelled."""

    async def receive() -> Message:
        raise ConnectionResetError("receive failed")

    async with DelayedOperationPurgatory[FlagOperation]("asgi") as purgatory:
        op = FlagOperation(timeout=60)
        with pytest.raises(ConnectionResetError, match="receive failed"):
            await cancel_on_disconnect(receive, purgatory.watch(op, ["k"]))
        assert op.is_cancelled
        assert purgatory.num_delayed() == 0


@pytest.mark.asyncio
async def test_the_outcome_wins_a_tie_with_the_disconnect() -> None:
    """Both ready in the same loop iteration: the caller gets the outcome, not the error."""
    receive, _ = receive_from({"type": "http.disconnect"})
    async with DelayedOperationPurgatory[FlagOperation]("asgi") as purgatory:
        op = FlagOperation(timeout=60)
        op.ready = True  # completes inside the watch call, without suspending
        assert await cancel_on_disconnect(receive, purgatory.watch(op, ["k"])) == "op done"
        assert op.is_completed


@pytest.mark.asyncio
async def test_what_the_awaitable_raises_propagates() -> None:
    receive, gone = receive_from()
    async with DelayedOperationPurgatory[FlagOperation]("asgi") as purgatory:
        op = FlagOperation(timeout=60)
        handler = asyncio.create_task(cancel_on_disconnect(receive, purgatory.watch(op, ["k"])))
        await until(lambda: purgatory.num_delayed() == 1, "parked")
        tasks = len(asyncio.all_tasks())
        assert purgatory.cancel_for_key("k") == [op]
        with pytest.raises(OperationCancelled):
            await handler
        assert len(asyncio.all_tasks()) == tasks - 3  # the listener is gone too
    with pytest.raises(PurgatoryClosed):
        await cancel_on_disconnect(receive, purgatory.watch(FlagOperation(60), ["k"]))
    assert not gone.is_set()


@pytest.mark.asyncio
async def test_wait_for_disconnect_skips_other_messages() -> None:
    receive, gone = receive_from(
        {"type": "http.request", "body": b"a", "more_body": True},
        {"type": "http.request", "body": b"b", "more_body": False},
    )
    waiting = asyncio.create_task(wait_for_disconnect(receive))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not waiting.done()
    gone.set()
    await asyncio.wait_for(waiting, BOUND)
    assert waiting.done()


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_a_stop_the_server_registered_with_the_loop_stays_in_place() -> None:
    """hypercorn and granian's workers register their stop with ``loop.add_signal_handler``
    before the lifespan starts: the signal drains the purgatory and still stops the server, and
    after the block the server's handler alone answers the signal (on asyncio and on uvloop,
    whose stand-ins for such handlers differ)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)  # the server's
    try:
        async with DelayedOperationPurgatory[FlagOperation]("asgi") as purgatory:
            with drain_on_signals(purgatory):
                waiting = asyncio.create_task(purgatory.watch(FlagOperation(60), ["k"]))
                await until(lambda: purgatory.num_delayed() == 1, "parked", BOUND)
                signal.raise_signal(signal.SIGTERM)
                assert await asyncio.wait_for(waiting, BOUND) == "op done"  # drained
                await asyncio.wait_for(stopping.wait(), BOUND)  # and the server told
            stopping.clear()
            signal.raise_signal(signal.SIGTERM)
            await asyncio.wait_for(stopping.wait(), BOUND)
            assert purgatory.statistics().drained == 1  # the one request, in the block
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_a_plain_handler_is_restored_after_the_block() -> None:
    """uvicorn's handler is a plain one (``signal.signal``): called with SIGINT from the block's,
    and back in place once the block is left."""
    handed: list[int] = []

    def server(signum: int, frame: object) -> None:
        handed.append(signum)

    previous = signal.signal(signal.SIGTERM, server)
    try:
        async with DelayedOperationPurgatory[FlagOperation]("asgi") as purgatory:
            with drain_on_signals(purgatory):
                assert signal.getsignal(signal.SIGTERM) is not server
                signal.raise_signal(signal.SIGTERM)
            assert signal.getsignal(signal.SIGTERM) is server
            signal.raise_signal(signal.SIGTERM)
        assert handed == [signal.SIGINT, signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_helper_needs_no_framework() -> None:
    """``import purgatory.asgi`` imports the standard library only (no Starlette, no uvicorn)."""
    check = (
        "import sys, purgatory.asgi; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'starlette', 'uvicorn', 'fastapi', 'httpx', 'anyio'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
