"""An HTTP long-poll fetch endpoint: Kafka's ``DelayedFetch`` behind Starlette on uvicorn.

``GET /fetch?topic=T&offset=N&min_bytes=B&max_wait_ms=W`` answers as soon as the topic holds at
least ``min_bytes`` bytes from ``offset`` on, or after ``max_wait_ms`` with whatever is there.
``POST /produce?topic=T`` appends the request body as one record and wakes the fetches parked on
that topic with ``check_and_complete(topic, size)``: each fetch watches its topic at the size
the topic must reach to satisfy it, so a produce re-tries only those it may satisfy.
``GET /stats`` shows the purgatory's gauges and counters.

A parked fetch is tied to its client's connection (``purgatory.asgi.cancel_on_disconnect``):
Starlette on uvicorn does not cancel a handler whose client went away, so without the tie an
abandoned fetch would stay in the purgatory until its ``max_wait_ms``. The service (the logs and
the purgatory) is created in the application's lifespan and kept on ``app.state``, so each start
of the application gets a purgatory of its own. The documentation's "Long-poll over HTTP" page
explains why and what it costs.

Run (needs the ``examples`` extra: ``pip install -e '.[examples]'``):
``python examples/long_poll_fetch.py --port 8080``, then for instance
``curl 'localhost:8080/fetch?topic=t&offset=0&min_bytes=1&max_wait_ms=5000'`` in one shell and
``curl -d hello 'localhost:8080/produce?topic=t'`` in another.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from purgatory import DelayedOperation, DelayedOperationPurgatory, OperationCancelled
from purgatory.asgi import (
    CLIENT_CLOSED_REQUEST,
    ClientDisconnected,
    cancel_on_disconnect,
    drain_on_signals,
)


class TopicLog:
    """One topic's records, and where each starts in bytes (a fetch's threshold is in bytes)."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.starts = [0]  # starts[i]: bytes before record i; starts[-1]: the topic's size

    def append(self, record: bytes) -> int:
        """Append `record`; return its offset."""
        self.records.append(record)
        self.starts.append(self.starts[-1] + len(record))
        return len(self.records) - 1

    @property
    def size(self) -> int:
        """Bytes in the topic: what ``check_and_complete(topic, reached)`` reports."""
        return self.starts[-1]

    def position(self, offset: int) -> int:
        """Bytes before `offset` (the size, for an offset not written yet)."""
        return self.starts[min(offset, len(self.records))]


class DelayedFetch(DelayedOperation[dict[str, object]]):
    """Completes once ``min_bytes`` are available past ``offset`` (Kafka's ``DelayedFetch``)."""

    def __init__(
        self, log: TopicLog, topic: str, offset: int, min_bytes: int, max_wait: float
    ) -> None:
        super().__init__(max_wait)
        self.log, self.topic, self.offset, self.min_bytes = log, topic, offset, min_bytes

    @property
    def threshold(self) -> int:
        """The topic size at which this fetch may complete: it is re-tried no earlier.

        Exact for an offset already written; for a later one a lower bound (the records up to
        it may still be empty), which only costs a re-try that says no.
        """
        return self.log.position(self.offset) + self.min_bytes

    def try_complete(self) -> bool:
        if self.log.size - self.log.position(self.offset) >= self.min_bytes:
            return self.force_complete()
        return False

    def on_complete(self) -> dict[str, object]:
        records = [record.decode() for record in self.log.records[self.offset :]]
        return {"records": records, "next_offset": self.offset + len(records)}


class FetchService:
    """The logs and the fetch purgatory: one per start of the application (see `make_app`).

    Args:
        tie_to_connection: Cancel a parked fetch when its client disconnects (the right thing;
            ``False`` is the naive handler, kept to show in the tests what it leaks).
        purge_interval: The purgatory's ``purge_interval``; 0 drops finished operations from
            the watcher lists on the next reaper pass, so ``watched()`` reads 0 at rest.
    """

    def __init__(self, *, tie_to_connection: bool = True, purge_interval: int = 1000) -> None:
        self.logs: defaultdict[str, TopicLog] = defaultdict(TopicLog)
        self.purgatory = DelayedOperationPurgatory[DelayedFetch](
            "fetch", purge_interval=purge_interval
        )
        self.tie_to_connection = tie_to_connection


def service_of(request: Request) -> FetchService:
    """The running application's service, which its lifespan put on ``app.state``."""
    service: FetchService = request.app.state.service
    return service


async def fetch(request: Request) -> Response:
    service = service_of(request)
    query = request.query_params
    topic = query["topic"]
    fetch = DelayedFetch(
        service.logs[topic],
        topic,
        offset=int(query.get("offset", "0")),
        min_bytes=int(query.get("min_bytes", "1")),
        max_wait=int(query.get("max_wait_ms", "500")) / 1000,
    )
    # A threshold watch: a produce re-tries only the fetches its bytes may satisfy.
    watching = service.purgatory.watch(fetch, {topic: fetch.threshold})
    try:
        if service.tie_to_connection:
            result = await cancel_on_disconnect(request.receive, watching)
        else:
            result = await watching
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except OperationCancelled as exc:  # cancel_for_key, or the purgatory shut down
        return JSONResponse({"error": f"fetch cancelled: {exc}"}, status_code=503)
    return JSONResponse({**result, "expired": fetch.is_expired})


async def produce(request: Request) -> Response:
    service = service_of(request)
    topic = request.query_params["topic"]
    log = service.logs[topic]
    offset = log.append(await request.body())
    woken = service.purgatory.check_and_complete(topic, log.size)
    return JSONResponse({"offset": offset, "woken": woken})


async def stats(request: Request) -> Response:
    """The purgatory's gauges and counters, to watch abandoned fetches come and go."""
    stats = service_of(request).purgatory.statistics()
    return JSONResponse(
        {
            "watched": stats.watched,
            "delayed": stats.delayed,
            "completed": stats.completed,
            "expired": stats.expired,
            "cancelled": stats.cancelled,
        }
    )


async def bad_request(request: Request, exc: Exception) -> Response:
    """A missing or malformed query parameter is the client's error, not a 500."""
    return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=400)


def make_app(*, tie_to_connection: bool = True, purge_interval: int = 1000) -> Starlette:
    """The ASGI application (``uvicorn --factory examples.long_poll_fetch:make_app`` works).

    Each start of the application (its lifespan) creates a new `FetchService`, puts it on
    ``app.state.service`` and shuts its purgatory down when the application stops: waiters get
    503, and a later start (a second test client on the same application) gets a new one.
    """

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.service = FetchService(
            tie_to_connection=tie_to_connection, purge_interval=purge_interval
        )
        # On SIGTERM or Ctrl-C, every parked fetch is answered at once (with what its topic
        # holds), then uvicorn stops: its wait for open connections ends at once.
        async with app.state.service.purgatory as purgatory:
            with drain_on_signals(purgatory):
                yield

    return Starlette(
        routes=[
            Route("/fetch", fetch, methods=["GET"]),
            Route("/produce", produce, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        exception_handlers={KeyError: bad_request, ValueError: bad_request},
        lifespan=lifespan,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    uvicorn.run(make_app(), host=args.host, port=args.port)
