"""A real uvicorn server and a real HTTP client, for the tests of ASGI applications.

The server runs in the test's own event loop on a free loopback port, so a test reads the
application's state directly; the client (httpx) talks to it over TCP, so a client that goes away
is a real socket close. Every wait is bounded by `BOUND`, so a broken server fails instead of
hanging.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
import uvicorn
from helpers import until

__all__ = ("BOUND", "client", "exits_cleanly", "uvicorn_serving", "uvicorn_url")

#: Seconds: the bound of every wait on the server or the client.
BOUND = 10


@asynccontextmanager
async def uvicorn_serving(
    app: Callable[..., Any], *, lifespan: Literal["on", "off"]
) -> AsyncIterator[tuple[uvicorn.Server, str]]:
    """Run `app` under uvicorn on a free 127.0.0.1 port; yield the server and its URL."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,  # the kernel picks a free port
        lifespan=lifespan,
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=BOUND,
    )
    server = uvicorn.Server(config)
    running = asyncio.create_task(server.serve())
    await until(lambda: server.started or running.done(), "started", BOUND)
    assert server.started, "uvicorn did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(running, BOUND)


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client: building one costs 30 ms, and these URLs are http."""
    return ssl.create_default_context()


def client() -> httpx.AsyncClient:
    """A client whose own timeout is longer than any wait of the tests."""
    return httpx.AsyncClient(timeout=httpx.Timeout(BOUND * 3), verify=_tls())


async def uvicorn_url(
    process: asyncio.subprocess.Process, bound: float = BOUND
) -> tuple[str, list[str]]:
    """The URL a uvicorn process (its stderr piped) serves on, once it says so; its log so far."""
    assert process.stderr is not None
    log: list[str] = []
    async with asyncio.timeout(bound):
        while "Uvicorn running on" not in (log[-1] if log else ""):
            line = (await process.stderr.readline()).decode()
            assert line, f"uvicorn ended before it served: {log}"
            log.append(line.rstrip("\n"))
    return log[-1].split("Uvicorn running on ", 1)[1].split()[0], log


async def exits_cleanly(
    process: asyncio.subprocess.Process, log: list[str], bound: float = BOUND
) -> None:
    """A uvicorn process told to stop exits 0 with no traceback or error in its log (`log`, the
    lines read so far, gets the rest)."""
    assert process.stderr is not None
    async with asyncio.timeout(bound):
        rest = (await process.stderr.read()).decode()
        returncode = await process.wait()
    log.extend(rest.splitlines())
    assert returncode == 0, log
    assert not any("Traceback" in line or "ERROR" in line for line in log), log
