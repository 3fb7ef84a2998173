"""The runnable examples run, and their answers add up."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from examples import long_poll_fetch, produce_acks_all


@pytest.mark.asyncio
async def test_produce_acks_all_answers_every_request() -> None:
    outcomes = await produce_acks_all.main(requests=200, seed=3)
    assert sum(outcomes.values()) == 200
    assert set(outcomes) <= {"NONE", "REQUEST_TIMED_OUT"}
    assert outcomes.get("NONE", 0) > 0


async def http(url: str, data: bytes | None = None) -> dict[str, object]:
    """A real HTTP client (urllib) in a worker thread."""

    def call() -> dict[str, object]:
        with urllib.request.urlopen(url, data=data, timeout=10) as response:
            result: dict[str, object] = json.loads(response.read())
            return result

    return await asyncio.to_thread(call)


@pytest.mark.asyncio
async def test_long_poll_fetch_over_real_http() -> None:
    app = long_poll_fetch.FetchServer()
    server = await app.serve("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    async with server, app.purgatory:
        parked = asyncio.create_task(
            http(f"{base}/fetch?topic=t&offset=0&min_bytes=10&max_wait_ms=20000")
        )
        while app.purgatory.num_delayed() == 0:  # the fetch reached the purgatory
            await asyncio.sleep(0.005)
        first = await http(f"{base}/produce?topic=t", b"hello")
        assert first == {"offset": 0, "woken": 0}  # 5 bytes < min_bytes
        second = await http(f"{base}/produce?topic=t", b"world!")
        assert second == {"offset": 1, "woken": 1}
        assert await parked == {"records": ["hello", "world!"], "next_offset": 2, "expired": False}

        started = asyncio.get_running_loop().time()
        timed_out = await http(f"{base}/fetch?topic=t&offset=2&min_bytes=1&max_wait_ms=50")
        assert asyncio.get_running_loop().time() - started >= 0.05
        assert timed_out == {"records": [], "next_offset": 2, "expired": True}
        assert app.purgatory.num_delayed() == 0
