"""The leader process: its parts wired together, started and stopped (Kafka's KafkaServer).

Each part has one job, as in Kafka:

* `network.SocketServer` (Kafka ``SocketServer``): connections, frames, answers in order;
* `apis.KafkaApis` (``KafkaApis``): one handler per API, request in, response out;
* `replica_manager.ReplicaManager` (``ReplicaManager``): partitions, the produce, fetch and
  follower-fetch purgatories, the ISR check;
* `coordinator.GroupCoordinator` (``GroupCoordinator``): consumer groups, the rebalance and
  heartbeat purgatories, committed offsets;
* `stats.BrokerStats`: counters and the purgatories' gauges;
* `metrics.MetricsServer`: the purgatories' gauges and counters for Prometheus (``/metrics``).

`run_leader` is the ``leader`` command: it prints ``bootstrap HOST:PORT`` once it listens, then
``metrics URL`` if it serves ``/metrics`` (or one ``error ...`` line if it cannot listen), and
answers ``stats`` on stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
import signal
from dataclasses import dataclass, field
from typing import Any

from purgatory import JsonLinesEventLog

from .apis import KafkaApis
from .control import read_commands
from .coordinator import GroupCoordinator, GroupSettings
from .metrics import MetricsServer
from .network import SocketServer
from .replica_manager import ReplicaManager, ReplicaSettings
from .settings import BrokerSettings
from .stats import BrokerStats

__all__ = ("BrokerConfig", "Leader", "run_leader")

log = logging.getLogger("minibroker.leader")


@dataclass(frozen=True)
class BrokerConfig(BrokerSettings):
    """The leader's settings: the broker's own (`BrokerSettings`; ``/metrics`` is served on
    `host`), where it listens, who it is, and its groups'."""

    port: int = 0
    host: str = "127.0.0.1"
    broker_id: int = 0
    follower_ids: tuple[int, ...] = (1, 2)
    groups: GroupSettings = field(default_factory=GroupSettings)


class Leader:
    """The partition leader and group coordinator: serves clients and followers."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.stats = BrokerStats()
        self.event_log = (
            None
            if config.event_log is None
            else JsonLinesEventLog(
                config.event_log,
                prefix=f"minibroker-{config.broker_id}",
                watch_records=config.event_log_watches,
            )
        )
        self._publishing: asyncio.Task[None] | None = None
        self.replicas = ReplicaManager(
            ReplicaSettings(
                broker_id=config.broker_id,
                follower_ids=config.follower_ids,
                min_insync_replicas=config.min_insync_replicas,
                replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                max_message_bytes=config.max_message_bytes,
            ),
            self.stats,
            event_log=self.event_log,
        )
        self.coordinator = GroupCoordinator(
            config.groups,
            self.stats,
            self.replicas.partitions.__contains__,
            event_log=self.event_log,
        )
        self.apis = KafkaApis(
            broker_id=config.broker_id,
            host=config.host,
            port=lambda: self.network.port,
            replicas=self.replicas,
            coordinator=self.coordinator,
            stats=self.stats,
            auto_create_topics=config.auto_create_topics,
            default_partitions=config.num_partitions,
        )
        self.network = SocketServer(
            config.host,
            config.port,
            self.apis.handle,
            self.stats,
            max_request_bytes=config.max_request_bytes,
        )
        self.metrics: MetricsServer | None = None
        if config.metrics_port is not None:
            self.metrics = MetricsServer(self.stats.purgatories, config.host, config.metrics_port)

    @property
    def port(self) -> int:
        return self.network.port

    async def start(self) -> None:
        """Create the topics, start the ISR check, listen; `port` is then the bound port.

        Raises:
            OSError: The address is taken (or another reason not to listen); nothing runs.
        """
        self.replicas.start(self.config.topics)
        try:
            await self.network.start()
        except OSError:
            await self.replicas.stop()
            raise
        if self.event_log is not None:
            self._publishing = asyncio.create_task(self._publish_event_log(self.event_log))

    async def stop(self) -> None:
        """Stop listening, drop the connections, cancel what waits: a clean stop."""
        if self.metrics is not None:
            await self.metrics.stop()
        await self.network.stop()
        if self._publishing is not None:
            self._publishing.cancel()
            await asyncio.gather(self._publishing, return_exceptions=True)
        await self.coordinator.stop()
        await self.replicas.stop()
        if self.event_log is not None:
            self.event_log.close()

    async def _publish_event_log(self, recorder: JsonLinesEventLog) -> None:
        """Publish the event log's current file every ``event_log_interval`` seconds, so that
        a job following the directory sees what ended since (a file is otherwise published
        only when it is full, 64 MiB, or at the stop)."""
        while True:
            await asyncio.sleep(self.config.event_log_interval)
            try:
                recorder.flush()
            except OSError as exc:  # the recorder counted the lines it lost
                log.warning("event log: %s (%d lines lost so far)", exc, recorder.lost_lines)

    def statistics(self) -> dict[str, Any]:
        """Gauges, counters, peaks, partitions and groups as one JSON-able dict (``stats``)."""
        replicas = self.replicas
        return {
            "purgatories": self.stats.purgatory_gauges(purge=True),
            "peaks": dict(self.stats.peaks),
            "counters": dict(self.stats.counters),
            "isr_changes": list(replicas.isr_changes),
            "followers_seen": sorted(replicas.followers_seen),
            "partitions": {
                f"{topic}-{index}": {
                    "log_end_offset": p.log_end_offset,
                    "high_watermark": p.high_watermark,
                    "isr": p.isr_list(),
                }
                for (topic, index), p in sorted(replicas.partitions.items())
            },
            "groups": self.coordinator.statistics(),
        }


async def run_leader(config: BrokerConfig, *, control_stdin: bool = False) -> int:
    """Run a leader until SIGINT/SIGTERM; print ``bootstrap HOST:PORT`` once it listens.

    With `control_stdin`, read commands from stdin (``stats`` prints one line ``stats {json}``,
    ``stop`` stops) and stop when stdin ends (see `control`).

    Returns:
        The exit status: 0, or 1 if it could not listen (after one ``error ...`` line).
    """
    leader = Leader(config)
    try:
        await leader.start()
    except OSError as exc:
        print(f"error cannot listen on {config.host}:{config.port}: {_reason(exc)}", flush=True)
        return 1
    if leader.metrics is not None:
        try:
            leader.metrics.start()
        except OSError as exc:
            await leader.stop()
            where = f"{config.host}:{config.metrics_port}"
            print(f"error cannot serve metrics on {where}: {_reason(exc)}", flush=True)
            return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"bootstrap {config.host}:{leader.port}", flush=True)
    if leader.metrics is not None:
        print(f"metrics {leader.metrics.url}", flush=True)

    def command(line: str) -> None:
        if line == "stats":
            stats = leader.statistics()
            print("stats " + json.dumps(stats, default=_finite), flush=True)
        elif line == "stop":
            stop.set()

    control = asyncio.create_task(read_commands(command, stop)) if control_stdin else None
    await stop.wait()
    if control is not None:
        control.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await control
    await leader.stop()
    return 0


def _reason(exc: OSError) -> str:
    return "address already in use" if exc.errno == errno.EADDRINUSE else str(exc)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON-able: {value!r}")
