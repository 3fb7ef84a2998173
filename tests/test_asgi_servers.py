"""`drain_on_signals` and `cancel_on_disconnect` under uvicorn, hypercorn and granian.

Each test serves benchmarks/asgi_drain.py's application (Starlette; the purgatory in its
lifespan under `drain_on_signals`; each request parked through `cancel_on_disconnect`) with a
real server in a process of its own on 127.0.0.1, run as a user runs it, with no middleware, a
Starlette `BaseHTTPMiddleware`, or the same middleware in plain ASGI in front; the client is raw
asyncio sockets, `CONNECTIONS` of them. The bounds are generous (the machine is shared): every
request answered, exit 0, within `BOUND`; ``python -m benchmarks.asgi_drain`` measures the
1-second targets with 10,000 connections.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks.asgi_drain import (
    HYPERCORN_WORKERS,
    MIDDLEWARES,
    SERVERS,
    Disconnected,
    Drained,
    measure_disconnect,
    measure_drain,
    raise_fd_limit,
    serving,
)

#: Parked requests per test: enough to show a server answers them all, few enough for 2 cores.
CONNECTIONS = 500
#: Seconds: the bound of each measurement, far above what a quiet machine needs (well under 1 s).
BOUND = 60.0
#: Each server with each middleware in front (plain test functions running their own loop: the
#: client's loop is not what is tested, so not every loop of conftest.py).
EVERY = pytest.mark.parametrize(
    ("server", "middleware"), [(s, m) for s in SERVERS for m in MIDDLEWARES]
)


@pytest.fixture(scope="module", autouse=True)
def descriptors() -> None:
    """Room for the client's sockets and, inherited, the server's."""
    assert raise_fd_limit(4 * CONNECTIONS) >= 2 * CONNECTIONS + 100


def drained(server: str, middleware: str, log: Path) -> Drained:
    async def measure() -> Drained:
        async with serving(server, middleware, log) as served:
            return await measure_drain(served, CONNECTIONS, BOUND)

    return asyncio.run(measure())


def disconnected(server: str, middleware: str, log: Path, route: str, count: int) -> Disconnected:
    async def measure() -> Disconnected:
        async with serving(server, middleware, log) as served:
            return await measure_disconnect(served, count, BOUND, route)

    return asyncio.run(measure())


@EVERY
def test_sigterm_answers_every_parked_request_and_the_server_exits_0(
    server: str, middleware: str, tmp_path: Path
) -> None:
    log = tmp_path / "server.log"
    result = drained(server, middleware, log)
    assert result.answered == CONNECTIONS, result
    assert result.returncode == 0, log.read_text()
    assert result.log_errors == [], log.read_text()
    assert result.exit_s < BOUND


@EVERY
def test_every_client_that_leaves_cancels_its_operation(
    server: str, middleware: str, tmp_path: Path
) -> None:
    result = disconnected(server, middleware, tmp_path / "server.log", "park", CONNECTIONS)
    assert result.disconnected == CONNECTIONS, result
    assert (result.cancelled, result.delayed, result.handlers_cancelled) == (CONNECTIONS, 0, 0)


def test_hypercorn_with_its_worker_process_cannot_drain(tmp_path: Path) -> None:
    """What docs/asgi.md says: with hypercorn's default worker process, the signal goes to its
    supervisor, the application never sees it, and the parked requests are cut off unanswered
    once hypercorn's ``graceful_timeout`` (3 s) has passed: hence ``--workers 0``."""
    log = tmp_path / "server.log"

    async def measure() -> Drained:
        async with serving(HYPERCORN_WORKERS, "none", log) as served:
            return await measure_drain(served, POLLERS, BOUND)

    result = asyncio.run(measure())
    assert result.answered == 0, result
    assert result.last_answer_s >= 2.5, result  # cut at the graceful timeout, not drained
    assert result.returncode == 0, log.read_text()


#: Handlers asking ``request.is_disconnected()`` in a loop, the other common way.
POLLERS = 20


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(("middleware", "seen"), [("base-http", 0), ("pure-asgi", POLLERS)])
def test_base_http_middleware_hides_the_disconnect_from_is_disconnected(
    server: str, middleware: str, seen: int, tmp_path: Path
) -> None:
    """What docs/asgi.md says: behind a `BaseHTTPMiddleware`, ``request.is_disconnected()``
    never turns true on any of the three servers (its zero-timeout ``receive`` never gets the
    message through the middleware), while the plain ASGI middleware lets it through and
    `cancel_on_disconnect` (which waits on ``receive``) sees it either way (the test above)."""
    result = disconnected(server, middleware, tmp_path / "server.log", "poll", POLLERS)
    assert result.disconnected == seen, result
