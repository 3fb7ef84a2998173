"""The summary a replay and an event log's analysis share, computed the same way by both."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = (
    "COUNTS",
    "GAUGES",
    "REPLAY_SUMMARY_COLUMNS",
    "SHARED_SUMMARY_COLUMNS",
    "STATS",
    "outcome_summary",
    "share",
)

#: The operations, then one count per outcome.
COUNTS: Final = ("operations", "completed", "expired", "cancelled", "refused", "open")
#: Waits (completed and expired operations) and expiry lateness: p50, p99, max.
STATS: Final = (
    "wait_p50",
    "wait_p99",
    "wait_max",
    "lateness_p50",
    "lateness_p99",
    "lateness_max",
)
#: A replay group's gauges, as its task reports them.
GAUGES: Final = ("peak_watched", "timer_passes", "purges", "purged_entries", "attempts")
#: The columns a replay's summary and an event log's analysis share, computed the same way.
SHARED_SUMMARY_COLUMNS: Final = ("purgatory", *COUNTS, *STATS, "peak_delayed")
#: A replay's summary, one row per (purgatory, configuration) (docs/pipeline-schemas.md).
REPLAY_SUMMARY_COLUMNS: Final = (
    "purgatory",
    "config_id",
    "tick",
    "wheel_size",
    "purge_interval",
    "timeout_scale",
    "rate_scale",
    "trigger",
    *COUNTS,
    "expired_share",
    "missed",
    "missed_share",
    *STATS,
    "peak_delayed",
    *GAUGES,
    "busy_seconds",
    "utilisation",
    "pass_lateness_p50",
    "pass_lateness_p99",
    "pass_lateness_max",
)


def outcome_summary(ops: DataFrame, by: Sequence[str], *, more: Sequence[str] = ()) -> DataFrame:
    """Counts by outcome, wait and expiry-lateness percentiles per group of `by`.

    `ops` has ``outcome``, ``watched_at``, ``deadline`` and ``ended_at``. The wait (end minus
    watch) is taken over completed and expired operations; the lateness (end minus deadline)
    over expired ones. Percentiles are ``percentile_disc`` (nearest rank: an observed value, the
    same whatever the partitioning), so two summaries of the same operations are equal.
    `more` adds a count for each of these other outcomes (``drained``: an event log's).
    """
    outcome = F.col("outcome")
    ended = outcome.isin("completed", "expired")
    wait = F.when(ended, F.col("ended_at") - F.col("watched_at"))
    late = F.when(outcome == "expired", F.col("ended_at") - F.col("deadline"))
    counts = [
        F.sum(F.when(outcome == name, 1).otherwise(0)).alias(name) for name in (*COUNTS[1:], *more)
    ]
    return (
        ops.withColumn("_wait", wait)
        .withColumn("_late", late)
        .groupBy(*by)
        .agg(
            F.count(F.lit(1)).alias("operations"),
            *counts,
            _pdisc(0.5, "_wait").alias("wait_p50"),
            _pdisc(0.99, "_wait").alias("wait_p99"),
            F.max("_wait").alias("wait_max"),
            _pdisc(0.5, "_late").alias("lateness_p50"),
            _pdisc(0.99, "_late").alias("lateness_p99"),
            F.max("_late").alias("lateness_max"),
        )
        .withColumn("expired_share", share("expired"))
    )


def share(count: str) -> Column:
    """``<count>_share``: `count` over the operations (0 when there are none)."""
    return (F.col(count) / F.greatest(F.col("operations"), F.lit(1))).alias(f"{count}_share")


def _pdisc(p: float, column: str) -> Column:
    return F.expr(f"percentile_disc({p}) WITHIN GROUP (ORDER BY {column})")
