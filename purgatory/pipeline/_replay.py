"""The replay engine: a trace, streamed in arrival order, through a real purgatory in virtual time.

Pure Python plus pyarrow, no Spark: the Spark job runs it inside ``mapInArrow`` on each
partition, and `replay_table` runs it in one process (the reference the tests compare against).

Theory of operation. The input is a stream of Arrow record batches whose rows are sorted by
(group, arrival, op_id), a *group* being one (purgatory, configuration) pair. For each group a
`DelayedOperationPurgatory` is built on a `purgatory.testing.ManualClock`. Before each arrival
the driver moves the clock forward through every event due until then, in time order: timer
passes at each tick where the purgatory has work (``ManualClock.advance_to``, so a pass runs
where a reaper would wake), and the condition of earlier operations becoming true
(the op is marked ready and its first key is triggered with ``check_and_complete``, or it is
completed with ``force_complete`` in ``trigger="force"`` mode). At one instant, timer passes run
first, then triggers, then the arrival. Then the operation is watched with
``try_complete_else_watch``; if its condition holds at arrival it completes inside the call.
When a group's rows end, the clock runs on until nothing is timed.

What the engine holds is bounded by what the purgatory holds: the pending operations, one heap
entry per pending operation whose condition comes before its deadline, the current input batch
and at most ``OUTPUT_ROWS`` finished rows. A whole group's trace is never in memory.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Final, Literal

import pyarrow as pa

from .. import DelayedOperation, DelayedOperationPurgatory
from .._eventlog import JsonLinesEventLog
from .._events import Outcome
from ..testing import ManualClock, check_invariants

__all__ = (
    "OUTPUT_ROWS",
    "OUTPUT_SCHEMA",
    "ReplayConfig",
    "replay_batches",
    "replay_table",
)

#: Finished rows gathered before a batch is emitted.
OUTPUT_ROWS: Final = 8192

#: What the replay emits: one row per operation (``op_id`` set), then one row per group
#: (``op_id`` null) with the group's gauges. The Spark job splits the two.
OUTPUT_SCHEMA: Final = pa.schema(
    [
        pa.field("purgatory", pa.string(), nullable=False),
        pa.field("config_id", pa.int32(), nullable=False),
        pa.field("op_id", pa.int64()),
        pa.field("outcome", pa.string()),
        pa.field("watched_at", pa.float64()),
        pa.field("deadline", pa.float64()),
        pa.field("ended_at", pa.float64()),
        pa.field("peak_watched", pa.int64()),
        pa.field("peak_delayed", pa.int64()),
        pa.field("timer_passes", pa.int64()),
        pa.field("purges", pa.int64()),
        pa.field("purged_entries", pa.int64()),
        pa.field("attempts", pa.int64()),
    ]
)

Trigger = Literal["key", "force"]


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One configuration of the purgatory and of the traffic, applied to a whole trace.

    Attributes:
        tick: The wheel tick in seconds.
        wheel_size: Slots per wheel level.
        purge_interval: Kafka's purge interval.
        timeout_scale: Every timeout is multiplied by this.
        rate_scale: Arrivals come this many times faster (arrival times divided by it); each
            operation's latency (condition time minus arrival) is kept.
        trigger: ``"key"``: the condition fires ``check_and_complete`` on the operation's first
            key (the broker's path, which re-tries every operation on that key); ``"force"``:
            ``force_complete`` on the operation (Kafka's benchmark path).
    """

    tick: float = 0.001
    wheel_size: int = 1024
    purge_interval: int = 1000
    timeout_scale: float = 1.0
    rate_scale: float = 1.0
    trigger: Trigger = "key"

    def __post_init__(self) -> None:
        for name in ("tick", "timeout_scale", "rate_scale"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.trigger not in ("key", "force"):
            raise ValueError(f"trigger must be 'key' or 'force', got {self.trigger!r}")

    def label(self) -> str:
        """A short label for tables and charts."""
        return (
            f"tick={self.tick:g} wheel={self.wheel_size} purge={self.purge_interval} "
            f"timeout x{self.timeout_scale:g} rate x{self.rate_scale:g}"
        )


class ReplayOperation(DelayedOperation[None]):
    """A trace row as a delayed operation: complete once the replay marks its condition met."""

    __slots__ = ("group", "keys", "op_id", "ready", "watched_at")

    def __init__(
        self, group: _Group, op_id: int, keys: tuple[str, ...], timeout: float, ready: bool
    ) -> None:
        super().__init__(timeout)
        self.group = group
        self.op_id = op_id
        self.keys = keys
        self.ready = ready
        self.watched_at = 0.0

    def try_complete(self) -> bool:
        self.group.attempts += 1
        if self.ready:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.group.finished(self)

    def on_expiration(self) -> None:
        pass


class _Group:
    """The live state of one (purgatory, configuration) replay."""

    __slots__ = (
        "attempts",
        "check",
        "clock",
        "config",
        "config_id",
        "ended",
        "event_log",
        "heap",
        "horizon",
        "name",
        "out",
        "passes",
        "peak_delayed",
        "peak_watched",
        "purgatory",
        "purges",
        "seq",
    )

    def __init__(
        self,
        name: str,
        config_id: int,
        config: ReplayConfig,
        event_log: JsonLinesEventLog | None,
        check: bool = False,
    ) -> None:
        self.name = name
        self.check = check
        self.config_id = config_id
        self.config = config
        self.clock = ManualClock()
        self.event_log = event_log
        self.purgatory: DelayedOperationPurgatory[ReplayOperation] = DelayedOperationPurgatory(
            f"{name}@{config_id}",
            tick=config.tick,
            wheel_size=config.wheel_size,
            purge_interval=config.purge_interval,
            clock=self.clock,
            event_log=event_log,
        )
        self.heap: list[tuple[float, int, ReplayOperation]] = []
        self.seq = 0
        self.attempts = 0
        self.passes = 0
        self.purges = 0
        # The latest deadline of any operation watched so far (seconds, before rounding).
        self.horizon = 0.0
        self.peak_watched = 0
        self.peak_delayed = 0
        self.ended = 0
        self.out: list[tuple[int, str, float, float, float]] = []

    def finished(self, op: ReplayOperation) -> None:
        now = self.clock.now()
        outcome: Outcome = "expired" if op.is_expired else "completed"
        watched_at = op.watched_at
        self.out.append((op.op_id, outcome, watched_at, watched_at + op.timeout, now))

    def move_to(self, when: float) -> None:
        """Move the clock to `when` (if later), with a timer pass at each tick that has work.

        ``passes`` counts the passes that ran, ``purges`` the moves in which a purge removed
        entries.
        """
        clock = self.clock
        now = clock.now()
        before = self.purgatory.statistics()
        clock.advance_to(when if when > now else now)
        after = self.purgatory.statistics()
        self.passes += after.timer_passes - before.timer_passes
        if after.purged > before.purged:
            self.purges += 1

    def run_until(self, t: float) -> None:
        """Run every timer pass and condition due at or before `t`, in time order."""
        purgatory = self.purgatory
        heap = self.heap
        force = self.config.trigger == "force"
        while heap and heap[0][0] <= t:
            trigger_at, _, op = heappop(heap)
            if op.is_completed:
                continue
            self.move_to(trigger_at)
            if op.is_completed:  # expired in that pass: its deadline tick came first
                continue
            op.ready = True
            if force:
                op.force_complete()
            else:
                purgatory.check_and_complete(op.keys[0])

    def arrive(
        self, op_id: int, keys: tuple[str, ...], timeout: float, condition: float | None, t: float
    ) -> None:
        """Watch one operation arriving at `t` (scaled), whose condition comes at `condition`."""
        self.run_until(t)
        clock = self.clock
        self.move_to(t)
        ready = condition is not None and condition <= t
        op = ReplayOperation(self, op_id, keys, timeout, ready)
        now = clock.now()
        op.watched_at = now
        purgatory = self.purgatory
        if not purgatory.try_complete_else_watch(op, keys):
            self.horizon = max(self.horizon, now + timeout)
            self.peak_watched = max(self.peak_watched, purgatory.watched())
            delayed = purgatory.num_delayed()
            self.peak_delayed = max(self.peak_delayed, delayed)
            # A condition a tick or more past the deadline can only lose to the expiry: not
            # queued (one closer to it is sorted out when popped, after the timer passes due).
            if condition is not None and condition < now + timeout + self.config.tick:
                self.seq += 1
                heappush(self.heap, (condition, self.seq, op))
        if self.check:
            check_invariants(purgatory)

    def drain(self) -> None:
        """Run the clock on until nothing is timed and no condition is pending."""
        self.run_until(math.inf)
        # Past the last deadline (and a tick, for its rounding up): every pass has run.
        self.move_to(max(self.clock.now(), self.horizon + self.config.tick))
        if self.event_log is not None:
            self.event_log.flush()

    def take_rows(self) -> pa.RecordBatch:
        n = len(self.out)
        ids, outcomes, watched, deadlines, ended = zip(*self.out, strict=True)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.name] * n, pa.string()),
                pa.array([self.config_id] * n, pa.int32()),
                pa.array(ids, pa.int64()),
                pa.array(outcomes, pa.string()),
                pa.array(watched, pa.float64()),
                pa.array(deadlines, pa.float64()),
                pa.array(ended, pa.float64()),
                *(pa.nulls(n, field.type) for field in list(OUTPUT_SCHEMA)[7:]),
            ],
            schema=OUTPUT_SCHEMA,
        )
        self.ended += n
        self.out = []
        return batch

    def stats_row(self) -> pa.RecordBatch:
        values: list[Any] = [
            self.name,
            self.config_id,
            None,
            None,
            None,
            None,
            None,
            self.peak_watched,
            self.peak_delayed,
            self.passes,
            self.purges,
            self.purgatory.statistics().purged,
            self.attempts,
        ]
        return pa.RecordBatch.from_arrays(
            [pa.array([v], f.type) for v, f in zip(values, OUTPUT_SCHEMA, strict=True)],
            schema=OUTPUT_SCHEMA,
        )


def replay_batches(
    batches: Iterable[pa.RecordBatch],
    configs: Mapping[int, ReplayConfig],
    *,
    event_log_dir: str | None = None,
    output_rows: int = OUTPUT_ROWS,
    check: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Replay a stream of trace batches sorted by (purgatory, config_id, arrival, op_id).

    Args:
        batches: Columns ``purgatory``, ``config_id``, ``op_id``, ``arrival``, ``keys``,
            ``timeout`` and ``condition_at`` (null: never), already validated.
        configs: The configuration of each ``config_id``.
        event_log_dir: If given, each group records its event log there (purgatory name
            ``"<purgatory>@<config_id>"``), flushed at the group's end.
        output_rows: Rows per emitted batch.
        check: After every arrival, check the purgatory's invariants
            (`purgatory.testing.check_invariants`, O(pending)): for tests.

    Yields:
        Batches of `OUTPUT_SCHEMA`: each operation's row, and after each group its gauges row.

    Raises:
        ValueError: The stream is not sorted (a group appears twice, or arrivals go back).
    """
    group: _Group | None = None
    seen: set[tuple[str, int]] = set()
    last_arrival = -math.inf
    for batch in batches:
        names = batch.column("purgatory").to_pylist()
        config_ids = batch.column("config_id").to_pylist()
        op_ids = batch.column("op_id").to_pylist()
        arrivals = batch.column("arrival").to_pylist()
        keys_column = batch.column("keys").to_pylist()
        timeouts = batch.column("timeout").to_pylist()
        conditions = batch.column("condition_at").to_pylist()
        for i in range(batch.num_rows):
            name = names[i]
            config_id = config_ids[i]
            if group is None or group.name != name or group.config_id != config_id:
                if group is not None:
                    yield from _finish(group)
                if (name, config_id) in seen:
                    raise ValueError(
                        f"replay input not grouped: group ({name!r}, {config_id}) seen twice"
                    )
                seen.add((name, config_id))
                log = None
                if event_log_dir is not None:
                    # Readable, and injective thanks to the hash of the exact name; no leading
                    # "_" or "." (Spark skips such files), bounded length.
                    safe = "".join(
                        c if (c.isascii() and c.isalnum()) or c in "-." else "_" for c in name
                    )
                    safe = safe.lstrip("_.")[:64] or "p"
                    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
                    log = _group_log(event_log_dir, f"{safe}-{digest}-c{config_id}")
                group = _Group(name, config_id, configs[config_id], log, check)
                last_arrival = -math.inf
            config = group.config
            arrival = arrivals[i]
            if arrival < last_arrival:
                raise ValueError(
                    f"replay input not sorted: purgatory {name!r} op_id {op_ids[i]} arrives at "
                    f"{arrival!r}, before the previous arrival {last_arrival!r}"
                )
            last_arrival = arrival
            condition = conditions[i]
            rate = config.rate_scale
            if rate == 1.0:
                t = arrival
            else:
                t = arrival / rate
                if condition is not None:
                    condition = t + (condition - arrival)
            group.arrive(
                op_ids[i], tuple(keys_column[i]), timeouts[i] * config.timeout_scale, condition, t
            )
            if len(group.out) >= output_rows:
                yield group.take_rows()
    if group is not None:
        yield from _finish(group)


def _group_log(directory: str, prefix: str) -> JsonLinesEventLog:
    """A group's recorder, publishing only at the group's end; an earlier attempt's files go.

    Spark re-runs a failed task whole, so the published files of a group replayed by an earlier
    attempt (same prefix) are removed first: each group's lines are published exactly once.
    """
    if os.path.isdir(directory):
        mine = re.compile(re.escape(prefix) + r"-[0-9a-f]{12}-[0-9]{6}\.jsonl")
        for entry in os.listdir(directory):
            if mine.fullmatch(entry):
                os.remove(os.path.join(directory, entry))
    return JsonLinesEventLog(directory, prefix=prefix, max_bytes=1 << 62, op_id=_op_id)


def _op_id(op: Any) -> int:
    return int(op.op_id)


def _finish(group: _Group) -> Iterator[pa.RecordBatch]:
    group.drain()
    if group.out:
        yield group.take_rows()
    yield group.stats_row()


def replay_table(
    trace: pa.Table,
    configs: Mapping[int, ReplayConfig],
    *,
    event_log_dir: str | None = None,
    check: bool = False,
) -> pa.Table:
    """Replay a whole trace table in this process under every configuration (no Spark).

    The reference implementation: the same engine as the Spark job, fed the same order.
    """
    parts = []
    for config_id in sorted(configs):
        with_id = trace.append_column(
            "config_id", pa.array([config_id] * trace.num_rows, pa.int32())
        )
        parts.append(with_id)
    table = pa.concat_tables(parts) if parts else trace
    table = table.sort_by(
        [
            ("purgatory", "ascending"),
            ("config_id", "ascending"),
            ("arrival", "ascending"),
            ("op_id", "ascending"),
        ]
    )
    batches = replay_batches(
        table.to_batches(max_chunksize=10000), configs, event_log_dir=event_log_dir, check=check
    )
    return pa.Table.from_batches(list(batches), schema=OUTPUT_SCHEMA)
