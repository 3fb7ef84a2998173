"""The text tables the commands print: the replay summary, the analysis, the load model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ._load import CostProfile

__all__ = (
    "ANALYSIS_COLUMNS",
    "KEY_COLUMNS",
    "WINDOW_COLUMNS",
    "print_replay_summary",
    "print_table",
)

Columns = Sequence[tuple[str, str, Callable[[Any], str]]]


def ms(value: Any) -> str:
    """Seconds as milliseconds with two decimals; ``-`` for none."""
    return "-" if value is None else f"{value * 1000:.2f}"


def _scaled(factor: float, spec: str) -> Callable[[Any], str]:
    return lambda value: format(value * factor, spec)


#: The replay summary's columns; the load model's only with a cost profile.
REPLAY_COLUMNS: Final[Columns] = (
    ("purgatory", "purgatory", str),
    ("cfg", "config_id", str),
    ("tick ms", "tick", _scaled(1000, "g")),
    ("wheel", "wheel_size", str),
    ("timeout x", "timeout_scale", _scaled(1, "g")),
    ("rate x", "rate_scale", _scaled(1, "g")),
    ("ops", "operations", str),
    ("expired %", "expired_share", _scaled(100, ".2f")),
    ("missed %", "missed_share", _scaled(100, ".2f")),
    ("wait p50 ms", "wait_p50", ms),
    ("wait p99 ms", "wait_p99", ms),
    ("late p99 ms", "lateness_p99", ms),
    ("peak watched", "peak_watched", str),
    ("peak delayed", "peak_delayed", str),
    ("purges", "purges", str),
)
LOAD_COLUMNS: Final[Columns] = (
    ("util %", "utilisation", _scaled(100, ".1f")),
    ("pass late p99 ms", "pass_lateness_p99", ms),
    ("pass late max ms", "pass_lateness_max", ms),
)
ANALYSIS_COLUMNS: Final[Columns] = (
    ("purgatory", "purgatory", str),
    ("ops", "operations", str),
    ("completed", "completed", str),
    ("expired", "expired", str),
    ("cancelled", "cancelled", str),
    ("open", "open", str),
    ("wait p50 ms", "wait_p50", ms),
    ("wait p99 ms", "wait_p99", ms),
    ("wait max ms", "wait_max", ms),
    ("late p99 ms", "lateness_p99", ms),
    ("peak delayed", "peak_delayed", str),
)
WINDOW_COLUMNS: Final[Columns] = (
    ("purgatory", "purgatory", str),
    ("window (UTC)", "window_utc", lambda t: "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S")),
    ("watched", "watched", str),
    ("completed", "completed", str),
    ("expired", "expired", str),
    ("cancelled", "cancelled", str),
    ("drained", "drained", str),
)


def _utc_time(t: Any) -> str:
    return "-" if t is None else t.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


STUCK_COLUMNS: Final[Columns] = (
    ("purgatory", "purgatory", str),
    ("recorder", "recorder", str),
    ("id", "id", str),
    ("keys", "keys", lambda keys: ",".join(keys or ())),
    ("status", "status", str),
    ("deadline (UTC)", "deadline_utc", _utc_time),
    ("overdue s", "overdue_seconds", lambda s: f"{s:.3f}"),
    ("outcome", "outcome", lambda o: o or "-"),
)
KEY_COLUMNS: Final[Columns] = (
    ("purgatory", "purgatory", str),
    ("key", "key", str),
    ("peak waiters", "peak_waiters", str),
    ("ops", "operations", str),
    ("expired", "expired", str),
    ("wait max ms", "wait_max", ms),
)


def print_replay_summary(rows: Sequence[Mapping[str, Any]], costs: CostProfile | None) -> None:
    """The replay summary, one line per (purgatory, configuration), then the load model used.

    Without a profile the load model's columns (all zero) are left out, and a line says so.
    """
    print_table(rows, [*REPLAY_COLUMNS, *(LOAD_COLUMNS if costs is not None else ())])
    if costs is None:
        print(
            "load model: none: every event costs 0 s of CPU, so the rate moves the waits and "
            "shares only by the tick's rounding (--cost-profile PROFILE.json, made by "
            "'calibrate', serves each group as one core)"
        )
    else:
        print(f"load model: each group served by one core; {costs.describe()}")


def print_table(rows: Sequence[Mapping[str, Any]], columns: Columns) -> None:
    """Print `rows` as an aligned text table of `columns` (header, field, formatter)."""
    cells = [[fmt(row[field]) for _, field, fmt in columns] for row in rows]
    widths = [
        max([len(header)] + [len(line[i]) for line in cells])
        for i, (header, _, _) in enumerate(columns)
    ]
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True)))
    for line in cells:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
