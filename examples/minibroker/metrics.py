"""The leader's ``/metrics``: its five purgatories in Prometheus' text format.

A `purgatory.prometheus.PurgatoryCollector` in a registry of its own, served by
prometheus_client's ``start_http_server`` on loopback, as an application would do it. That server
answers on threads of its own; the collector reads each purgatory on the leader's event loop
(it was created there), so a scrape never touches a purgatory from another thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from purgatory import DelayedOperationPurgatory
from purgatory.prometheus import PurgatoryCollector

__all__ = ("MetricsServer",)


class MetricsServer:
    """``GET /metrics`` on `host`:`port` (0: any free port); `url` says where, once started."""

    def __init__(
        self, purgatories: Iterable[DelayedOperationPurgatory[Any]], host: str, port: int
    ) -> None:
        self.host, self.port = host, port
        self.registry = CollectorRegistry()
        self.registry.register(PurgatoryCollector(purgatories))
        self._server: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def start(self) -> None:
        """Listen; `port` is then the bound port. Raises `OSError` if the address is taken."""
        self._server, _ = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._server.server_port

    async def stop(self) -> None:
        """Stop listening (its accept loop notices within half a second, off this loop)."""
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.shutdown)
            server.server_close()
