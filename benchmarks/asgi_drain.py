"""Drain and disconnect on three ASGI servers: uvicorn, hypercorn and granian, as processes.

``python -m benchmarks.asgi_drain`` serves one long-poll application (Starlette, the purgatory
in its lifespan under `purgatory.asgi.drain_on_signals`, each request parked through
`purgatory.asgi.cancel_on_disconnect`) under each server in a process of its own on 127.0.0.1,
with and without a middleware in front, and measures with raw sockets (10,000 connections
by default, one asyncio client):

- **drain**: N requests parked for 60 s, then SIGTERM to the server's process: how long until
  every client has its answer, and until the process is gone (the target: 1 s each);
- **disconnect**: N requests parked, then every client closes its socket: how many of the
  operations were cancelled within 1 s of their client's close (the target: 99.9 %), from
  the times the application records (``time.monotonic`` is one clock for every process);
- **poll**: the same disconnect, seen by handlers that ask ``request.is_disconnected()``
  every 10 ms instead (500 of them by default).

Beside each wall-clock figure, the CPU seconds the server's processes spent (and for the drain,
the client's): on a shared machine the load stretches the wall clock, much less the CPU. Each
server runs on its default event loop: uvloop for uvicorn and granian (it is installed),
asyncio for hypercorn.

The middlewares: ``none``; ``base-http``, a Starlette `BaseHTTPMiddleware` that only passes the
request on (what an application that adds a header that way has); ``pure-asgi``, the same as a
plain ASGI middleware, which passes ``receive`` through untouched. tests/test_asgi_servers.py
runs the same application, servers and client with 500 connections and generous bounds; this
script gives the figures, which depend on the machine's load (it prints ``/proc/loadavg``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from purgatory import DelayedOperation, DelayedOperationPurgatory
from purgatory.asgi import (
    CLIENT_CLOSED_REQUEST,
    ClientDisconnected,
    cancel_on_disconnect,
    drain_on_signals,
)

ROOT: Final = Path(__file__).resolve().parent.parent
SERVERS: Final = ("uvicorn", "hypercorn", "granian")
#: hypercorn as it runs by default, with a worker process: it cannot drain (see `command`).
HYPERCORN_WORKERS: Final = "hypercorn-workers"
MIDDLEWARES: Final = ("none", "base-http", "pure-asgi")
#: What a drained request answers (``on_complete``, as on expiry).
ANSWER: Final = "answered"
#: Seconds a request parks for: longer than any run (parking 10,000 behind a middleware on a
#: loaded machine takes minutes), so only a drain or a close ends it, never its expiry.
PARK_FOR: Final = 3600.0
#: Seconds to park the requests in, before any measurement: a server behind a
#: `BaseHTTPMiddleware` on a loaded machine takes minutes for 10,000.
PARKING_BOUND: Final = 900.0
#: Connections the server may queue before accepting them, and requests it may run at once.
BACKLOG: Final = 16384

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# -- the application, as the servers import it --------------------------------------------------


class Parked(DelayedOperation[str]):
    """Completes only when drained (or after `PARK_FOR`): what a long-poll waits for."""

    def try_complete(self) -> bool:
        return False

    def on_complete(self) -> str:
        return ANSWER


@dataclass
class Record:
    """What the application saw: when each request (by the client's id) was let go."""

    disconnected: dict[int, float] = field(default_factory=dict)
    polled: dict[int, float] = field(default_factory=dict)  # seen by request.is_disconnected()
    polling: int = 0  # handlers asking is_disconnected() now
    cancelled: int = 0  # handlers cancelled by the server itself (no answer, no disconnect)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    """The purgatory lives in the lifespan; a shutdown signal drains it (docs/asgi.md)."""
    app.state.record = Record()
    async with DelayedOperationPurgatory[Parked]("parked") as waiters:
        app.state.waiters = waiters
        with drain_on_signals(waiters):
            yield


async def park(request: Request) -> Response:
    """``GET /park?id=N``: parks until drained or until the client goes."""
    ident = int(request.query_params["id"])
    record: Record = request.app.state.record
    waiters: DelayedOperationPurgatory[Parked] = request.app.state.waiters
    try:
        answer = await cancel_on_disconnect(
            request.receive, waiters.watch(Parked(PARK_FOR), ["parked"])
        )
    except ClientDisconnected:
        record.disconnected[ident] = time.monotonic()
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    except asyncio.CancelledError:
        record.cancelled += 1
        raise
    return PlainTextResponse(answer)


async def poll(request: Request) -> Response:
    """``GET /poll?id=N``: waits, asking ``request.is_disconnected()`` every 10 ms: the other
    way handlers look for a client that left, which a `BaseHTTPMiddleware` in front defeats."""
    ident = int(request.query_params["id"])
    record: Record = request.app.state.record
    deadline = time.monotonic() + PARK_FOR
    record.polling += 1
    try:
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                record.polled[ident] = time.monotonic()
                return Response(status_code=CLIENT_CLOSED_REQUEST)
            await asyncio.sleep(0.01)
    finally:
        record.polling -= 1
    return PlainTextResponse("expired")


async def stats(request: Request) -> Response:
    """``GET /stats``: parked now, and how the others were let go (``?times=1``: each time)."""
    record: Record = request.app.state.record
    waiters: DelayedOperationPurgatory[Parked] = request.app.state.waiters
    counts = waiters.statistics()
    body: dict[str, Any] = {
        "delayed": waiters.num_delayed(),
        "cancelled": counts.cancelled,
        "completed": counts.completed,
        "expired": counts.expired,
        "disconnected": len(record.disconnected),
        "polled": len(record.polled),
        "polling": record.polling,
        "handlers_cancelled": record.cancelled,
    }
    if request.query_params.get("times"):
        body["times"] = record.disconnected
        body["polled_times"] = record.polled
    return JSONResponse(body)


class BaseHTTPPassThrough(BaseHTTPMiddleware):
    """A Starlette `BaseHTTPMiddleware` that adds a header: the layout that hides disconnects."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        response = await call_next(request)
        response.headers["x-middleware"] = "base-http"
        return response


class PureASGIPassThrough:
    """The same middleware in plain ASGI: ``receive`` goes to the application untouched, so the
    server's ``http.disconnect`` reaches `cancel_on_disconnect` (docs/asgi.md shows it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).append("x-middleware", "pure-asgi")
            await send(message)

        await self.app(scope, receive, send_with_header)


def make_app(middleware: str) -> Starlette:
    """The application with `middleware` (one of `MIDDLEWARES`) in front of its routes."""
    chosen = {
        "none": [],
        "base-http": [Middleware(BaseHTTPPassThrough)],
        "pure-asgi": [Middleware(PureASGIPassThrough)],
    }[middleware]
    return Starlette(
        routes=[Route("/park", park), Route("/poll", poll), Route("/stats", stats)],
        lifespan=lifespan,
        middleware=chosen,
    )


app_none = make_app("none")
app_base_http = make_app("base-http")
app_pure_asgi = make_app("pure-asgi")


# -- the servers ---------------------------------------------------------------------------------


def app_path(middleware: str) -> str:
    """The import path a server is given for the application with `middleware`."""
    return f"benchmarks.asgi_drain:app_{middleware.replace('-', '_')}"


def command(server: str, middleware: str, port: int) -> list[str]:
    """The command line that serves the application on 127.0.0.1:`port`, as a user would run
    it, but with room for the connections (backlog, concurrency) and quiet logs.

    hypercorn runs with ``--workers 0``: its default (one worker process, `server`
    ``hypercorn-workers`` here) has the supervisor take the signal and tell the worker through
    an event the application never sees, so no handler in the application can drain
    (docs/asgi.md says so).
    """
    python = sys.executable
    where = app_path(middleware)
    if server == "uvicorn":
        return [
            *(python, "-m", "uvicorn", where, "--host", "127.0.0.1", "--port", str(port)),
            *("--backlog", str(BACKLOG), "--log-level", "warning", "--no-access-log"),
        ]
    if server in {"hypercorn", "hypercorn-workers"}:
        workers = "0" if server == "hypercorn" else "1"  # 1: hypercorn's default
        return [
            *(python, "-m", "hypercorn", where, "--bind", f"127.0.0.1:{port}"),
            *("--workers", workers, "--backlog", str(BACKLOG), "--log-level", "warning"),
        ]
    if server == "granian":
        return [
            *(python, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1"),
            *("--port", str(port), "--workers", "1", "--backlog", str(BACKLOG)),
            *("--backpressure", str(BACKLOG), "--log-level", "warning", where),
        ]
    raise ValueError(f"unknown server {server!r}")


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit (and so its children's) towards `wanted`; return
    the limit now in force. Each connection is a descriptor in the client and one in the
    server; many systems start at 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def free_port() -> int:
    """A loopback port free now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Served:
    """A server process and where it listens; its log goes to a file (`log`)."""

    server: str
    process: asyncio.subprocess.Process
    port: int
    log: Path

    def lines(self) -> list[str]:
        return self.log.read_text(errors="replace").splitlines()


async def request(port: int, target: str, bound: float = 10) -> tuple[int, bytes]:
    """One ``GET`` on a connection of its own; its status and body."""
    async with asyncio.timeout(bound):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_get(target))
            raw = await reader.read()
        finally:
            writer.close()
    return _parse(raw)


@asynccontextmanager
async def serving(
    server: str, middleware: str, log: Path, bound: float = 60
) -> AsyncIterator[Served]:
    """`server` serving the application with `middleware`, once it answers; on leaving, the
    process is killed if it is still there."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), *sys.path)))}
    with log.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            *command(server, middleware, port),
            cwd=ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            start_new_session=True,  # its own process group: granian's worker goes with it
        )
    served = Served(server, process, port, log)
    try:
        async with asyncio.timeout(bound):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"{server} exited: {served.lines()}")
                with contextlib.suppress(OSError):
                    if (await request(port, "/stats"))[0] == 200:
                        break
                await asyncio.sleep(0.1)
        yield served
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever of the group is left
        await process.wait()


# -- the client ----------------------------------------------------------------------------------


def _get(target: str) -> bytes:
    return f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()


def _parse(raw: bytes) -> tuple[int, bytes]:
    """Status and body of a whole ``Connection: close`` response (0 if there was none)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        return 0, raw
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return int(parts[1]), body


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out, body = out + body[:size], body[size + 2 :]
    return out


@dataclass
class Poll:
    """One parked request: its connection, and when it was closed or answered."""

    ident: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    closed_at: float = 0.0


async def stats_of(port: int, bound: float = 60) -> dict[str, Any]:
    """The application's ``/stats`` (within `bound`: a server busy with 10,000 connections on
    a loaded machine may take seconds to get to it)."""
    status, body = await request(port, "/stats", bound)
    assert status == 200, (status, body)
    found: dict[str, Any] = json.loads(body)
    return found


#: What the application counts while a request of each route waits, and once its client left.
WAITING: Final = {
    "park": ("delayed", "disconnected", "times"),
    "poll": ("polling", "polled", "polled_times"),
}


async def park_all(
    port: int, count: int, bound: float, route: str = "park", concurrency: int = 256
) -> list[Poll]:
    """`count` clients, each with a request waiting on `route` (``park``: in the purgatory;
    ``poll``: asking ``is_disconnected()``), as the application says, within `bound`."""
    waiting = WAITING[route][0]
    gate = asyncio.Semaphore(concurrency)

    async def one(ident: int) -> Poll:
        async with gate:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_get(f"/{route}?id={ident}"))
            await writer.drain()
        return Poll(ident, reader, writer)

    async with asyncio.timeout(bound):
        polls = await asyncio.gather(*(one(ident) for ident in range(count)))
        while (await stats_of(port))[waiting] < count:
            await asyncio.sleep(0.05)
    return polls


@dataclass
class Drained:
    """What a SIGTERM with `parked` requests gave."""

    parked: int
    answered: int  # 200 with the drained answer
    last_answer_s: float  # after the signal
    exit_s: float  # the process gone, after the signal
    returncode: int
    log_errors: list[str]
    server_cpu_s: float  # the server's processes' CPU time from the signal to their exit
    client_cpu_s: float  # this client's CPU time from the signal to the last answer


@dataclass
class Disconnected:
    """What `parked` clients closing their connections gave."""

    parked: int
    disconnected: int  # handlers that saw the disconnect (ClientDisconnected)
    within_1s: int  # of those, how many within 1 s of their client's close
    slowest_s: float  # the slowest of those, after its client's close
    closing_s: float  # how long this client took to close them all (part of the latencies)
    cancelled: int  # operations the purgatory counts cancelled
    expired: int  # operations the purgatory counts expired (none, unless parking was slow)
    delayed: int  # operations still parked at the end
    handlers_cancelled: int  # handlers the server cancelled itself
    server_cpu_s: float  # the server's processes' CPU time from the closes to the last seen


def group_pids(pgid: int) -> list[int]:
    """The processes of process group `pgid` (the server and, for granian, its worker): Linux's
    ``/proc``, read once (a server starts no process while it stops)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                found.append(int(stat.parent.name))
    return found


def cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds of `pids` so far (those gone count nothing)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class CPUMeter:
    """The CPU a server's processes spend from `start` on, sampled every 20 ms until `stop`:
    a figure the machine's load changes little, unlike the wall-clock ones (the last 20 ms
    before the processes exit are missed)."""

    def __init__(self, served: Served) -> None:
        self.pids = group_pids(served.process.pid)
        self.first = self.last = cpu_s(self.pids)
        self.sampling = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            now = cpu_s(self.pids)
            self.last = max(self.last, now)
            await asyncio.sleep(0.02)

    async def stop(self) -> float:
        self.sampling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.sampling
        self.last = max(self.last, cpu_s(self.pids))
        return self.last - self.first


def log_errors(lines: list[str]) -> list[str]:
    """The log's lines that say something went wrong."""
    return [line for line in lines if "Traceback" in line or "ERROR" in line]


async def measure_drain(served: Served, count: int, bound: float) -> Drained:
    """Park `count` requests, send SIGTERM, wait (within `bound`) for the answers and the exit."""
    polls = await park_all(served.port, count, PARKING_BOUND)
    clock = time.monotonic
    answered_at: list[float] = []

    async def answer(poll: Poll) -> bool:
        try:
            status, body = _parse(await poll.reader.read())
        finally:
            poll.writer.close()
        answered_at.append(clock())
        return status == 200 and body == ANSWER.encode()

    reading = [asyncio.create_task(answer(poll)) for poll in polls]
    meter = CPUMeter(served)
    client_cpu = time.process_time()
    signalled = clock()
    served.process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(bound):
        outcomes = await asyncio.gather(*reading, return_exceptions=True)
        client_cpu = time.process_time() - client_cpu
        returncode = await served.process.wait()
    exited = clock() - signalled
    server_cpu = await meter.stop()
    return Drained(
        parked=count,
        answered=sum(outcome is True for outcome in outcomes),
        last_answer_s=max(answered_at, default=signalled) - signalled,
        exit_s=exited,
        returncode=returncode,
        log_errors=log_errors(served.lines()),
        server_cpu_s=server_cpu,
        client_cpu_s=client_cpu,
    )


async def measure_disconnect(
    served: Served, count: int, bound: float, route: str = "park", settle: float = 2.0
) -> Disconnected:
    """Park `count` requests on `route`, close every client, and read (within `bound`) which
    handlers saw it and when. Waits until all did, or for `settle` seconds of no progress."""
    _, gone, times = WAITING[route]
    polls = await park_all(served.port, count, PARKING_BOUND, route)
    meter = CPUMeter(served)
    for poll in polls:
        poll.writer.close()  # a closed tab: the client's FIN
        poll.closed_at = time.monotonic()  # a little before: the socket closes next iteration
    await asyncio.sleep(0)
    closing = time.monotonic() - polls[0].closed_at if polls else 0.0
    async with asyncio.timeout(bound):
        seen, since = -1, time.monotonic()
        while True:
            now = await stats_of(served.port)
            if now[gone] >= count:
                break
            if now[gone] != seen:
                seen, since = now[gone], time.monotonic()
            elif time.monotonic() - since > settle:
                break
            await asyncio.sleep(0.05)
        server_cpu = await meter.stop()
        _status, body = await request(served.port, "/stats?times=1", bound)
    final = json.loads(body)
    latencies = [at - polls[int(ident)].closed_at for ident, at in final[times].items()]
    return Disconnected(
        parked=count,
        disconnected=final[gone],
        within_1s=sum(latency <= 1.0 for latency in latencies),
        slowest_s=max(latencies, default=0.0),
        closing_s=closing,
        cancelled=final["cancelled"],
        expired=final["expired"],
        delayed=final["delayed"],
        handlers_cancelled=final["handlers_cancelled"],
        server_cpu_s=server_cpu,
    )


# -- the script ----------------------------------------------------------------------------------


MODES: Final = ("drain", "disconnect", "poll")


async def run(
    servers: list[str],
    middlewares: list[str],
    count: int,
    polls: int,
    logs: Path,
    *,
    modes: tuple[str, ...] = MODES,
) -> list[dict[str, Any]]:
    """Every server with every middleware: drain and disconnect with `count` connections, and
    the same disconnect seen by ``is_disconnected()`` polling with `polls` (each poller wakes
    100 times a second: 10,000 of them would measure the CPU, not the server); one row each."""
    rows: list[dict[str, Any]] = []
    bound = 120.0
    for server in servers:
        for middleware in middlewares:
            for mode in modes:
                log = logs / f"{server}-{middleware}-{mode}.log"
                async with serving(server, middleware, log) as served:
                    if mode == "drain":
                        result: Drained | Disconnected = await measure_drain(served, count, bound)
                    elif mode == "disconnect":
                        result = await measure_disconnect(served, count, bound, "park")
                    else:
                        result = await measure_disconnect(served, polls, bound, "poll")
                row = {"server": server, "middleware": middleware, "mode": mode, **asdict(result)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--poll-connections", type=int, default=500)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--servers", nargs="+", choices=[*SERVERS, HYPERCORN_WORKERS], default=list(SERVERS)
    )
    parser.add_argument("--middlewares", nargs="+", choices=MIDDLEWARES, default=list(MIDDLEWARES))
    parser.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = parser.parse_args(argv)
    limit = raise_fd_limit(2 * args.connections + 1024)
    print(f"# open-file limit {limit}; load before: {Path('/proc/loadavg').read_text().strip()}")
    asyncio.run(
        run(
            args.servers,
            args.middlewares,
            args.connections,
            args.poll_connections,
            args.logs,
            modes=tuple(args.modes),
        )
    )
    print(f"# load after: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()
