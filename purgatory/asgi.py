"""Tie a parked request to its HTTP connection, for handlers served by an ASGI server.

A long-poll handler parks its request with ``await purgatory.watch(op, keys)``. Cancelling the
task that awaits ``watch`` cancels the operation, but an ASGI server need not cancel a handler
whose client went away, and uvicorn, hypercorn and granian do not: they report the disconnect
only as an ``http.disconnect`` message from ``receive()``, which a handler parked in ``watch``
never calls. The operation then stays in the purgatory until it completes or expires,
and the answer is written to nobody.

`cancel_on_disconnect` races the watch against that message and cancels the loser::

    from purgatory.asgi import (
        CLIENT_CLOSED_REQUEST, ClientDisconnected, cancel_on_disconnect,
    )

    async def fetch(request: Request) -> Response:
        op = DelayedFetch(int(request.query_params["offset"]), timeout=30.0)
        try:
            result = await cancel_on_disconnect(
                request.receive, purgatory.watch(op, ["topic-0"])
            )
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it
        return JSONResponse(result)

At shutdown, a server waits for its open requests before it stops, and a parked request is
open until its timeout. `drain_on_signals`, entered in the application's lifespan, answers them
all as the server's shutdown signal arrives (each awaiting ``watch`` returns its
``on_complete`` value, as on expiry), so the server's wait ends at once.

This module uses only the standard library: ``receive`` is any ASGI receive callable
(Starlette's and FastAPI's ``request.receive``, or the one a raw ASGI application is given).
Both helpers are tested under uvicorn, hypercorn (``--workers 0``) and granian, each behind no
middleware, a Starlette ``BaseHTTPMiddleware`` and a plain ASGI one.
The documentation's "Long-poll over HTTP" and "Serving with Starlette and FastAPI" pages show
complete applications and how to test them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

if TYPE_CHECKING:
    from ._purgatory import DelayedOperationPurgatory

__all__ = (
    "CLIENT_CLOSED_REQUEST",
    "ClientDisconnected",
    "Message",
    "Receive",
    "cancel_on_disconnect",
    "drain_on_signals",
    "wait_for_disconnect",
)

T = TypeVar("T")

Message: TypeAlias = MutableMapping[str, Any]
"""An ASGI event, as ``receive()`` returns it (the same type as Starlette's ``Message``)."""

Receive: TypeAlias = Callable[[], Awaitable[Message]]
"""An ASGI ``receive`` callable (the same type as Starlette's ``Receive``)."""

CLIENT_CLOSED_REQUEST: Final = 499
"""nginx's status for "client closed request", for the response to a client that is gone.

An ASGI server drops whatever is sent after the disconnect; the status only shows in logs.
"""


class ClientDisconnected(Exception):
    """The client closed its connection before the awaited outcome was ready.

    Raised by `cancel_on_disconnect`, which has cancelled the awaited watch (and so the
    operation) by then. It is not a `purgatory.PurgatoryError`: nothing went wrong in the
    purgatory, the request simply has nobody left to answer.
    """


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the ASGI server reports that the client closed the connection.

    After the request body, the next ``receive()`` blocks until it returns
    ``http.disconnect`` (uvicorn also returns it once the response is sent, so this never
    outlives the request). Other messages (the rest of a body nobody read) are skipped.

    Args:
        receive: The request's ASGI ``receive``.
    """
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(receive: Receive, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, but cancel it and raise `ClientDisconnected` if the client goes first.

    Racing the watch against the disconnect ties the operation to the connection: when the
    client goes, the task awaiting ``watch`` is cancelled, which cancels the operation (it
    leaves the timer at once, ``num_delayed()`` drops, ``statistics().cancelled`` counts it; it
    leaves the watcher lists at the next purge). When this function returns or raises, by any
    path, neither of its two tasks is still running: if the caller itself is cancelled (a server
    that does cancel handlers, a forced shutdown, an ``asyncio.timeout``), both are cancelled and
    the `CancelledError` propagates.

    If the outcome and the disconnect arrive in the same loop iteration, the outcome wins.

    Cost: two Tasks per parked request (the awaitable and the listener) on top of the handler's
    own; the purgatory itself still has no task or timer per operation.

    Args:
        receive: The request's ASGI ``receive`` (``request.receive`` in Starlette and FastAPI).
            Read the request body first (``await request.body()``): this consumes ``receive``.
        awaitable: What to wait for, typically ``purgatory.watch(op, keys)``. A coroutine is
            wrapped in a Task at once.

    Returns:
        What `awaitable` returned.

    Raises:
        ClientDisconnected: The client closed the connection first; `awaitable` was cancelled.
        Exception: Whatever `awaitable` raised (``OperationCancelled``, ``PurgatoryClosed``,
            ``PurgatoryFull``, an error of ``on_complete``), or whatever ``receive()`` raised.
    """
    watching = asyncio.ensure_future(awaitable)
    listening = asyncio.ensure_future(wait_for_disconnect(receive))
    # The listener's end (a disconnect, or receive() failing) cancels the watch, and so the
    # operation. One callback and a plain await: no asyncio.wait, whose futures and callbacks
    # per call cost more than the rest together when thousands of clients leave at once.
    listening.add_done_callback(lambda _: watching.cancel())
    current = asyncio.current_task()
    cancels = current.cancelling() if current is not None else 0
    try:
        return await watching
    except asyncio.CancelledError:
        if not listening.done() or (current is not None and current.cancelling() > cancels):
            raise  # this coroutine itself was cancelled (the caller, a server, a timeout)
    except Exception:
        if not listening.done() or listening.cancelled():
            raise  # the awaitable's own error
        # an error the watch raised as the disconnect cancelled it: the disconnect is the news
    finally:
        # Also reached when this coroutine is cancelled: neither task may outlive it.
        watching.cancel()  # a no-op unless this coroutine itself was cancelled
        if not listening.done():
            listening.cancel()
            try:
                await listening
            except asyncio.CancelledError:
                if current is not None and current.cancelling() > cancels:
                    raise  # this coroutine was cancelled meanwhile: that goes on
            except Exception:  # noqa: BLE001
                pass  # receive() failed as the outcome came: the outcome wins
    failed = None if listening.cancelled() else listening.exception()
    if failed is not None:
        raise failed  # receive() itself failed: that is not a disconnect
    raise ClientDisconnected


#: The signals a server stops on: ``kill``'s default and Ctrl-C.
SHUTDOWN_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)

_Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


def _stands_in_for_loop(handler: _Handler, loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `handler` is the stand-in an event loop installs for ``loop.add_signal_handler``.

    The loop then runs the real handler itself, from the signal number its wakeup descriptor
    receives: asyncio installs a module-level no-op, uvloop a method of the loop. A server that
    registers its stop that way (hypercorn, granian's workers) would lose it if this module
    registered its own handler with the loop (a loop keeps one per signal), so such a handler is
    left in place and called as it stands.
    """
    if getattr(handler, "__self__", None) is loop:  # uvloop: Loop.__sighandler
        return True
    return (
        getattr(handler, "__module__", None) == "asyncio.unix_events"
        and getattr(handler, "__name__", None) == "_sighandler_noop"
    )


@contextlib.contextmanager
def drain_on_signals(
    *purgatories: DelayedOperationPurgatory[Any],
    signals: Iterable[int] = SHUTDOWN_SIGNALS,
    forward: int | None = signal.SIGINT,
) -> Iterator[None]:
    """While in the block, a shutdown signal first answers every parked request, then goes on to
    the server: for the application's lifespan.

    Servers stop in order: on SIGTERM or Ctrl-C they stop accepting connections, wait for the
    open ones (a parked request is open until its timeout), and only then run the lifespan's
    shutdown. This answers the parked requests as the signal arrives: each purgatory is drained
    (`purgatory.DelayedOperationPurgatory.drain`: each awaiting ``watch`` returns its
    ``on_complete`` value, as on expiry; requests still arriving are answered at once), and
    the signal goes on to the handler that was in place before (the server's), whose wait now
    ends at once. Use it inside the lifespan, around its ``yield``, where the server has
    installed its own handlers (it is a plain context manager: ``with``, inside the purgatory's
    ``async with``)::

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with Waiters("messages") as waiters:
                app.state.waiters = waiters
                with drain_on_signals(waiters):
                    yield

    The drain runs on the event loop (scheduled with ``loop.call_soon_threadsafe``), never
    between two bytecodes of the purgatory's own code; the server's handler runs as it would
    have without this block: a plain signal handler (uvicorn's) is called from this one, a
    handler the server registered with the loop (hypercorn's, granian's) is left to the loop,
    which runs it on the same signal. On leaving the block the previous handlers are restored.
    Outside the main thread (a test client's thread, say), where no signal arrives, it does
    nothing. It needs the signal to reach the process that serves: a server whose supervisor
    takes the signal and stops its worker processes another way (hypercorn's workers, unless
    ``--workers 0``) never shows it to the application.

    Args:
        purgatories: What to drain on the first signal (one already shut down is skipped).
        signals: The signals to answer; default SIGTERM and SIGINT.
        forward: The signal handed on to a plain previous handler, whichever arrived: SIGINT by
            default, the graceful stop of a Ctrl-C (uvicorn then exits 0; handed SIGTERM, it
            stops as gracefully, then raises SIGTERM again as it exits: status 143). ``None``
            hands on the signal that arrived. A handler registered with the loop always gets
            the signal that arrived.

    Raises:
        RuntimeError: Not inside a running event loop.
    """
    loop = asyncio.get_running_loop()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    chosen = tuple(signals)
    previous = {sig: signal.getsignal(sig) for sig in chosen}

    def drain() -> None:
        for purgatory in purgatories:
            if not purgatory.closed:
                purgatory.drain()

    def on_signal(received: int, frame: FrameType | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is parked
            loop.call_soon_threadsafe(drain)
        handler = previous[received]
        if callable(handler) and _stands_in_for_loop(handler, loop):
            handler(received, frame)  # the loop itself runs the server's handler
            return
        handed = received if forward is None else forward
        if callable(handler):
            handler(handed, frame)
        elif handler == signal.SIG_DFL and handed == signal.SIGINT:
            raise KeyboardInterrupt  # as Python's own handler would
        elif handler == signal.SIG_DFL:
            signal.signal(received, signal.SIG_DFL)
            signal.raise_signal(handed)

    for sig in chosen:
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig in chosen:
            if signal.getsignal(sig) is on_signal:  # not replaced since: put back what was
                signal.signal(sig, previous[sig])
