"""The demo: a leader and two followers, a seeded acks=all load through aiokafka, two pauses.

Timeline (seconds from the start of the load, for the default 12 s):

* 0: producers (acks=all) and long-polling consumers start; every ack waits in the produce
  purgatory for the followers, every idle poll in the fetch purgatory.
* 25 %: follower 2 is frozen (SIGSTOP). Acks wait, since the high watermark cannot pass it, until
  ``replica.lag.time.max.ms`` removes it from the ISR; the slowest ones time out.
* 50 %: follower 1 is frozen too. When it leaves the ISR, the ISR is the leader alone, below
  ``min.insync.replicas=2``: the acks waiting are answered ``NOT_ENOUGH_REPLICAS_AFTER_APPEND``
  and new produces are refused at once with ``NOT_ENOUGH_REPLICAS``.
* 70 %: both followers resume, catch up, rejoin the ISR; acks flow again.
* end: producers stop, consumers read everything back, and every acknowledged record is checked
  at its offset. The summary table follows.

The record contents, keys, partitions and send times are drawn from one seeded generator; the
timings measured are real, so two runs differ in their figures, not in their shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from .cluster import Cluster, ClusterConfig

__all__ = ("run_demo",)

TOPIC = "orders"
PARTITIONS = 4
PRODUCERS = 16
CONSUMERS = 4
RATE = 30.0  # records per second, per producer
REQUEST_TIMEOUT_MS = 1000

ERROR_NAMES = {
    0: "NONE",
    7: "REQUEST_TIMED_OUT",
    19: "NOT_ENOUGH_REPLICAS",
    20: "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
}


@dataclass
class Tally:
    """What the clients saw."""

    sent: int = 0
    acked: dict[tuple[int, int], bytes] = field(default_factory=dict)
    ack_waits: list[float] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)
    consumed: dict[tuple[int, int], bytes] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        return self.sent - len(self.acked) - sum(self.failed.values())


async def _produce(
    index: int, bootstrap: str, rng: random.Random, tally: Tally, stop: asyncio.Event
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        enable_idempotence=False,
        linger_ms=2,
    )
    await producer.start()
    pending: set[asyncio.Future[Any]] = set()
    try:
        number = 0
        while not stop.is_set():
            await asyncio.sleep(rng.expovariate(RATE))
            value = f"p{index}-{number}-{rng.getrandbits(32):08x}".encode()
            partition = rng.randrange(PARTITIONS)
            number += 1
            started = time.monotonic()
            future = await producer.send(TOPIC, value, partition=partition)
            tally.sent += 1
            pending.add(future)
            future.add_done_callback(
                lambda f, value=value, started=started: _settled(f, value, started, tally)
            )
            future.add_done_callback(pending.discard)
        if pending:
            await asyncio.wait(pending, timeout=REQUEST_TIMEOUT_MS / 1000 * 3)
    finally:
        await producer.stop()


def _settled(future: asyncio.Future[Any], value: bytes, started: float, tally: Tally) -> None:
    if future.cancelled():
        tally.failed["cancelled"] += 1
        return
    error = future.exception()
    if error is not None:
        tally.failed[type(error).__name__] += 1
        return
    metadata = future.result()
    tally.acked[(metadata.partition, metadata.offset)] = value
    tally.ack_waits.append(time.monotonic() - started)


async def _consume(
    partitions: list[int], bootstrap: str, tally: Tally, done: asyncio.Event
) -> None:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=500,
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(TOPIC, p) for p in partitions])
        while not done.is_set():
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                for record in records:
                    tally.consumed[(tp.partition, record.offset)] = record.value
    finally:
        await consumer.stop()


def _isr_sizes(stats: dict[str, Any]) -> str:
    return ",".join(str(len(p["isr"])) for p in stats["partitions"].values())


async def _progress(
    cluster: Cluster, tally: Tally, started: float, stop: asyncio.Event, notes: list[str]
) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        stats = await cluster.stats()
        delayed = {name: g["delayed"] for name, g in stats["purgatories"].items()}
        note = f"  <- {notes.pop(0)}" if notes else ""
        print(
            f"  t={time.monotonic() - started:5.1f}s  acked {len(tally.acked):6d}  "
            f"waiting {tally.in_flight:4d}  failed {sum(tally.failed.values()):4d}  "
            f"ISR sizes {_isr_sizes(stats)}  parked: produce {delayed['produce']:3d} "
            f"fetch {delayed['fetch']:2d} follower {delayed['follower-fetch']}{note}",
            flush=True,
        )


async def _schedule(
    cluster: Cluster, seconds: float, started: float, stop: asyncio.Event, notes: list[str]
) -> None:
    steps: list[tuple[float, str, Callable[[], None]]] = [
        (0.25, "pause follower 2 (SIGSTOP)", lambda: cluster.pause(2)),
        (0.50, "pause follower 1 (SIGSTOP)", lambda: cluster.pause(1)),
        (0.70, "resume followers 1 and 2 (SIGCONT)", lambda: cluster.resume(1, 2)),
    ]
    for fraction, what, action in steps:
        await asyncio.sleep(max(0.0, started + fraction * seconds - time.monotonic()))
        action()
        notes.append(what)
    await asyncio.sleep(max(0.0, started + seconds - time.monotonic()))
    stop.set()


async def _settled_stats(cluster: Cluster) -> dict[str, Any]:
    """The leader's statistics once it has seen the clients go (their closes race this call)."""
    for _ in range(50):
        stats = await cluster.stats()
        gauges = stats["purgatories"]
        if gauges["produce"]["delayed"] == 0 and gauges["fetch"]["delayed"] == 0:
            break
        await asyncio.sleep(0.05)
    return stats


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def _drive(
    cluster: Cluster, rng: random.Random, seconds: float, tally: Tally
) -> dict[str, Any]:
    """The load, the faults and the read-back; returns the leader's statistics at the end."""
    stop, done = asyncio.Event(), asyncio.Event()
    notes: list[str] = []
    consumers = [
        asyncio.create_task(
            _consume(list(range(i, PARTITIONS, CONSUMERS)), cluster.bootstrap, tally, done)
        )
        for i in range(CONSUMERS)
    ]
    started = time.monotonic()
    producers = [
        asyncio.create_task(
            _produce(i, cluster.bootstrap, random.Random(rng.getrandbits(64)), tally, stop)
        )
        for i in range(PRODUCERS)
    ]
    schedule = asyncio.create_task(_schedule(cluster, seconds, started, stop, notes))
    progress = asyncio.create_task(_progress(cluster, tally, started, stop, notes))
    await asyncio.gather(*producers, schedule, progress)
    # Read back: every acknowledged record must be at its offset.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not tally.acked.keys() <= tally.consumed.keys():
        await asyncio.sleep(0.1)
    done.set()
    await asyncio.gather(*consumers)
    return await _settled_stats(cluster)


async def run_demo(
    *, seed: int = 7, seconds: float = 12.0, broker_log: str | None = None
) -> dict[str, Any]:
    """Run the demo, print progress and the summary; return the figures (for a test).

    The brokers' own logs (ISR changes, rebalances, refused connections) go to `broker_log`
    if given (kept), else to an anonymous temporary file that vanishes with the demo.
    """
    rng = random.Random(seed)
    config = ClusterConfig(
        topics={TOPIC: PARTITIONS},
        min_insync_replicas=2,
        replica_lag_time_max_ms=1000,
        replica_fetch_wait_max_ms=200,
    )
    tally = Tally()
    log_file = open(broker_log, "wb") if broker_log else tempfile.TemporaryFile()  # noqa: SIM115
    where = broker_log or "not kept (--broker-log PATH keeps them)"
    with log_file as log:
        print(
            f"minibroker demo: leader + 2 followers on loopback, topic {TOPIC!r} x{PARTITIONS}, "
            f"min.insync.replicas=2, replica.lag.time.max.ms=1000, seed {seed}\n"
            f"  {PRODUCERS} aiokafka producers (acks=all, request_timeout_ms="
            f"{REQUEST_TIMEOUT_MS}) at ~{RATE * PRODUCERS:.0f} records/s, {CONSUMERS} consumers "
            f"long-polling (fetch_max_wait_ms=500); broker logs: {where}",
            flush=True,
        )
        started = time.monotonic()
        async with Cluster(config, log=log) as cluster:
            stats = await _drive(cluster, rng, seconds, tally)
    lost = [key for key, value in tally.acked.items() if tally.consumed.get(key) != value]
    summary = _summary(tally, stats, lost, time.monotonic() - started)
    print(summary["table"], flush=True)
    if lost:
        print(f"LOST: {len(lost)} acknowledged records not found at their offsets", file=sys.stderr)
    return summary


def _summary(
    tally: Tally, stats: dict[str, Any], lost: list[Any], elapsed: float
) -> dict[str, Any]:
    counters: dict[str, int] = stats["counters"]
    answers = {
        name: counters.get(f"produce partition error {code}", 0)
        for code, name in ERROR_NAMES.items()
    }
    waits = [w * 1000 for w in tally.ack_waits]
    peaks: dict[str, int] = stats["peaks"]
    gauges: dict[str, dict[str, int]] = stats["purgatories"]
    names = ("produce", "fetch", "follower-fetch")
    changes: list[str] = stats["isr_changes"]
    acked = len(tally.acked)
    rows: list[tuple[str, str]] = [
        ("records sent by the producers (acks=all)", f"{tally.sent}"),
        ("  acknowledged", f"{acked}"),
        *[(f"  failed: {name}", f"{count}") for name, count in sorted(tally.failed.items())],
        ("  acknowledged, then read back at their offset", f"{acked - len(lost)} of {acked}"),
        (
            "ack wait p50 / p99 / max (ms)",
            " / ".join(
                f"{v:.0f}"
                for v in (
                    _percentile(waits, 50),
                    _percentile(waits, 99),
                    max(waits, default=float("nan")),
                )
            ),
        ),
        ("broker answers per produced partition:", ""),
        *[(f"  {name}", f"{count}") for name, count in answers.items()],
    ]
    for kind, title in (("consumer", "consumer"), ("follower", "follower")):
        total = counters.get(f"fetch {kind}", 0)
        data = counters.get(f"fetch {kind} parked data", 0)
        expired = counters.get(f"fetch {kind} parked expired", 0)
        rows.append(
            (f"{title} fetches: at once / parked", f"{total - data - expired} / {data + expired}")
        )
        rows.append(("  parked: woken by data / by max_wait_ms", f"{data} / {expired}"))
    rows += [
        (
            "peak watched(): produce / fetch / follower",
            " / ".join(str(peaks.get(f"{n}.watched", 0)) for n in names),
        ),
        (
            "peak num_delayed(): produce / fetch / follower",
            " / ".join(str(peaks.get(f"{n}.delayed", 0)) for n in names),
        ),
        (
            "at the end, watched(): produce / fetch / follower",
            " / ".join(str(gauges[n]["watched"]) for n in names),
        ),
        (
            "at the end, num_delayed(): produce / fetch / follower",
            " / ".join(str(gauges[n]["delayed"]) for n in names),
        ),
        (
            "ISR changes: shrinks / expansions",
            f"{sum('left' in c for c in changes)} / {sum('rejoined' in c for c in changes)}",
        ),
        ("elapsed (s)", f"{elapsed:.1f}"),
    ]
    width = max(len(name) for name, _ in rows) + 2
    value_width = max(len(value) for _, value in rows)
    rule = "-" * (width + value_width)
    lines = ["", "summary", rule]
    lines += [f"{name:<{width}}{value:>{value_width}}" for name, value in rows]
    lines.append(rule)
    return {
        "table": "\n".join(lines),
        "sent": tally.sent,
        "acked": acked,
        "failed": dict(tally.failed),
        "lost": len(lost),
        "answers": answers,
        "isr_changes": changes,
        "gauges": gauges,
        "peaks": peaks,
    }
