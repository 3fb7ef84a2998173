"""Kafka's purge counter carried into a time shard: where the unsplit replay purged, foreseen from
the trace, and a shard's warm-up made to purge there too.

Kafka's purge rule counts the operations finished since the last purge (`purgatory._purge_rule`)
over a group's whole history, so a warm-up of one longest timeout, which counts from zero,
purges elsewhere than the unsplit replay: its watcher lists and its counter differ at the
boundary, and the boundary was replayed sequentially (`purgatory.pipeline._shards`). Yet where
the unsplit replay purged follows from the trace alone, in a plain replay (no cost profile):

- each operation ends on its own: it completes when its condition comes (the replay marks it
  ready and triggers its first key, where it is the only ready watcher: one completion per
  trigger), unless the timer pass of its deadline tick came first (it expires there); one whose
  condition came by its arrival completes in its first try and is never registered, so never
  counted;
- the counter adds one at each completion, and after a pass the operations the pass expired; a
  completion that takes it over the interval asks a pass, which runs before anything else
  happens and purges (the counter is 0 after it); a pass that takes it over purges itself;
- at one instant a timer pass comes before the conditions (the replay's order).

`purge_points` replays that counter over the trace's completions and expiries in time order,
vectorized but for one step per expiring tick, and `carry` gives each shard the unsplit
replay's last purge point at least one longest timeout before its start, and a warm-up from one
longest timeout before that point (so every operation the unsplit replay had on its lists after
the purge is one of the warm-up's). The shard's warm-up then purges nothing until that point
(its counter set far below zero), and purges exactly there (its counter set over the interval:
at the completion's next clock move, where the unsplit replay's pass ran, or just before the
expiring pass). After the purge both replays hold the same operations and count the same
finishes from 0, so they purge alike up to the boundary; and the operations pending at the
boundary all came after the purge, when both timers ran the same passes (a warm-up's wheel,
whose passes differed before the purge, may otherwise hold them at other levels: the check's
``timer`` part). A warm-up is then two longest timeouts and one purge cycle at most.

None of this is trusted either: the boundary's fingerprint compares the whole state, the
counter, the purge queue and the finished entries on the lists included. A foreseen point that
is wrong (float rounding, a trace the job reads otherwise) shows there and falls back to
sequential, as before. A completion is used as a purge point only if no other completion comes
at the same instant (the warm-up finds it by time), otherwise an earlier point is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from ._replay import ReplayConfig, _Group
    from ._shards import Key, ShardRange

__all__ = (
    "PASS",
    "UNIT",
    "Reenact",
    "by_purgatory",
    "carry",
    "purge_points",
    "time_of",
    "trace_columns",
)

#: The kinds of purge point: a timer pass that expired operations purged (at the pass), or a
#: completion asked for a pass that purged (at the completion's instant, before anything else).
PASS: Final = 0
UNIT: Final = 1

#: The timer's rounding slack (`purgatory._timer._TICK_SLACK`), in the same arithmetic.
_TICK_SLACK: Final = 1e-6
#: Steps of the purge counter tested one by one where its passes hit often (`_counter_hits`).
_DENSE: Final = 64
#: A counter a warm-up cannot bring over any interval before its purge point.
_HELD: Final = -(2**62)


def time_of(ticks: np.ndarray, tick: float) -> np.ndarray:
    """`SystemTimer.time_of` over an array of ticks: the earliest time whose tick (floor of
    ``time / tick + slack``) reaches each, in the same float arithmetic."""
    at = (ticks - _TICK_SLACK) * tick
    for _ in range(64):
        short = np.floor(at / tick + _TICK_SLACK) < ticks
        if not short.any():
            break
        at = np.where(short, np.nextafter(at, np.inf), at)
    for _ in range(64):
        earlier = np.nextafter(at, -np.inf)
        reaches = np.floor(earlier / tick + _TICK_SLACK) >= ticks
        if not reaches.any():
            break
        at = np.where(reaches, earlier, at)
    return at


def purge_points(
    arrival: np.ndarray, timeout: np.ndarray, condition: np.ndarray, config: ReplayConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where a plain replay of one group under `config` purges, from its trace columns (trace
    seconds; `condition` NaN where it never comes).

    Returns:
        The purge points in time order: their times (replay seconds: a completion's condition
        time, or a pass's time), kinds (`PASS` or `UNIT`) and whether each can be re-enacted
        (a completion alone at its instant; a pass at its deadline tick, not the pass of an
        operation due as it was watched).
    """
    rate = config.rate_scale
    t = arrival if rate == 1.0 else arrival / rate
    cond = condition if rate == 1.0 else t + (condition - arrival)
    tick = config.tick
    with np.errstate(invalid="ignore"):
        registered = ~(cond <= t)
        due = timeout * config.timeout_scale if config.timeout_scale != 1.0 else timeout.copy()
        due += t  # (in place: the same operations as ceil((t + timeout) / tick - slack))
        due /= tick
        due -= _TICK_SLACK
        np.ceil(due, out=due)
        # A time comes before its deadline tick's pass (at `time_of(due)`) exactly where its
        # own tick is before it (a time's tick is monotone in it): no pass time per operation.
        completes = registered & (_tick_of(cond, tick) < due)
    expires = registered & ~completes
    # An operation whose deadline tick has come by its watch (a timeout under a tick) expires
    # alone, in a pass at the clock's next move: after it, and after the conditions due then.
    late = expires & (_tick_of(t, tick) >= due)
    # (Conditions come a latency after their arrivals: nearly sorted, which a stable sort's
    # runs take in a third of the time.)
    units = np.sort(cond[completes], kind="stable")
    lump_ticks, lump_sizes = np.unique(due[expires & ~late], return_counts=True)
    lump_at = np.concatenate([time_of(lump_ticks, tick), t[late]])
    lump_sizes = np.concatenate([lump_sizes, np.ones(int(late.sum()), np.int64)])
    alone = np.concatenate([np.zeros(len(lump_ticks), bool), np.ones(int(late.sum()), bool)])
    order = np.lexsort((alone, lump_at))
    lump_at, lump_sizes, alone = lump_at[order], lump_sizes[order], alone[order]
    # The completions before each expiring pass (one at a pass's own instant comes after it,
    # and before the pass of an operation that came due as it was watched).
    before = np.where(
        alone,
        np.searchsorted(units, lump_at, side="right"),
        np.searchsorted(units, lump_at, side="left"),
    )
    hits, pass_hits = _counter_hits(before, lump_sizes, len(units), config.purge_interval + 1)
    single = np.ones(len(hits), bool)
    if len(hits):
        previous = np.concatenate([[np.nan], units[:-1]])
        following = np.concatenate([units[1:], [np.nan]])
        single = (units[hits] != previous[hits]) & (units[hits] != following[hits])
    times = np.concatenate([units[hits], lump_at[pass_hits]])
    kinds = np.concatenate([np.full(len(hits), UNIT), np.full(len(pass_hits), PASS)])
    clean = np.concatenate([single, ~alone[pass_hits]])
    order = np.argsort(times, kind="stable")
    return times[order], kinds[order], clean[order]


def _tick_of(times: np.ndarray, tick: float) -> np.ndarray:
    """The timer's tick of each time (`SystemTimer`'s floor of ``time / tick + slack``)."""
    ticks = times / tick
    ticks += _TICK_SLACK
    return np.floor(ticks, out=ticks)


def _counter_hits(
    before: np.ndarray, sizes: np.ndarray, units: int, cycle: int
) -> tuple[np.ndarray, np.ndarray]:
    """Kafka's purge counter over `units` completions and the expiring passes between them,
    in time order: the completions that take it to `cycle` (a purge asked), and the passes
    that do (a purge run, the counter then 0).

    Pass j expires `sizes[j]` operations after the first `before[j]` completions (`before`
    non-decreasing). Step j counts its completions (``before[j-1]`` to ``before[j]``), then its
    pass; a last step counts the completions after every pass. From a start at 0, the counter
    is the total counted since, modulo `cycle`: ``(h - base) % cycle`` after step j's
    completions, with ``h = before[j] + sizes[:j].sum()`` and `base` that total at the start;
    the pass then hits if that plus its size reaches `cycle`, and the counter starts again at
    0 after it (base ``h + sizes[j]``). The passes that hit are found a block of steps at a time
    (a few in each of many cycles), then each step's completions that hit, every `cycle`-th
    from the first: arrays over the steps, where a loop took a Python iteration per expiring
    pass (1.5 million over 20 million W1 operations).

    Returns:
        The completions' indices and the passes' indices, each increasing.
    """
    steps = len(sizes)
    sizes = sizes.astype(np.int64)
    earlier = np.concatenate([[0], np.cumsum(sizes)])  # (sizes of the passes before each step)
    ends = np.concatenate([before.astype(np.int64), [units]])  # (each step's last completion)
    h = ends[:-1] + earlier[:-1]
    pass_hits: list[int] = []
    bases = [0]
    j, block = 0, _DENSE
    while j < steps:
        stop = min(steps, j + block)
        if block <= _DENSE:  # (hits every few steps: one by one, as arrays cost more)
            base, found = bases[-1], len(pass_hits)
            for i, (at, size) in enumerate(
                zip(h[j:stop].tolist(), sizes[j:stop].tolist(), strict=True), j
            ):
                if (at - base) % cycle + size >= cycle:
                    pass_hits.append(i)
                    base = at + size
                    bases.append(base)
            j, block = stop, _DENSE if len(pass_hits) - found > 1 else 2 * _DENSE
            continue
        over = ((h[j:stop] - bases[-1]) % cycle) + sizes[j:stop] >= cycle
        if not over.any():
            j, block = stop, block * 2
            continue
        gap = int(np.argmax(over))
        pass_hits.append(j + gap)
        bases.append(int(h[j + gap] + sizes[j + gap]))
        j, block = j + gap + 1, max(_DENSE, 2 * gap)
    # Each step's base (a pass that hits counts its step's completions before it), its first
    # completion and the counter there: its first completion to hit, and every cycle-th after.
    hit_steps = np.array(pass_hits, np.int64)
    step_base = np.repeat(
        np.array(bases, np.int64), np.diff(np.concatenate([[0], hit_steps + 1, [steps + 1]]))
    )
    first = np.concatenate([[0], ends[:-1]])
    owed = (first + earlier - step_base) % cycle
    start = first + cycle - owed - 1
    count = np.where(start < ends, (ends - start + cycle - 1) // cycle, 0)
    starts = np.repeat(start, count)
    offsets = np.arange(len(starts), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return starts + offsets * cycle, hit_steps


def carry(
    ranges: Mapping[Key, ShardRange],
    columns: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
    longest: Mapping[str, float],
    configs: Mapping[int, ReplayConfig],
) -> dict[Key, ShardRange]:
    """`ranges` with each shard after the first of a group under a purge interval above 0 given
    the last purge point it can re-enact at least one longest timeout (and four ticks) before
    its start, and a warm-up from as much before that point, in trace seconds.

    `columns` holds each purgatory's arrivals, timeouts and conditions (NaN: never). A shard
    with no such point before it keeps its warm-up (and its boundary will fall back).
    """
    from ._shards import MARGIN_TICKS

    out = dict(ranges)
    points: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    last_start: dict[str, float] = {}
    for (name, _, _), shard in ranges.items():
        last_start[name] = max(last_start.get(name, -math.inf), shard.start)
    history: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for key, shard in ranges.items():
        name, config_id, _ = key
        config = configs[config_id]
        if shard.index == 0 or config.purge_interval == 0 or name not in columns:
            continue
        if name not in history:
            history[name] = _before(columns[name], last_start[name])
        if (name, config_id) not in points:
            times, kinds, clean = purge_points(*history[name], config)
            points[(name, config_id)] = (times[clean], kinds[clean])
        times, kinds = points[(name, config_id)]
        rate = config.rate_scale
        start = shard.start if rate == 1.0 else shard.start / rate
        reach = longest[name] * config.timeout_scale + MARGIN_TICKS * config.tick
        k = int(np.searchsorted(times, start - reach, side="left")) - 1
        if k < 0:
            continue
        at = float(times[k])
        out[key] = replace(shard, warmup_from=(at - reach) * rate, reenact=(int(kinds[k]), at))
    return out


def _before(
    columns: tuple[np.ndarray, np.ndarray, np.ndarray], start: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The operations that arrived before `start` (trace seconds), the last shard's: a purge
    point before a shard's start comes of completions and expiries of operations that arrived
    before it, so the history after the last start would only lengthen `purge_points` (by
    half for two shards)."""
    arrival = columns[0]
    keep = arrival < start
    if bool(keep.all()):
        return columns
    return (arrival[keep], columns[1][keep], columns[2][keep])


def trace_columns(
    trace: pa.Table,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], dict[str, float]]:
    """Each purgatory's arrivals, timeouts and conditions (NaN: never) as float64 arrays, and
    its longest timeout, from a trace table (`carry`'s input)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(trace["purgatory"].cast(pa.string())).combine_chunks()
    values = [
        trace[c].cast(pa.float64()).to_numpy() for c in ("arrival", "timeout", "condition_at")
    ]
    grouped = by_purgatory(
        encoded.indices.to_numpy(zero_copy_only=False),
        encoded.dictionary.to_pylist(),
        values,
    )
    columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    longest: dict[str, float] = {}
    for name, (arrival, timeout, condition) in grouped.items():
        columns[name] = (arrival, timeout, condition)
        longest[name] = float(timeout.max()) if len(timeout) else 0.0
    return columns, longest


def by_purgatory(
    codes: np.ndarray, names: Sequence[str], values: Sequence[np.ndarray]
) -> dict[str, list[np.ndarray]]:
    """`values` (arrays over the same rows) split by purgatory: `codes` gives each row's, an
    index into `names`; each purgatory's rows in their order. Rows already grouped by
    purgatory (a trace of one, or written in order) are sliced, not copied."""
    marks = np.arange(len(names) + 1, dtype=codes.dtype)  # (the codes' type: not copied)
    if len(codes) < 2 or bool(np.all(codes[1:] >= codes[:-1])):
        bounds = np.searchsorted(codes, marks)
        order = None
    else:
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], marks)
    out: dict[str, list[np.ndarray]] = {}
    for i, name in enumerate(names):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        if lo == hi:
            continue
        if order is None:
            out[name] = [v[lo:hi] for v in values]
        else:
            rows = order[lo:hi]
            out[name] = [v[rows] for v in values]
    return out


class Reenact:
    """Stands in for a group's clock in a warm-up that purges where the unsplit replay did.

    Installed before the first operation: the group's counter is held far below the interval
    (no purge), and the first clock move at or past the purge point (`at`, replay seconds) sets
    it over the interval: for a `PASS`, just before that pass runs; for a `UNIT`, at the move
    after the completion's own (the completion ran between them), asking the pass its settle
    would have asked. The group's own clock is then back in place.
    """

    __slots__ = ("at", "clock", "group", "kind", "seen")

    def __init__(self, group: _Group, kind: int, at: float) -> None:
        self.group = group
        self.clock = group.clock
        self.kind = kind
        self.at = at
        self.seen = False
        group.purgatory._rule.owed = _HELD
        group.clock = self  # type: ignore[assignment]

    def now(self) -> float:
        return self.clock.now()

    def advance_to(self, when: float) -> int:
        """The clock's move, with the purge set up on the way (see the class docstring)."""
        if when < self.at:
            return self.clock.advance_to(when)
        clock = self.clock
        if self.kind == UNIT:
            if not self.seen:
                self.seen = True
                if when != self.at:  # not the completion's move: leave it (the check sees it)
                    self._restore()
                return clock.advance_to(when)
            self._set(ask=True)
            return clock.advance_to(when)
        below = math.nextafter(self.at, -math.inf)
        if below >= clock.now():
            clock.advance_to(below)
        self._set(ask=False)
        return clock.advance_to(when)

    def _set(self, *, ask: bool) -> None:
        purgatory = self.group.purgatory
        rule = purgatory._rule
        rule.owed = rule.interval + 1
        if ask and rule.due():
            purgatory._timer.request_pass()
        self._restore()

    def _restore(self) -> None:
        self.at = math.inf
        self.group.clock = self.clock
