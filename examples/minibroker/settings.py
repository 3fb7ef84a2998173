"""The broker's own settings, declared once: `ClusterConfig` hands them to the leader process,
which runs with them as part of its `BrokerConfig` (Kafka's names where Kafka has one)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ("BrokerSettings",)


@dataclass(frozen=True)
class BrokerSettings:
    topics: dict[str, int] = field(default_factory=lambda: {"demo": 4})
    """Topics created at start: name -> partitions."""
    min_insync_replicas: int = 2
    """``min.insync.replicas``: the in-sync replicas an ``acks=all`` produce waits for."""
    replica_lag_time_max_ms: int = 1000
    """``replica.lag.time.max.ms``: a follower this far behind leaves the ISR."""
    max_request_bytes: int = 8 * 1024 * 1024
    """``socket.request.max.bytes``: a bigger frame closes the connection."""
    max_message_bytes: int = 1024 * 1024
    """``max.message.bytes``: a bigger record batch gets ``MESSAGE_TOO_LARGE``."""
    auto_create_topics: bool = True
    """``auto.create.topics.enable``: a Metadata request naming an unknown topic creates it."""
    num_partitions: int = 4
    """``num.partitions``: the partition count of a topic created on first use."""
    metrics_port: int | None = None
    """The leader's ``/metrics`` port (0: any free port); ``None``: no ``/metrics``."""
    event_log: str | None = None
    """A directory where the leader's purgatories record their event logs (JSON Lines, for
    ``python -m purgatory.pipeline analyze``); ``None``: no recording."""
    event_log_interval: float = 10.0
    """Seconds between publications of the event log's current file: what a follower of the
    directory (``analyze --follow``) sees lags the broker by at most this (plus its own)."""
    event_log_watches: bool = False
    """Also record each operation as it is watched (``watch_records=True``): what
    ``analyze --follow --stuck`` needs to know of an operation whose end never comes (a
    broker killed with requests waiting). Twice the records."""
