"""Commands on stdin for the leader and follower processes, and their end with their parent.

A process started by `cluster.Cluster` gets a pipe as stdin: lines on it are commands (the
leader answers ``stats`` with one line ``stats {json}`` on stdout), and the end of the pipe means
the parent is gone (it stopped, or was killed without a chance to stop its children), so the
process stops too rather than linger. Only with ``--control-stdin``, and never on a terminal:
switching a terminal to non-blocking reads would upset the shell that owns it.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable

__all__ = ("read_commands",)

log = logging.getLogger("minibroker.control")


async def read_commands(handle: Callable[[str], None], stop: asyncio.Event) -> None:
    """Pass each stdin line to `handle`; set `stop` when stdin ends."""
    if sys.stdin is None or sys.stdin.isatty():
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (ValueError, OSError) as exc:  # a regular file, say: no commands to wait for
        log.info("no commands on stdin: %s", exc)
        return
    while line := await reader.readline():
        handle(line.decode().strip())
    stop.set()
