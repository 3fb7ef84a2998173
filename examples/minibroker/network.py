"""Connections: framing, a task per request, answers in request order (Kafka's SocketServer).

One connection carries many requests in flight: each frame gets its own handler task as soon as
it is read, and a writer sends the answers in request order (Kafka's rule per connection). What
a request means is not this module's business: it hands each decoded `Request` to the handler
it was given (`apis.KafkaApis.handle`) and writes back the bytes it returns.

Bad input: a frame over ``max_request_bytes``, a negative size, an unreadable header or body
closes the connection (Kafka's ``InvalidReceiveException`` path); so does a handler raising
`CloseConnection` (a request with no answer a client could match) or failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import Awaitable, Callable

from kafka.protocol.schemas.fields.codecs import Int32

from purgatory import PurgatoryError

from .protocol import BadFrame, FetchRequest, Request, decode_request
from .stats import BrokerStats

__all__ = ("CloseConnection", "Handler", "SocketServer")

log = logging.getLogger("minibroker.network")

_MAX_IN_FLIGHT = 64  # requests read ahead of their answers on one connection

Handler = Callable[[Request], Awaitable[bytes | None]]
"""Answers one request: the framed response, or ``None`` when none is due (``acks=0``)."""


class CloseConnection(Exception):
    """Raised by a handler for a request that has no answer: the connection is closed."""


class SocketServer:
    """Listens on one address and serves each connection with `handler`."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        stats: BrokerStats,
        *,
        max_request_bytes: int,
    ) -> None:
        self.host = host
        self.port = port
        self._handler = handler
        self._stats = stats
        self._max_request_bytes = max_request_bytes
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

    async def start(self) -> None:
        """Listen; `port` is then the bound port. Raises `OSError` if the address is taken."""
        self._server = await asyncio.start_server(self._serve_connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close every connection; what they wait for is cancelled."""
        if self._server is not None:
            self._server.close()
        # Closing a connection's socket ends its reader, which cancels what that connection
        # still waits for; its task then ends normally (cancelling it would be logged).
        for writer in self._connections.values():
            writer.close()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        counters = self._stats.counters
        peer = writer.get_extra_info("peername")
        client_host = f"/{peer[0]}" if peer else ""
        answers: asyncio.Queue[tuple[asyncio.Task[bytes | None], str]]
        answers = asyncio.Queue(_MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send_in_order(answers, writer))
        try:
            while not sender.done():
                try:
                    size = Int32.decode(io.BytesIO(await reader.readexactly(4)))
                    if not 0 < size <= self._max_request_bytes:
                        counters["closed: frame size"] += 1
                        log.warning("closing a connection: frame size %d", size)
                        break
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                try:
                    request = decode_request(frame, client_host)
                except BadFrame as exc:
                    counters["closed: bad frame"] += 1
                    log.warning("closing a connection: %s", exc)
                    break
                # Counted apart, so that "every client request answered once" can be checked
                # while the followers' own fetches are still in flight.
                origin = _origin(request)
                counters[f"requests from {origin}"] += 1
                self._stats.sample_peaks()
                await answers.put((asyncio.create_task(self._answer(request)), origin))
        finally:
            # Whatever is still waiting is cancelled, and with it its purgatory operation.
            while not answers.empty():
                answers.get_nowait()[0].cancel()
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._connections.pop(task, None)

    async def _send_in_order(
        self,
        answers: asyncio.Queue[tuple[asyncio.Task[bytes | None], str]],
        writer: asyncio.StreamWriter,
    ) -> None:
        """Write each answer once it is ready, in request order; stop at a closing answer."""
        counters = self._stats.counters
        try:
            while True:
                pending, origin = await answers.get()
                try:
                    data = await pending
                except CloseConnection:
                    break
                if data is not None:
                    writer.write(data)
                    await writer.drain()
                    counters[f"responses to {origin}"] += 1
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _answer(self, request: Request) -> bytes | None:
        """The handler's answer; anything but an answer closes the connection."""
        try:
            return await self._handler(request)
        except (CloseConnection, asyncio.CancelledError):
            raise
        except PurgatoryError as exc:  # shutting down
            raise CloseConnection from exc
        except Exception as exc:  # a bug of ours: say so, and close this connection only
            log.exception("handler failed for api %d v%d", request.api_key, request.api_version)
            raise CloseConnection from exc


def _origin(request: Request) -> str:
    """``follower`` for a follower's requests (a fetch with a replica id >= 0, or the metadata
    requests of a client named ``minibroker-follower-*``), else ``client``."""
    if request.api_key == FetchRequest.API_KEY:
        replica = getattr(request.body, "replica_id", -1)
        if isinstance(replica, int) and replica >= 0:
            return "follower"
    if (request.client_id or "").startswith("minibroker-follower-"):
        return "follower"
    return "client"
