"""The runnable examples run, and their answers add up.

The HTTP long-poll example is served by a real uvicorn server on a free loopback port, in the
test's own event loop (so the test can read the purgatory's gauges), and driven by a real HTTP
client (httpx) over TCP: no ASGI transport shortcut, so disconnects are real socket closes.
Those tests run on the real clock (marked ``realclock``): their loop waits on real sockets, and a
virtual clock would fire the server's and the client's pending timeouts instead of waiting for
the other end; their bounds only turn a hang into a failure. The others run on event loops in
virtual time (conftest.py): the acks=all example's random delays and 100 ms timeouts play out in
no wall time, and the same way on any machine.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from helpers import until
from http_support import BOUND, client, exits_cleanly, uvicorn_serving, uvicorn_url
from starlette.applications import Starlette

from examples import long_poll_fetch, produce_acks_all

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: Concurrent long-polls that disconnect; the leak shows with 300 as with 50.
CLIENTS = 50

pytestmark = pytest.mark.virtualclock


@pytest.mark.asyncio
async def test_produce_acks_all_answers_every_request() -> None:
    outcomes = await produce_acks_all.main(requests=200, seed=3)
    assert sum(outcomes.values()) == 200
    assert set(outcomes) <= {"NONE", "REQUEST_TIMED_OUT"}
    assert outcomes.get("NONE", 0) > 0


def test_minimal_example_runs() -> None:
    """``python examples/minimal.py`` as a reader runs it: a trigger completes, a timer expires."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "minimal.py")],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        "parked: watched=2 delayed=2",
        "completed by trigger: b'hello' expired=False",
        "completed by expiry: b'' expired=True",
        "at rest: watched=0 delayed=0",
    ]


@asynccontextmanager
async def serving(
    app: Starlette,
) -> AsyncIterator[tuple[uvicorn.Server, str, long_poll_fetch.FetchService]]:
    """Run `app` under uvicorn on a free 127.0.0.1 port; yield it, its URL and its service."""
    async with uvicorn_serving(app, lifespan="on") as (server, base):
        service: long_poll_fetch.FetchService = app.state.service  # the lifespan made it
        yield server, base, service
    assert service.purgatory.closed  # the lifespan shut it down with the app


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_long_poll_fetch_over_real_http() -> None:
    async with serving(long_poll_fetch.make_app()) as (_, base, service), client() as http:
        purgatory = service.purgatory
        parked = asyncio.create_task(
            http.get(f"{base}/fetch", params={"topic": "t", "min_bytes": 10, "max_wait_ms": 20000})
        )
        await until(lambda: purgatory.num_delayed() == 1, "parked", BOUND)
        first = await http.post(f"{base}/produce", params={"topic": "t"}, content=b"hello")
        assert first.json() == {"offset": 0, "woken": 0}  # 5 bytes < min_bytes
        second = await http.post(f"{base}/produce", params={"topic": "t"}, content=b"world!")
        assert second.json() == {"offset": 1, "woken": 1}
        answer = await parked
        assert answer.status_code == 200
        assert answer.json() == {"records": ["hello", "world!"], "next_offset": 2, "expired": False}

        clock = asyncio.get_running_loop().time
        started = clock()
        timed_out = await http.get(
            f"{base}/fetch", params={"topic": "t", "offset": 2, "max_wait_ms": 50}
        )
        assert clock() - started >= 0.05  # never early
        assert timed_out.json() == {"records": [], "next_offset": 2, "expired": True}

        missing = await http.get(f"{base}/fetch", params={"offset": 0})
        assert missing.status_code == 400
        negative = await http.get(f"{base}/fetch", params={"topic": "t", "max_wait_ms": -1})
        assert negative.status_code == 400
        assert purgatory.num_delayed() == 0
        stats = purgatory.statistics()
        assert (stats.completed, stats.expired, stats.cancelled) == (1, 1, 0)


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_the_app_starts_again_with_a_new_purgatory() -> None:
    """The lifespan creates the purgatory: a second start of one app object works as the first.

    (A purgatory created once, at import, is closed by the first shutdown: the second start
    would answer every fetch with 503 ``PurgatoryClosed``.)
    """
    app = long_poll_fetch.make_app()
    services = []
    for _ in range(2):
        async with serving(app) as (_, base, service), client() as http:
            services.append(service)
            await round_trip(http, base)
            assert service.purgatory.statistics().expired == 1
    first, second = services
    assert first is not second
    assert first.purgatory.closed
    assert second.purgatory.closed


async def park_then_disconnect(
    server: uvicorn.Server, base: str, service: long_poll_fetch.FetchService
) -> None:
    """Park `CLIENTS` long-polls (60 s each), then drop every connection abruptly.

    Each client is its own httpx client with its own connection; cancelling the request task
    makes httpx close the socket mid-response, as a browser tab closed or a client-side timeout
    would. Returns once uvicorn has seen every connection close.
    """
    params: dict[str, str | int] = {"topic": "quiet", "min_bytes": 1, "max_wait_ms": 60_000}
    clients = [client() for _ in range(CLIENTS)]
    polls = [asyncio.create_task(c.get(f"{base}/fetch", params=params)) for c in clients]
    await until(lambda: service.purgatory.num_delayed() == CLIENTS, "all parked", BOUND)
    assert len(server.server_state.connections) == CLIENTS
    for poll in polls:
        poll.cancel()
    await asyncio.wait(polls, timeout=BOUND)
    assert all(poll.cancelled() for poll in polls)
    for c in clients:
        await c.aclose()
    await until(lambda: not server.server_state.connections, "disconnected at the server", BOUND)


async def round_trip(http: httpx.AsyncClient, base: str) -> None:
    """One more complete exchange with the server: the loop has run well past the disconnects."""
    response = await http.get(f"{base}/fetch", params={"topic": "other", "max_wait_ms": 20})
    assert response.json() == {"records": [], "next_offset": 0, "expired": True}


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_disconnected_long_polls_leave_nothing_behind() -> None:
    """With the fetch tied to the connection, an abandoned fetch is cancelled."""
    async with serving(long_poll_fetch.make_app(purge_interval=0)) as (server, base, service):
        purgatory = service.purgatory
        await park_then_disconnect(server, base, service)
        await until(lambda: purgatory.statistics().cancelled == CLIENTS, "cancelled", BOUND)
        await until(lambda: purgatory.watched() == 0, "purged from the watcher lists", BOUND)
        assert purgatory.num_delayed() == 0
        stats = purgatory.statistics()
        assert (stats.completed, stats.expired, stats.cancelled) == (0, 0, CLIENTS)
        assert stats.keys == 0
        await until(lambda: not server.server_state.tasks, "handlers finished", BOUND)
        async with client() as http:  # the server is as good as new
            seen = (await http.get(f"{base}/stats")).json()
            assert seen == {
                "watched": 0,
                "delayed": 0,
                "completed": 0,
                "expired": 0,
                "cancelled": CLIENTS,
            }
            await round_trip(http, base)
            produced = await http.post(f"{base}/produce", params={"topic": "quiet"}, content=b"x")
            assert produced.json() == {"offset": 0, "woken": 0}  # nobody was left waiting
        assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_naive_handler_leaks_disconnected_long_polls() -> None:
    """Without the tie, uvicorn and Starlette leave every abandoned fetch parked.

    This is why `cancel_on_disconnect` exists: the same disconnects as the test above, and every
    operation is still in the purgatory (and every handler task still in uvicorn) after the
    server has seen all the connections close and served another request; only their 60 s
    timeout (here: `cancel_for_key`, to end the test) would let them go.
    """
    app = long_poll_fetch.make_app(tie_to_connection=False, purge_interval=0)
    async with serving(app) as (server, base, service):
        purgatory = service.purgatory
        await park_then_disconnect(server, base, service)
        async with client() as http:
            await round_trip(http, base)
        stats = purgatory.statistics()
        assert (stats.watched, stats.delayed, stats.cancelled) == (CLIENTS, CLIENTS, 0)
        assert stats.next_deadline_in > 30  # they would wait out their 60 s
        # ... and so do uvicorn's handler tasks (the round trip's own one ends just after it).
        await until(lambda: len(server.server_state.tasks) == CLIENTS, "down to the leaked", BOUND)
        assert len(purgatory.cancel_for_key("quiet")) == CLIENTS
        await until(lambda: not server.server_state.tasks, "handlers finished", BOUND)
        assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)


class CountingFetch(long_poll_fetch.DelayedFetch):
    """A fetch that counts its `try_complete` calls."""

    def __init__(self, log: long_poll_fetch.TopicLog, offset: int, min_bytes: int) -> None:
        super().__init__(log, "t", offset, min_bytes, max_wait=60)
        self.tries = 0

    def try_complete(self) -> bool:
        self.tries += 1
        return super().try_complete()


@pytest.mark.asyncio
async def test_a_produce_retries_only_the_fetches_its_bytes_may_satisfy() -> None:
    """The fetch's threshold is the topic size it needs; `produce` reports the size reached."""
    service = long_poll_fetch.FetchService()
    log = service.logs["t"]
    log.append(b"abc")  # offset 0: the topic holds 3 bytes
    near = CountingFetch(log, offset=1, min_bytes=2)  # needs the topic at 3 + 2 = 5 bytes
    far = CountingFetch(log, offset=0, min_bytes=100)  # needs 0 + 100
    ahead = CountingFetch(log, offset=3, min_bytes=1)  # offset not written: 3 + 1, a lower bound
    fetches = (near, far, ahead)
    assert [fetch.threshold for fetch in fetches] == [5, 100, 4]
    async with service.purgatory as purgatory:
        for fetch in fetches:
            assert not purgatory.try_complete_else_watch(fetch, {"t": fetch.threshold})
        before = [fetch.tries for fetch in fetches]
        for record in (b"d", b"e", b"fg"):  # offsets 1, 2, 3; the topic at 4, 5, 7 bytes
            log.append(record)
            purgatory.check_and_complete("t", log.size)
        # near: re-tried at 5 only, and completes (from offset 1, "d" + "e" are 2 bytes).
        # ahead: re-tried at 4 and 5 (offset 3 not written yet: no), then at 7 (yes).
        # far: never re-tried, 7 < 100.
        retries = [fetch.tries - tries for fetch, tries in zip(fetches, before, strict=True)]
        assert retries == [1, 0, 3]
        assert near.is_completed
        assert ahead.is_completed
        assert not far.is_completed
        assert await near == {"records": ["d", "e"], "next_offset": 3}
        assert await ahead == {"records": ["fg"], "next_offset": 4}


#: Parked long-polls a SIGTERM must answer.
PARKED = 20


async def started_uvicorn() -> tuple[asyncio.subprocess.Process, str, list[str]]:
    """``uvicorn --factory examples.long_poll_fetch:make_app`` as a user runs it, in a process
    of its own on a free loopback port; its URL, and its log lines so far."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "examples.long_poll_fetch:make_app",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        cwd=EXAMPLES.parent,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    url, log = await uvicorn_url(process)
    return process, url, log


@pytest.mark.asyncio
@pytest.mark.realclock
async def test_sigterm_answers_every_parked_request_and_uvicorn_exits_0() -> None:
    """Every client parked for 30 s is answered within a second of SIGTERM (its fetch drained:
    what the topic holds, ``expired``), none gets a 500, and uvicorn exits 0 with no traceback."""
    process, base, log = await started_uvicorn()
    try:
        async with client() as http:
            await http.post(f"{base}/produce", params={"topic": "t"}, content=b"hi")
            parked = [
                asyncio.create_task(
                    http.get(
                        f"{base}/fetch",
                        params={"topic": "t", "offset": 1, "max_wait_ms": 30_000},
                    )
                )
                for _ in range(PARKED)
            ]

            async def delayed() -> int:
                stats: int = (await http.get(f"{base}/stats")).json()["delayed"]
                return stats

            async with asyncio.timeout(BOUND):
                while await delayed() < PARKED:
                    await asyncio.sleep(0.05)
            clock = asyncio.get_running_loop().time
            signalled = clock()
            process.terminate()  # SIGTERM, as a process manager stops a server
            answers = await asyncio.gather(*parked)
            answered_in = clock() - signalled
        assert [answer.status_code for answer in answers] == [200] * PARKED
        assert all(
            answer.json() == {"records": [], "next_offset": 1, "expired": True}
            for answer in answers
        )
        assert answered_in < 1.0, f"answered {answered_in:.2f} s after SIGTERM"
        await exits_cleanly(process, log)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
