"""One group replayed as time shards, in parallel, with the same result as one replay.

A purgatory's state at time t comes from the operations that arrived within the longest timeout
before t: any earlier one has ended by then (expired at its deadline tick at the latest). So a
long group can be cut at arrival times B1 < B2 < ... into *shards*, each replayed by its own
task from an empty purgatory: shard k replays the operations that arrived from ``Bk - warm-up``
as a *warm-up* (their ends are not its own), and from ``Bk`` on, its own range, up to ``Bk+1``.

That argument does not cover everything a replay holds, and a shard never trusts it: at its
start (before it watches its first own operation) and at its end (the same moment: before the
first operation of the next shard), it takes a *fingerprint* of the whole state that decides
what follows (`fingerprint`): the pending operations (with their times, whether their condition
came, the conditions still to come), the watcher lists with their finished entries not yet
purged, Kafka's purge counter and the purge queue, the timing wheel's buckets, the clock, and,
with a cost profile, the loaded core (when it is free, its timer's pass due, its turn). The
replay is deterministic, so where the fingerprint the previous shard reached at a boundary
equals the one the next shard's warm-up rebuilt, everything after the boundary is what one
replay would do, row for row. Where they differ, that boundary is replayed sequentially (the
shards on both sides as one task) and the job says so: a split replay is exact or says where it
was not split.

Kafka's purge rule counts the operations finished since the last purge over the group's whole
history, and the finished entries stay on the lists until a purge; a warm-up would start that
count from 0. So, in a plain replay, each shard's warm-up re-enacts the unsplit replay's last
purge before it, foreseen from the trace (`purgatory.pipeline._purge_carry`): it reaches back one
longest timeout before that purge and purges exactly there. What may still differ, and falls
back: a shard with no purge foreseen a longest timeout before it (the group's first purge comes
later), and with a cost profile the purge counter (a purge's cost moves the core's timing, so it
is not carried), a core busy since before the warm-up (a backlog crossing the boundary), a
wake-up time rounded from when the core went idle (``wake_resolution``), and the scheduling
latencies drawn in sequence (``wake_latency``).

Each shard reports, besides its operations' rows (those that ended between its two
fingerprints), what sums or merges exactly: counts, the waits and expiry lateness themselves
(8 bytes per ended operation, sorted; the merged percentiles are the unsplit nearest ranks),
the gauges' peaks, the counters' increments, the busy time (an exact integer sum), and the
timer passes' lateness as counts per nanosecond. `merge_shards` makes the group's summary row.
"""

from __future__ import annotations

import hashlib
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice, pairwise
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa

from ._load import CostProfile
from ._purge_carry import Reenact, carry
from ._purge_carry import trace_columns as _columns
from ._replay import (
    _UNITS,
    OUTPUT_SCHEMA,
    ReplayConfig,
    _Group,
    _key_tuples,
    _LoadedGroup,
    _nearest_rank,
    _new_group,
    _rank,
)

__all__ = (
    "SHARD_SCHEMA",
    "ShardRange",
    "fingerprint",
    "gather_parts",
    "merge_shards",
    "replay_shards",
    "shard_bounds",
    "warmup_seconds",
)

#: What a shard's task adds to `OUTPUT_SCHEMA` (null on the operations' rows but ``shard``).
SHARD_FIELDS: Final = [
    pa.field("shard", pa.int32()),
    pa.field("shard_start", pa.string()),  # the fingerprint at its start ("" for shard 0)
    pa.field("shard_end", pa.string()),  # at its end ("" for the last shard)
    pa.field("shard_waits", pa.binary()),  # float64, sorted
    pa.field("shard_lateness", pa.binary()),  # float64, sorted
    pa.field("shard_pass_late", pa.binary()),  # int64 pairs: nanoseconds, passes
    pa.field("shard_busy", pa.string()),  # busy time in units of 2**-90 s (an integer)
    pa.field("shard_began", pa.float64()),  # the loaded core's first work (span start), or NaN
    pa.field("shard_free", pa.float64()),  # the loaded core's last work's end (span end)
    pa.field("shard_warmup_ops", pa.int64()),  # operations replayed as the warm-up
    # 0 on a shard's row; 1, 2, ... on the rows that carry the rest of its values (and nothing
    # else but its key): see `VALUES_PER_ROW` and `gather_parts`.
    pa.field("shard_part", pa.int32()),
]
SHARD_SCHEMA: Final = pa.schema([*OUTPUT_SCHEMA, *SHARD_FIELDS])

#: Values (float64) of one kind on one of a shard's rows: a shard's waits and lateness reach the
#: driver in rows of at most this many each (8 MiB), since an executor builds a row whole in its
#: heap (one row of a 20 M-operation shard's waits, 160 MB, ran the benchmark's 768 MB
#: executors out of memory) and an Arrow binary value holds at most 2 GiB.
VALUES_PER_ROW: Final = 1 << 20

#: Seconds (scaled) added to a warm-up beyond the longest timeout: a deadline is served at its
#: tick, rounded up, and a condition up to a tick past it is still queued.
MARGIN_TICKS: Final = 4


def warmup_seconds(longest_timeout: float, config: ReplayConfig, extra: float = 0.0) -> float:
    """A shard's warm-up in the trace's arrival seconds: one longest timeout (scaled), four ticks,
    and `extra` seconds of replay time (a loaded core's backlog), times the rate scale."""
    scaled = longest_timeout * config.timeout_scale + MARGIN_TICKS * config.tick + extra
    return scaled * config.rate_scale


@dataclass(frozen=True, slots=True)
class ShardRange:
    """One shard of one group: its own operations arrive in ``[start, end)`` (trace seconds).

    Attributes:
        index: 0, 1, ... in time order.
        start: Its first own arrival; ``-inf`` for the first shard (no warm-up).
        end: The next shard's first arrival, where it stops; ``inf`` for the last (it drains).
        warmup_from: Where its warm-up starts (trace seconds), if earlier than one longest
            timeout before `start`: one longest timeout before `reenact`'s purge point.
        reenact: The unsplit replay's last purge before `start` that the warm-up re-enacts
            (`purgatory.pipeline._purge_carry`): its kind and time (replay seconds).
    """

    index: int
    start: float
    end: float
    warmup_from: float = math.inf
    reenact: tuple[int, float] | None = None

    def warmup_start(self, seconds: float) -> float:
        """Where its input starts, for a warm-up of `seconds` (trace seconds) before `start`."""
        return min(self.start - seconds, self.warmup_from)


def shard_bounds(arrivals: np.ndarray, shards: int) -> list[float]:
    """The shards' start arrivals (after the first's): equal operation counts, each an arrival of
    the trace (sorted `arrivals`, or in place at least at the ranks read: 0 and
    ``k * n // shards``), distinct; fewer than ``shards - 1`` if the arrivals repeat."""
    n = len(arrivals)
    bounds: list[float] = []
    for k in range(1, shards):
        value = float(arrivals[min(n - 1, (k * n) // shards)])
        if value > float(arrivals[0]) and (not bounds or value > bounds[-1]):
            bounds.append(value)
    return bounds


class _Shard:
    """A group replayed as one shard: the warm-up, then its own range between two fingerprints."""

    def __init__(self, group: _Group, shard: ShardRange, operations: bool) -> None:
        self.group = group
        self.operations = operations
        self.shard = shard
        self.started = False
        self.stopped = False
        self.start_print = ""
        self.end_print = ""
        self.warmup_ops = 0
        self.base: list[int] = [0, 0, 0, 0]
        self.busy_base = 0
        group.keep = False
        if shard.reenact is not None and type(group) is _Group:
            Reenact(group, *shard.reenact)

    def feed(
        self,
        op_id: int,
        keys: tuple[str, ...],
        timeout: float,
        condition_at: float | None,
        arrival: float,
    ) -> None:
        """One row of the shard's input: a warm-up operation, one of its own, or the first of
        the next shard (where it stops; the rows after it are ignored)."""
        if self.stopped:
            return
        config = self.group.config
        rate = config.rate_scale
        t = arrival if rate == 1.0 else arrival / rate
        condition = condition_at
        if condition is not None and rate != 1.0:
            condition = t + (condition - arrival)
        shard = self.shard
        if arrival >= shard.end:
            if not self.started:
                self.begin(t)
            self.end(t)
            return
        if arrival >= shard.start and not self.started:
            self.begin(t)
        if not self.started:
            self.warmup_ops += 1
        self.group.arrive(op_id, keys, timeout * config.timeout_scale, condition, t)

    def feed_rows(
        self, batch: pa.RecordBatch, words: dict[str, str], output_rows: int
    ) -> Iterator[pa.RecordBatch]:
        """`feed` over a batch of the shard's input (by arrival), yielding its operations' rows
        `output_rows` at a time: where its warm-up ends and where it stops found by bisection,
        each part's rows handed to the group in a loop of its own, not row by row through
        `feed` (`words`: `_key_tuples`' keys)."""
        group = self.group
        config = group.config
        if self.stopped:
            return
        op_ids = batch.column("op_id").to_pylist()
        keys = _key_tuples(batch.column("keys"), words)
        timeouts = batch.column("timeout").to_pylist()
        conditions = batch.column("condition_at").to_pylist()
        arrivals = batch.column("arrival").to_pylist()
        if config.rate_scale != 1.0:  # (scaled times: row by row)
            for row in zip(op_ids, keys, timeouts, conditions, arrivals, strict=True):
                self.feed(*row)
                if len(group.out) >= output_rows:
                    yield _with_shard(group.take_rows(), self.shard.index)
            return
        shard = self.shard
        n = len(arrivals)
        own = 0 if self.started else bisect_left(arrivals, shard.start)
        stop = bisect_left(arrivals, shard.end, lo=own)
        arrive = group.arrive
        scale = config.timeout_scale
        rows = zip(op_ids, keys, timeouts, conditions, arrivals, strict=True)
        for op_id, key, timeout, condition, t in islice(rows, own):  # the warm-up's
            arrive(op_id, key, timeout * scale, condition, t)
        self.warmup_ops += own
        if own < n and not self.started:
            self.begin(arrivals[own])
        for op_id, key, timeout, condition, t in islice(rows, stop - own):  # its own
            arrive(op_id, key, timeout * scale, condition, t)
            if len(group.out) >= output_rows:
                yield _with_shard(group.take_rows(), shard.index)
        if stop < n:  # the next shard's first
            self.end(arrivals[stop])

    def begin(self, t: float) -> None:
        """Take the start fingerprint before the first own arrival (at `t`), and forget what the
        warm-up counted: from here on, the group's figures are the shard's own."""
        group = self.group
        if self.shard.index > 0:
            group.prepare(t)
            self.start_print = fingerprint(group)
        group.keep = self.operations
        group.out.clear()
        del group.waits[:], group.lateness[:]
        group.missed = 0
        group.peak_watched = group.peak_delayed = 0
        stats = group.purgatory.statistics()
        self.base = [stats.timer_passes, stats.purges, stats.purged, group.attempts]
        if isinstance(group, _LoadedGroup):
            group.late.clear()
            self.busy_base = group.busy
        self.started = True

    def end(self, t: float) -> None:
        """Stop before the next shard's first arrival (at `t`): the end fingerprint."""
        self.group.prepare(t)
        self.end_print = fingerprint(self.group)
        self.stopped = True

    def row(self) -> pa.RecordBatch:
        """The shard's row: `SHARD_SCHEMA`, with its figures since its start fingerprint."""
        group = self.group
        stats = group.purgatory.statistics()
        now = [stats.timer_passes, stats.purges, stats.purged, group.attempts]
        passes, purges, purged, attempts = (b - a for a, b in zip(self.base, now, strict=True))
        summary = group.summary()
        busy, late, busy_units = 0.0, b"", ""
        began = free = math.nan
        if isinstance(group, _LoadedGroup):
            busy_units = str(group.busy - self.busy_base)
            busy = (group.busy - self.busy_base) / _UNITS
            began, free = group.start, group.busy_until
            pairs = np.array(sorted(group.late.items()), dtype=np.int64).reshape(-1, 2)
            late = pairs.tobytes()
        values: list[Any] = [
            group.name,
            group.config_id,
            None,
            None,
            None,
            None,
            None,
            *summary,
            group.peak_watched,
            group.peak_delayed,
            passes,
            purges,
            purged,
            attempts,
            busy,
            0.0,
            None,
            None,
            None,
            self.shard.index,
            self.start_print,
            self.end_print,
            None,  # (the values: below)
            None,
            late,
            busy_units,
            began,
            free,
            self.warmup_ops,
            0,
        ]
        waits, lateness = _sorted(group.waits), _sorted(group.lateness)
        parts = max(1, -(-max(len(waits), len(lateness)) // VALUES_PER_ROW))
        keyed = {"purgatory", "config_id", "shard"}
        columns = []
        for value, field in zip(values, SHARD_SCHEMA, strict=True):
            if field.name in ("shard_waits", "shard_lateness"):
                run = waits if field.name == "shard_waits" else lateness
                chunks = [run[k * VALUES_PER_ROW : (k + 1) * VALUES_PER_ROW] for k in range(parts)]
                columns.append(pa.array([c.tobytes() for c in chunks], field.type))
            elif field.name == "shard_part":
                columns.append(pa.array(range(parts), field.type))
            elif field.name in keyed:
                columns.append(pa.array([value] * parts, field.type))
            else:  # (the parts after the first carry only the key and their values)
                columns.append(pa.array([value] + [None] * (parts - 1), field.type))
        return pa.RecordBatch.from_arrays(columns, schema=SHARD_SCHEMA)


def _sorted(values: Any) -> np.ndarray:
    return np.sort(np.frombuffer(values, dtype=np.float64))


def gather_parts(rows: Iterable[Mapping[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Each shard's row, with the waits and lateness of its parts (`VALUES_PER_ROW`) joined in
    order, from the replay's rows that are shards' (``shard_part`` set; the rest skipped)."""
    parts: dict[Key, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("shard_part") is not None:
            parts.setdefault((row["purgatory"], row["config_id"], row["shard"]), []).append(row)
    whole: dict[Key, dict[str, Any]] = {}
    for key, mine in parts.items():
        mine.sort(key=lambda r: int(r["shard_part"]))
        numbers = [r["shard_part"] for r in mine]
        if numbers != list(range(len(mine))):
            raise ValueError(f"shard {key} came with the parts {numbers}")
        row = dict(mine[0])
        for name in ("shard_waits", "shard_lateness"):
            row[name] = b"".join(r[name] for r in mine)
        whole[key] = row
    return whole


def _with_shard(batch: pa.RecordBatch, index: int) -> pa.RecordBatch:
    """An operations' batch of `OUTPUT_SCHEMA` as `SHARD_SCHEMA` (``shard`` set)."""
    n = batch.num_rows
    extra = [pa.array([index] * n, pa.int32())]
    extra += [pa.nulls(n, f.type) for f in SHARD_FIELDS[1:]]
    return pa.RecordBatch.from_arrays([*batch.columns, *extra], schema=SHARD_SCHEMA)


def replay_shards(
    batches: Iterable[pa.RecordBatch],
    configs: Mapping[int, ReplayConfig],
    ranges: Mapping[tuple[str, int, int], ShardRange],
    *,
    costs: CostProfile | None = None,
    operations: bool = True,
    check: bool = False,
    output_rows: int = 8192,
) -> Iterator[pa.RecordBatch]:
    """Replay shards: a stream sorted by (purgatory, config_id, shard, arrival, op_id).

    Each (purgatory, config_id, shard) is replayed from an empty purgatory: its rows before its
    range's start are the warm-up, its own rows follow, and its first row at or past its range's
    end (the next shard's first operation, included in its input for this) stops it; the last
    shard drains. Yields its operations' rows (those that ended between its fingerprints, if
    `operations`), then its row (`SHARD_SCHEMA`).
    """
    words: dict[str, str] = {}
    current: _Shard | None = None
    ident: tuple[str, int, int] | None = None

    def _group(key: tuple[str, int, int]) -> _Group:
        name, config_id, _ = key
        return _new_group(
            name,
            configs[config_id],
            config_id=config_id,
            event_log_dir=None,
            check=check,
            operations=operations,
            costs=costs,
        )

    def finish(state: _Shard) -> Iterator[pa.RecordBatch]:
        if not state.stopped:
            if state.shard.end != math.inf:
                raise ValueError(
                    f"shard {state.shard.index} of {state.group.name!r}@"
                    f"{state.group.config_id} has no operation at its end {state.shard.end!r}"
                )
            if not state.started:
                raise ValueError(f"shard {state.shard.index} has no operation of its own")
            state.group.drain()
        if state.group.out:
            yield _with_shard(state.group.take_rows(), state.shard.index)
        yield state.row()

    for batch in batches:
        for key, rows in _by_shard(batch):
            if ident != key:
                if current is not None:
                    yield from finish(current)
                ident = key
                current = _Shard(_group(key), ranges[key], operations)
            assert current is not None
            yield from current.feed_rows(rows, words, output_rows)
    if current is not None:
        yield from finish(current)


def _by_shard(batch: pa.RecordBatch) -> Iterator[tuple[tuple[str, int, int], pa.RecordBatch]]:
    """A batch of `replay_shards`' input cut where its shard changes: each part's shard and
    rows (a batch of one shard's rows, as the direct read makes them, whole)."""
    n = batch.num_rows
    if not n:
        return
    columns = [batch.column(c) for c in ("purgatory", "config_id", "shard")]
    first = (columns[0][0].as_py(), columns[1][0].as_py(), columns[2][0].as_py())
    if first == (columns[0][n - 1].as_py(), columns[1][n - 1].as_py(), columns[2][n - 1].as_py()):
        yield first, batch  # (sorted by shard: all of it)
        return
    keys = list(zip(*(column.to_pylist() for column in columns), strict=True))
    start = 0
    for i in range(1, n + 1):
        if i == n or keys[i] != keys[start]:
            yield keys[start], batch.slice(start, i - start)
            start = i


def fingerprint(group: _Group) -> str:
    """What decides the rest of `group`'s replay, as ``part=digest`` items joined by ``;``.

    Parts: ``pending`` (each operation not ended: id, watch time, timeout, condition met),
    ``conditions`` (the conditions still to come; with a cost profile, also those of ended
    operations, which still cost a dispatch), ``lists`` (each key's watcher list in order, with
    finished entries), ``purge`` (Kafka's counter, the rule's state, the purge queue),
    ``timer`` (the wheel's tick and queued buckets with their entries, the next pass), ``clock``
    (its time), and with a cost profile ``core`` (when it is free, the pass due, its turn, when
    it last woke).
    """
    p = group.purgatory
    timer = p._timer
    rule = p._rule
    lists = p._lists
    loaded = isinstance(group, _LoadedGroup)
    pending: set[Any] = set()
    listed = []
    for key, ops in lists:
        listed.append((key, tuple((op.op_id, op.ended) for op in ops)))
        pending.update(op for op in ops if not op.ended)
    pending.update(op for op in timer.wheel if not op.ended)
    parts: dict[str, Any] = {
        "pending": sorted(
            (op.op_id, op.watched_at, op.arrived_at, op.timeout, op.ready) for op in pending
        ),
        "conditions": sorted(
            (when, op.op_id, op.ended) for when, _, op in group.heap if loaded or not op.ended
        ),
        "lists": sorted(listed),
        "purge": (
            rule.owed,
            rule.trip,
            rule._requested,
            rule._purging,
            rule._armed,
            rule._idle_at,
            sorted(op.op_id for op in p._purge_queue if op._listed),  # (not the dead)
            p.watched(),
        ),
        "timer": (
            timer.wheel.current_tick,
            sorted(
                (tick, level, tuple(sorted(op.op_id for op in bucket)))
                for tick, level, _, bucket in timer.wheel._heap
            ),
            p.num_delayed(),
            timer.in_flight(),
            timer.next_pass_at(),
        ),
        "clock": group.now(),
    }
    if isinstance(group, _LoadedGroup):
        parts["core"] = (
            group.busy_until,
            group.pass_raw,
            group.pass_due,
            group.last_pass,
            group.batch,
            group.owed,
            group.woke,  # (a stall is drawn only `stall_credit` after the loop last woke)
            group.draw.__self__.getstate() if group.costs.wake_latency else None,  # type: ignore[attr-defined]
        )
    return ";".join(
        f"{name}={hashlib.sha256(repr(value).encode()).hexdigest()[:16]}"
        for name, value in parts.items()
    )


def differing(before: str, after: str) -> list[str]:
    """The parts of two fingerprints that differ (``["all"]`` if they do not parse alike)."""
    a = dict(item.split("=", 1) for item in before.split(";") if item)
    b = dict(item.split("=", 1) for item in after.split(";") if item)
    if a.keys() != b.keys():
        return ["all"]
    return [name for name in a if a[name] != b[name]]


@dataclass(frozen=True, slots=True)
class Boundary:
    """One boundary between two shards of a group, and whether its fingerprints matched."""

    purgatory: str
    config_id: int
    shard: int  # the shard that starts here
    at: float  # its first arrival (trace seconds)
    matched: bool
    parts: tuple[str, ...]  # the fingerprint parts that differed

    def describe(self) -> str:
        where = f"{self.purgatory}@{self.config_id} boundary before shard {self.shard} at "
        where += f"{self.at:.6g} s"
        if self.matched:
            return f"{where}: state rebuilt by the warm-up matched"
        return (
            f"{where}: state rebuilt by the warm-up differed ({', '.join(self.parts)}): "
            "replayed sequentially"
        )


def check_boundaries(
    rows: Sequence[Mapping[str, Any]], ranges: Mapping[tuple[str, int, int], ShardRange]
) -> list[Boundary]:
    """Each boundary of the shards' rows (one group's, in shard order), checked."""
    ordered = sorted(rows, key=lambda r: r["shard"])
    out = []
    for before, after in pairwise(ordered):
        key = (after["purgatory"], after["config_id"], after["shard"])
        parts = differing(before["shard_end"], after["shard_start"])
        out.append(
            Boundary(
                purgatory=after["purgatory"],
                config_id=after["config_id"],
                shard=after["shard"],
                at=ranges[key].start,
                matched=not parts,
                parts=tuple(parts),
            )
        )
    return out


def merge_shards(rows: Sequence[Mapping[str, Any]], loaded: bool) -> dict[str, Any]:
    """One group's summary row (`OUTPUT_SCHEMA`'s columns) from its shards' rows, exactly.

    Counts, increments and busy units add up; peaks are maxima; the waits, the lateness and the
    pass lateness counts are merged whole, and their percentiles taken by nearest rank, as one
    replay takes them.
    """
    ordered = sorted(rows, key=lambda r: r["shard"])
    first, last = ordered[0], ordered[-1]
    waits = [np.frombuffer(r["shard_waits"], np.float64) for r in ordered]
    lateness = [np.frombuffer(r["shard_lateness"], np.float64) for r in ordered]
    out: dict[str, Any] = dict.fromkeys(OUTPUT_SCHEMA.names)
    out["purgatory"], out["config_id"] = first["purgatory"], first["config_id"]
    ended, expired = sum(map(len, waits)), sum(map(len, lateness))
    out.update(
        operations=ended,
        completed=ended - expired,
        expired=expired,
        missed=sum(r["missed"] for r in ordered),
        peak_watched=max(r["peak_watched"] for r in ordered),
        peak_delayed=max(r["peak_delayed"] for r in ordered),
    )
    for name in ("timer_passes", "purges", "purged_entries", "attempts"):
        out[name] = sum(r[name] for r in ordered)
    for prefix, values in (("wait", waits), ("lateness", lateness)):
        n = sum(map(len, values))
        if n:
            out[f"{prefix}_p50"] = _kth(values, _nearest_rank(0.5, n))
            out[f"{prefix}_p99"] = _kth(values, _nearest_rank(0.99, n))
            out[f"{prefix}_max"] = _kth(values, n)
    busy = 0.0
    span = 0.0
    late: list[float] = [0.0, 0.0, 0.0]
    if loaded:
        busy = sum(int(r["shard_busy"]) for r in ordered) / _UNITS
        began, free = first["shard_began"], last["shard_free"]
        span = free - began if free > began else 0.0
        counts: dict[int, int] = {}
        for r in ordered:
            pairs = np.frombuffer(r["shard_pass_late"], np.int64).reshape(-1, 2)
            for value, count in pairs.tolist():
                counts[value] = counts.get(value, 0) + count
        pairs_sorted = sorted(counts.items())
        late = [_rank(pairs_sorted, p) / 1e9 for p in (0.5, 0.99, 1.0)]
    out.update(
        busy=busy,
        span=span,
        pass_late_p50=late[0],
        pass_late_p99=late[1],
        pass_late_max=late[2],
    )
    return out


def _kth(runs: Sequence[np.ndarray], k: int) -> float:
    """The `k`-th smallest (1-based) of the values of sorted `runs` together, exactly, without
    merging them (20 million waits took a second): it is the value v of some run whose rank
    among them all spans k (fewer than k values below v, k or more up to it), found in its run
    by bisection on that rank, which grows with v."""
    ranks = [(r, r.searchsorted) for r in runs if len(r)]

    def up_to(v: float, side: Literal["left", "right"]) -> int:
        return sum(int(rank(v, side=side)) for _, rank in ranks)

    for run, _ in ranks:
        lo, hi = 0, len(run)  # the first index whose value has k or more values up to it
        while lo < hi:
            mid = (lo + hi) // 2
            if up_to(float(run[mid]), "right") >= k:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(run) and up_to(float(run[lo]), "left") < k:
            return float(run[lo])
    raise ValueError(f"no {k}-th value among {sum(len(r) for r, _ in ranks)}")


Key = tuple[str, int, int]
Runner = Callable[[Mapping[Key, ShardRange]], Mapping[Key, Mapping[str, Any]]]


def plan_ranges(
    arrivals: Mapping[tuple[str, int], np.ndarray], shards: int
) -> dict[Key, ShardRange]:
    """Each group's shards (`shard_bounds` of its arrivals, in any order), keyed (purgatory,
    config_id, shard).

    Only the arrivals of the ranks `shard_bounds` reads are put in place (``np.partition``:
    linear, where a sort of 20 million takes seconds), once per array however many groups
    share it.
    """
    ranges: dict[Key, ShardRange] = {}
    bounds: dict[int, list[float]] = {}
    for (name, config_id), times in arrivals.items():
        if id(times) not in bounds:
            n = len(times)
            ranks = sorted({0, *(min(n - 1, (k * n) // shards) for k in range(1, shards))})
            placed = np.partition(times, ranks) if n else times
            bounds[id(times)] = shard_bounds(placed, shards)
        starts = [-math.inf, *bounds[id(times)]]
        ends = [*starts[1:], math.inf]
        for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
            ranges[(name, config_id, k)] = ShardRange(k, start, end)
    return ranges


def settle(
    ranges: Mapping[Key, ShardRange], run: Runner
) -> tuple[dict[Key, ShardRange], dict[Key, Mapping[str, Any]], list[Boundary]]:
    """Replay the shards (`run`: their rows by key), check every boundary, and replay the
    shards on both sides of a mismatched boundary again as one (in a further `run`), until
    every boundary left matches.

    A mismatch right after another one, before a shard whose warm-up re-enacted a purge (so
    that its start is presumably the unsplit replay's), waits for the next round: the shard
    before it ended wrong because it started wrong, and once it is replayed with its own
    predecessor its end is checked again (a shard the previous one could not be carried into
    then costs one shard replayed again, not every shard after it).

    Returns:
        The shards finally replayed, their rows, and every boundary checked: those that matched
        at the end, and each that did not, once (it was then replayed sequentially).
    """
    current = dict(ranges)
    rows = dict(run(current))
    failed: list[Boundary] = []
    while True:
        boundaries = _boundaries(current, rows)
        if all(b.matched for b in boundaries):
            return (
                current,
                rows,
                sorted(failed + boundaries, key=lambda b: (b.purgatory, b.config_id, b.at)),
            )
        bad = []
        for before, boundary in pairwise([None, *boundaries]):
            if boundary is None or boundary.matched:
                continue
            key = (boundary.purgatory, boundary.config_id, boundary.shard)
            waits = (
                before is not None
                and not before.matched
                and (before.purgatory, before.config_id) == key[:2]
                and current[key].reenact is not None
            )
            if not waits:
                bad.append(boundary)
        failed += bad
        merged, replaced = _merge_ranges(
            current, {(b.purgatory, b.config_id, b.shard) for b in bad}
        )
        for key in replaced:
            del current[key]
            rows.pop(key, None)
        current.update(merged)
        rows.update(run(merged))


def _boundaries(
    current: Mapping[Key, ShardRange], rows: Mapping[Key, Mapping[str, Any]]
) -> list[Boundary]:
    by_group: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for key in sorted(current):
        by_group.setdefault((key[0], key[1]), []).append(rows[key])
    out: list[Boundary] = []
    for group_rows in by_group.values():
        out += check_boundaries(group_rows, current)
    return out


def _merge_ranges(
    current: Mapping[Key, ShardRange], cut: set[Key]
) -> tuple[dict[Key, ShardRange], set[Key]]:
    """The shards joined across the boundaries in `cut` (each keyed by the shard starting
    there), and the shards they replace."""
    groups = {(k[0], k[1]) for k in cut}
    merged: dict[Key, ShardRange] = {}
    replaced: set[Key] = set()
    for name, config_id in sorted(groups):
        mine = sorted(
            (r for k, r in current.items() if (k[0], k[1]) == (name, config_id)),
            key=lambda r: r.index,
        )
        segment = [mine[0]]
        for shard in [*mine[1:], None]:
            if shard is not None and (name, config_id, shard.index) in cut:
                segment.append(shard)
                continue
            if len(segment) > 1:
                head = segment[0]
                merged[(name, config_id, head.index)] = replace(head, end=segment[-1].end)
                replaced.update((name, config_id, r.index) for r in segment)
            segment = [shard] if shard is not None else []
    return merged, replaced


def shard_input(
    trace: pa.Table,
    config_id: int,
    config: ReplayConfig,
    ranges: Mapping[Key, ShardRange],
    *,
    extra: float = 0.0,
) -> pa.Table:
    """The rows of `trace` each shard of `ranges` (of `config_id`) replays: its warm-up, its own
    range and the rows at its end; columns ``shard`` and ``config_id`` added, sorted."""
    import pyarrow.compute as pc

    longest = {
        name: float(pc.max(trace.filter(pc.equal(trace["purgatory"], name))["timeout"]).as_py())
        for name in {k[0] for k in ranges if k[1] == config_id}
    }
    parts = []
    for (name, cid, index), shard in sorted(ranges.items()):
        if cid != config_id:
            continue
        lo = shard.warmup_start(warmup_seconds(longest[name], config, extra))
        mask = pc.and_(
            pc.equal(trace["purgatory"], name),
            pc.and_(
                pc.greater_equal(trace["arrival"], lo), pc.less_equal(trace["arrival"], shard.end)
            ),
        )
        rows = trace.filter(mask)
        rows = rows.append_column("config_id", pa.array([cid] * rows.num_rows, pa.int32()))
        parts.append(rows.append_column("shard", pa.array([index] * rows.num_rows, pa.int32())))
    table = pa.concat_tables(parts)
    return table.sort_by(
        [
            ("purgatory", "ascending"),
            ("config_id", "ascending"),
            ("shard", "ascending"),
            ("arrival", "ascending"),
            ("op_id", "ascending"),
        ]
    )


def split_table(
    trace: pa.Table,
    configs: Mapping[int, ReplayConfig],
    shards: int,
    *,
    costs: CostProfile | None = None,
    extra: float = 0.0,
    check: bool = False,
) -> tuple[pa.Table, list[Boundary]]:
    """`replay_table`'s result (operations' rows, then each group's row) by time shards, in this
    process: the reference of the Spark job's split replay, and what the tests compare with the
    unsplit replay. Returns the boundaries checked too."""
    import pyarrow.compute as pc

    arrivals = {}
    for name in sorted(set(trace["purgatory"].to_pylist())):
        times = trace.filter(pc.equal(trace["purgatory"], name))["arrival"].to_numpy()
        for config_id in configs:
            arrivals[(name, config_id)] = times
    ranges = plan_ranges(arrivals, shards)
    if costs is None:  # (a loaded core's timing depends on when purges ran: no carry)
        ranges = carry(ranges, *_columns(trace), configs)
    ops: dict[Key, list[dict[str, Any]]] = {}

    def run(todo: Mapping[Key, ShardRange]) -> dict[Key, Mapping[str, Any]]:
        found: list[Mapping[str, Any]] = []
        for config_id, config in sorted(configs.items()):
            if not any(k[1] == config_id for k in todo):
                continue
            table = shard_input(trace, config_id, config, todo, extra=extra)
            for key in todo:
                if key[1] == config_id:
                    ops.pop(key, None)
            for batch in replay_shards(
                table.to_batches(max_chunksize=1000), configs, todo, costs=costs, check=check
            ):
                for row in batch.to_pylist():
                    key = (row["purgatory"], row["config_id"], row["shard"])
                    if row["op_id"] is None:
                        found.append(row)
                    else:
                        ops.setdefault(key, []).append(row)
        return dict(gather_parts(found))

    final, rows, boundaries = settle(ranges, run)
    out_rows: list[dict[str, Any]] = []
    for key in sorted(final):
        out_rows += ops.get(key, [])
    names = OUTPUT_SCHEMA.names
    ops_table = pa.Table.from_pylist(
        [{n: r[n] for n in names} for r in out_rows], schema=OUTPUT_SCHEMA
    )
    by_group: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for key in sorted(final):
        by_group.setdefault((key[0], key[1]), []).append(rows[key])
    summary = pa.Table.from_pylist(
        [merge_shards(group_rows, costs is not None) for group_rows in by_group.values()],
        schema=OUTPUT_SCHEMA,
    )
    return pa.concat_tables([ops_table, summary]), boundaries
