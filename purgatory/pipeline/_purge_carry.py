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
from collections.abc import Mapping
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
        due = np.ceil((t + timeout * config.timeout_scale) / tick - _TICK_SLACK)
        pass_at = time_of(due, tick)
        completes = registered & (cond < pass_at)
    expires = registered & ~completes
    # An operation whose deadline tick has come by its watch (a timeout under a tick) expires
    # alone, in a pass at the clock's next move: after it, and after the conditions due then.
    late = expires & (pass_at <= t)
    units = np.sort(cond[completes])
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
    ).tolist()
    cycle = config.purge_interval + 1
    unit_hits: list[np.ndarray] = []
    pass_hits: list[int] = []
    owed = 0
    done = 0
    ends, sizes = [*before, len(units)], [*lump_sizes.tolist(), 0]
    for j, (end, size) in enumerate(zip(ends, sizes, strict=True)):
        count = end - done
        if owed + count >= cycle:  # the completions that take the counter over the interval
            unit_hits.append(np.arange(done + cycle - owed - 1, end, cycle))
        owed = (owed + count) % cycle
        done = end
        if j < len(lump_at):
            owed += size
            if owed >= cycle:
                pass_hits.append(j)
                owed = 0
    hits = np.concatenate(unit_hits) if unit_hits else np.zeros(0, np.int64)
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
    for key, shard in ranges.items():
        name, config_id, _ = key
        config = configs[config_id]
        if shard.index == 0 or config.purge_interval == 0 or name not in columns:
            continue
        if (name, config_id) not in points:
            times, kinds, clean = purge_points(*columns[name], config)
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


def trace_columns(
    trace: pa.Table,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], dict[str, float]]:
    """Each purgatory's arrivals, timeouts and conditions (NaN: never) as float64 arrays, and
    its longest timeout, from a trace table (`carry`'s input)."""
    values = [
        trace[c].cast(pa.float64()).to_numpy() for c in ("arrival", "timeout", "condition_at")
    ]
    columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    longest: dict[str, float] = {}
    for name, (arrival, timeout, condition) in by_purgatory(trace["purgatory"], values).items():
        columns[name] = (arrival, timeout, condition)
        longest[name] = float(timeout.max()) if len(timeout) else 0.0
    return columns, longest


def by_purgatory(
    names: pa.Array | pa.ChunkedArray, values: list[np.ndarray]
) -> dict[str, list[np.ndarray]]:
    """`values` (arrays of the rows of `names`, no null name) split by purgatory, each in the
    rows' order. Rows already grouped by purgatory (a trace of one, or written in order) are
    sliced, not copied."""
    import pyarrow.compute as pc

    if isinstance(names, pa.ChunkedArray):
        if pa.types.is_dictionary(names.type):  # (one dictionary for every chunk)
            names = pa.table({"n": names}).unify_dictionaries()["n"]
        names = names.combine_chunks()
    if not pa.types.is_dictionary(names.type):
        names = pc.dictionary_encode(names)
    codes = names.indices.to_numpy(zero_copy_only=False)
    n_names = len(names.dictionary)
    if len(codes) < 2 or bool(np.all(codes[1:] >= codes[:-1])):
        bounds = np.searchsorted(codes, np.arange(n_names + 1))
        order = None
    else:
        order = np.argsort(codes, kind="stable")
        bounds = np.searchsorted(codes[order], np.arange(n_names + 1))
    out: dict[str, list[np.ndarray]] = {}
    for i, name in enumerate(names.dictionary.to_pylist()):
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
