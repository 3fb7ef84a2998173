"""An HTTP long-poll fetch endpoint: Kafka's ``DelayedFetch`` behind a tiny HTTP/1.1 server.

``GET /fetch?topic=T&offset=N&min_bytes=B&max_wait_ms=W`` answers as soon as the topic holds at
least ``min_bytes`` bytes from ``offset`` on, or after ``max_wait_ms`` with whatever is there.
``POST /produce?topic=T`` appends the request body as one record and wakes the fetches parked on
that topic with ``check_and_complete``. The server is the standard library's asyncio streams, so
the example has no dependency; any HTTP client can talk to it.

Run: ``python examples/long_poll_fetch.py --port 8080``, then for instance
``curl 'localhost:8080/fetch?topic=t&offset=0&min_bytes=1&max_wait_ms=5000'`` in one shell and
``curl -d hello 'localhost:8080/produce?topic=t'`` in another.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from urllib.parse import parse_qs, urlsplit

from purgatory import DelayedOperation, DelayedOperationPurgatory

Log = dict[str, list[bytes]]


class DelayedFetch(DelayedOperation[dict[str, object]]):
    """Completes once ``min_bytes`` are available past ``offset``."""

    def __init__(self, log: Log, topic: str, offset: int, min_bytes: int, max_wait: float) -> None:
        super().__init__(max_wait)
        self.log, self.topic, self.offset, self.min_bytes = log, topic, offset, min_bytes

    def available(self) -> list[bytes]:
        return self.log[self.topic][self.offset :]

    def try_complete(self) -> bool:
        if sum(map(len, self.available())) >= self.min_bytes:
            return self.force_complete()
        return False

    def on_complete(self) -> dict[str, object]:
        records = [record.decode() for record in self.available()]
        return {"records": records, "next_offset": self.offset + len(records)}

    def on_expiration(self) -> None:
        pass


class FetchServer:
    """The HTTP front: parses one request per connection and routes it."""

    def __init__(self) -> None:
        self.log: Log = defaultdict(list)
        self.purgatory = DelayedOperationPurgatory[DelayedFetch]("fetch")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body = await self.route(reader)
        except (ValueError, KeyError) as exc:
            status, body = 400, {"error": str(exc)}
        payload = json.dumps(body).encode()
        writer.write(
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Bad Request'}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    async def route(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, object]]:
        request_line = (await reader.readline()).decode("latin-1").split()
        if len(request_line) != 3:
            raise ValueError("malformed request line")
        method, target, _ = request_line
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        url = urlsplit(target)
        query = {name: values[-1] for name, values in parse_qs(url.query).items()}
        topic = query["topic"]
        if method == "POST" and url.path == "/produce":
            record = await reader.readexactly(length)
            self.log[topic].append(record)
            woken = self.purgatory.check_and_complete(topic)
            return 200, {"offset": len(self.log[topic]) - 1, "woken": woken}
        if method == "GET" and url.path == "/fetch":
            fetch = DelayedFetch(
                self.log,
                topic,
                offset=int(query.get("offset", "0")),
                min_bytes=int(query.get("min_bytes", "1")),
                max_wait=int(query.get("max_wait_ms", "500")) / 1000,
            )
            result = await self.purgatory.watch(fetch, [topic])
            return 200, {**result, "expired": fetch.is_expired}
        raise ValueError(f"no route for {method} {url.path}")

    async def serve(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self.handle, host, port)


async def main(host: str, port: int) -> None:
    app = FetchServer()
    server = await app.serve(host, port)
    print(f"long-poll fetch server on http://{host}:{port}")
    async with server, app.purgatory:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port))
