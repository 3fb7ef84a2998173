"""The demo: a leader and two followers, a seeded acks=all load through aiokafka, two pauses,
and a consumer group that loses a member.

Timeline (seconds from the start of the load, for the default 12 s):

* 0: producers (acks=all) and long-polling consumers start; every ack waits in the produce
  purgatory for the followers, every idle poll in the fetch purgatory. A consumer group of two
  members, A here and B in a process of its own, splits the topic's partitions: their joins
  wait in the rebalance purgatory (`DelayedJoin`), their sessions in the heartbeat purgatory
  (`DelayedHeartbeat`).
* 25 %: follower 2 is frozen (SIGSTOP). Acks wait, since the high watermark cannot pass it, until
  ``replica.lag.time.max.ms`` removes it from the ISR; the slowest ones time out.
* 35 %: group member B is killed (SIGKILL, no goodbye). Its session expires after
  ``session.timeout.ms``, the group rebalances, and A takes all partitions, resuming B's from the
  offsets B committed.
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

from .cluster import REPO_ROOT, Cluster, ClusterConfig

__all__ = ("run_demo",)

TOPIC = "orders"
PARTITIONS = 4
PRODUCERS = 16
CONSUMERS = 4
RATE = 30.0  # records per second, per producer
REQUEST_TIMEOUT_MS = 1000
GROUP = "order-readers"
SESSION_TIMEOUT_MS = 2000
HEARTBEAT_INTERVAL_MS = 300
KILL_MEMBER_AT = 0.35
FAULTS = (
    (0.25, "pause follower 2 (SIGSTOP)"),
    (KILL_MEMBER_AT, "kill group member B (SIGKILL)"),
    (0.50, "pause follower 1 (SIGSTOP)"),
    (0.70, "resume followers 1 and 2 (SIGCONT)"),
)
"""When each fault comes, as a fraction of the load's length, and what it is."""

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


@dataclass
class GroupView:
    """What the two group members saw: their partitions over time, what they read."""

    a_partitions: list[int] = field(default_factory=list)
    b_partitions: list[int] = field(default_factory=list)
    a_before_kill: list[int] = field(default_factory=list)
    a_read: int = 0
    b_read: int = 0
    b_killed: bool = False
    member_b: asyncio.subprocess.Process | None = None

    def line(self) -> str:
        b = "killed" if self.b_killed else _partitions(self.b_partitions)
        return f"group: A {_partitions(self.a_partitions)} B {b}"

    def kill_b(self) -> None:
        self.a_before_kill = list(self.a_partitions)
        self.b_killed = True
        if self.member_b is not None:
            self.member_b.kill()


def _partitions(partitions: list[int]) -> str:
    return ",".join(map(str, partitions)) or "-"


async def _group_member_a(bootstrap: str, view: GroupView, done: asyncio.Event) -> None:
    """Member A: aiokafka's quick-start consumer with a group id, in this process."""
    consumer = AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=bootstrap,
        group_id=GROUP,
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=500,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        fetch_max_wait_ms=200,
    )
    await consumer.start()
    try:
        while not done.is_set():
            batches = await consumer.getmany(timeout_ms=200)
            view.a_read += sum(len(records) for records in batches.values())
            view.a_partitions = sorted(tp.partition for tp in consumer.assignment())
    finally:
        await consumer.stop()


async def _group_member_b(bootstrap: str, view: GroupView) -> None:
    """Member B: the same consumer in a process of its own (``member``), so it can be killed."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "examples.minibroker", "member", "--bootstrap", bootstrap),
        *("--group", GROUP, "--topic", TOPIC),
        *("--session-timeout-ms", str(SESSION_TIMEOUT_MS)),
        *("--heartbeat-interval-ms", str(HEARTBEAT_INTERVAL_MS)),
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    view.member_b = process
    assert process.stdout is not None
    while line := await process.stdout.readline():
        word, _, rest = line.decode().strip().partition(" ")
        if word == "assigned":
            view.b_partitions = [int(p) for p in rest.split(",") if p]
        elif word == "read":
            view.b_read += int(rest)
    await process.wait()


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
    cluster: Cluster,
    tally: Tally,
    view: GroupView,
    *,
    started: float,
    stop: asyncio.Event,
    notes: list[str],
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
            f"fetch {delayed['fetch']:2d} follower {delayed['follower-fetch']} "
            f"rebalance {delayed['rebalance']} heartbeat {delayed['heartbeat']}  "
            f"{view.line()}{note}",
            flush=True,
        )


async def _schedule(
    cluster: Cluster,
    view: GroupView,
    *,
    seconds: float,
    started: float,
    stop: asyncio.Event,
    notes: list[str],
) -> None:
    actions: list[Callable[[], None]] = [
        lambda: cluster.pause(2),
        view.kill_b,
        lambda: cluster.pause(1),
        lambda: cluster.resume(1, 2),
    ]
    for (fraction, what), action in zip(FAULTS, actions, strict=True):
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
        if all(gauges[name]["delayed"] == 0 for name in ("produce", "fetch", "rebalance")):
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
    cluster: Cluster, rng: random.Random, seconds: float, tally: Tally, view: GroupView
) -> dict[str, Any]:
    """The load, the faults and the read-back; returns the leader's statistics at the end."""
    stop, done = asyncio.Event(), asyncio.Event()
    notes: list[str] = []
    # The group first, so that it has settled (one generation, two members) when the load starts.
    members = [
        asyncio.create_task(_group_member_a(cluster.bootstrap, view, done)),
        asyncio.create_task(_group_member_b(cluster.bootstrap, view)),
    ]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (view.a_partitions and view.b_partitions):
        await asyncio.sleep(0.05)
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
    schedule = asyncio.create_task(
        _schedule(cluster, view, seconds=seconds, started=started, stop=stop, notes=notes)
    )
    progress = asyncio.create_task(
        _progress(cluster, tally, view, started=started, stop=stop, notes=notes)
    )
    await asyncio.gather(*producers, schedule, progress)
    # Read back: every acknowledged record must be at its offset; and the group must have
    # moved the killed member's partitions (on a slow machine that can outlast a short run).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (
        tally.acked.keys() <= tally.consumed.keys()
        and (not view.b_killed or view.a_partitions == list(range(PARTITIONS)))
    ):
        await asyncio.sleep(0.1)
    done.set()
    if view.member_b is not None and view.member_b.returncode is None:
        view.member_b.kill()  # the run was too short to reach its kill
    await asyncio.gather(*consumers, *members)
    return await _settled_stats(cluster)


async def run_demo(
    *,
    seed: int = 7,
    seconds: float = 12.0,
    broker_log: str | None = None,
    metrics_port: int | None = 0,
    event_log: str | None = None,
    event_log_interval: float = 10.0,
) -> dict[str, Any]:
    """Run the demo, print progress and the summary; return the figures (for a test).

    The brokers' own logs (ISR changes, rebalances, refused connections) go to `broker_log`
    if given (kept), else to an anonymous temporary file that vanishes with the demo. The
    leader serves ``/metrics`` on `metrics_port` (0: any free port; ``None``: not at all), and
    its purgatories record their event logs in `event_log` if given (published every
    `event_log_interval` seconds).
    """
    rng = random.Random(seed)
    config = ClusterConfig(
        topics={TOPIC: PARTITIONS},
        min_insync_replicas=2,
        replica_lag_time_max_ms=1000,
        replica_fetch_wait_max_ms=200,
        metrics_port=metrics_port,
        event_log=event_log,
        event_log_interval=event_log_interval,
    )
    tally = Tally()
    view = GroupView()
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
            if cluster.metrics_url is not None:
                print(f"  metrics (Prometheus): {cluster.metrics_url}", flush=True)
            if event_log is not None:
                print(f"  event logs (JSON Lines): {event_log}", flush=True)
            stats = await _drive(cluster, rng, seconds, tally, view)
    lost = [key for key, value in tally.acked.items() if tally.consumed.get(key) != value]
    summary = _summary(tally, view, stats, lost, time.monotonic() - started)
    print(summary["table"], flush=True)
    if lost:
        print(f"LOST: {len(lost)} acknowledged records not found at their offsets", file=sys.stderr)
    if not summary["group_ok"]:
        print("GROUP: member A did not take over member B's partitions", file=sys.stderr)
    return summary


def _summary(
    tally: Tally, view: GroupView, stats: dict[str, Any], lost: list[Any], elapsed: float
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
    group: dict[str, Any] = stats["groups"].get(GROUP, {})
    group_ok = (
        view.b_killed
        and view.a_partitions == list(range(PARTITIONS))
        and counters.get("group members expired", 0) >= 1
    )
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
            "peak / end num_delayed(): rebalance, heartbeat",
            f"{peaks.get('rebalance.delayed', 0)}, {peaks.get('heartbeat.delayed', 0)} / "
            f"{gauges['rebalance']['delayed']}, {gauges['heartbeat']['delayed']}",
        ),
        (
            f"group {GROUP!r}: generations / members expired",
            f"{group.get('generation', 0)} / {counters.get('group members expired', 0)}",
        ),
        (
            "  member A's partitions: before / after B was killed",
            f"{_partitions(view.a_before_kill)} / {_partitions(view.a_partitions)}",
        ),
        ("  records read by A / by B", f"{view.a_read} / {view.b_read}"),
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
        "group_ok": group_ok,
        "group": group,
        "a_partitions": (view.a_before_kill, view.a_partitions),
        "answers": answers,
        "isr_changes": changes,
        "gauges": gauges,
        "peaks": peaks,
    }
