"""The sweep chart: expiry share, p99 wait and peak watched entries per configuration."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = (
    "config_labels",
    "distinct_numbers",
    "load_chart",
    "number",
    "saturation_rate",
    "sweep_chart",
)


def sweep_chart(rows: Sequence[Mapping[str, Any]], path: str, title: str) -> None:
    """Write a PNG of one bar per configuration (summed over purgatories) in three panels.

    `rows` are replay summary rows (one per purgatory and configuration). Each bar is labelled
    with the settings that differ between configurations; those the same for all go once under
    the title. Every number on the chart is written by `number`; the bars of a panel are
    labelled by `distinct_numbers`, so that bars of different values never read alike.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_config: dict[int, dict[str, Any]] = {}
    for row in rows:
        agg = by_config.setdefault(
            row["config_id"],
            {"row": row, "operations": 0, "expired": 0, "wait_p99": 0.0, "peak_watched": 0},
        )
        agg["operations"] += row["operations"]
        agg["expired"] += row["expired"]
        agg["wait_p99"] = max(agg["wait_p99"], row["wait_p99"] or 0.0)
        agg["peak_watched"] = max(agg["peak_watched"], row["peak_watched"])
    ids = sorted(by_config)
    labels, common = config_labels([by_config[i]["row"] for i in ids])
    expired = [100 * by_config[i]["expired"] / max(1, by_config[i]["operations"]) for i in ids]
    p99 = [1000 * by_config[i]["wait_p99"] for i in ids]
    watched = [by_config[i]["peak_watched"] for i in ids]
    fig, axes = plt.subplots(3, 1, figsize=(max(7.0, 0.9 * len(ids) + 2), 9), sharex=True)
    panels = (
        (expired, "expired (%)", "tab:red"),
        (p99, "wait p99 (ms, worst purgatory)", "tab:blue"),
        (watched, "peak watched() (worst purgatory)", "tab:green"),
    )
    for ax, (values, name, color) in zip(axes, panels, strict=True):
        bars = ax.bar(range(len(ids)), values, color=color)
        ax.set_ylabel(name)
        ax.bar_label(bars, labels=distinct_numbers(values), fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xticks(range(len(ids)), labels, rotation=30, ha="right", fontsize=8)
    fig.suptitle(f"{title}\n{common}" if common else title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: (summary column, label, factor to the shown unit, unit) of each configuration setting.
_SETTINGS: Final = (
    ("tick", "tick", 1000.0, " ms"),
    ("wheel_size", "wheel", 1, ""),
    ("purge_interval", "purge", 1, ""),
    ("timeout_scale", "timeout x", 1, ""),
    ("rate_scale", "rate x", 1, ""),
    ("trigger", "trigger", None, ""),
)


def number(value: float, significant: int = 3) -> str:
    """The chart's one number format: `significant` digits, thousands grouped, no exponent.

    Trailing zeros show only where they carry information (the value was rounded to them).

    >>> [number(v) for v in (0.001, 0.1 + 0.2, 1, 15.934, 15.996, 99.96, 1024, 123456.7)]
    ['0.001', '0.3', '1', '15.9', '16.0', '100', '1,024', '123,457']
    >>> [number(v, 5) for v in (15.9875, 16, 100.94023, 7.770001, 9.999996)]
    ['15.988', '16', '100.94', '7.7700', '10.000']
    """
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    digits = max(0, significant - 1 - magnitude)
    text = f"{value:.{digits}f}"
    if digits and math.floor(math.log10(abs(float(text)))) > magnitude:
        digits -= 1  # rounded up to the next power of ten (99.96): one digit fewer after it
        text = f"{value:.{digits}f}"
    if digits == 0:
        return f"{round(value):,}"
    if math.isclose(float(text), value, rel_tol=1e-9) and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


#: The most significant digits a label gets to tell two values apart; values that agree to
#: this many read alike.
MOST_DIGITS: Final = 9


def _reading(label: str) -> float:
    return float(label.replace(",", ""))


def distinct_numbers(values: Sequence[float]) -> list[str]:
    """A label per value, by `number`: equal values read alike, different values differently.

    Three significant digits, as `number` writes them, unless two different values would read
    as the same number (``7.77`` and ``7.7731`` both as ``7.77``; ``15.996`` as ``16.0``
    beside an exact ``16``): those get as many more digits as tell them apart (at most
    `MOST_DIGITS`), so that a reader comparing bars never takes a difference for none.

    >>> distinct_numbers([15.9875, 15.99125, 16.0, 7.77, 7.7731, 7.77])
    ['15.988', '15.991', '16', '7.77', '7.773', '7.77']
    >>> distinct_numbers([100.9394315, 100.9402263, 470, 604])
    ['100.939', '100.940', '470', '604']
    """
    digits = [3] * len(values)
    while True:
        labels = [number(v, d) for v, d in zip(values, digits, strict=True)]
        clashes = {
            i
            for i, (value, label) in enumerate(zip(values, labels, strict=True))
            for other, other_label in zip(values, labels, strict=True)
            if other != value
            and _reading(other_label) == _reading(label)
            and digits[i] < MOST_DIGITS
        }
        if not clashes:
            return labels
        for i in clashes:
            digits[i] += 1


def _setting(
    row: Mapping[str, Any], column: str, name: str, factor: float | None, unit: str
) -> str:
    value = row[column]
    shown = str(value) if factor is None else number(value * factor)
    return f"{name}{shown}{unit}" if name.endswith("x") else f"{name} {shown}{unit}"


def config_labels(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], str]:
    """A label per configuration row with only the settings that vary, and the common ones.

    >>> rows = [
    ...     {"tick": 0.001, "wheel_size": 1024, "purge_interval": 1000, "timeout_scale": t,
    ...      "rate_scale": 1.0, "trigger": "key"}
    ...     for t in (0.5, 1.0)
    ... ]
    >>> config_labels(rows)
    (['timeout x0.5', 'timeout x1'], 'tick 1 ms, wheel 1,024, purge 1,000, rate x1, trigger key')
    """
    varying = [s for s in _SETTINGS if len({row[s[0]] for row in rows}) > 1]
    constant = [s for s in _SETTINGS if s not in varying]
    labels = [", ".join(_setting(row, *s) for s in varying) for row in rows]
    if not varying:
        labels = [f"configuration {row.get('config_id', i)}" for i, row in enumerate(rows)]
    common = ", ".join(_setting(rows[0], *s) for s in constant) if rows else ""
    return labels, common


def saturation_rate(points: Sequence[tuple[float, float]]) -> float | None:
    """The offered rate at which the core is fully busy, from (rate, utilisation) points.

    Below saturation, utilisation grows in proportion to the rate, so each point with
    utilisation under 0.9 estimates it as ``rate / utilisation`` (the median is taken). With no
    such point, the lowest rate at which the core is at least 95 % busy; ``None`` if none is.
    """
    below = sorted(rate / u for rate, u in points if 0 < u < 0.9)
    if below:
        return below[len(below) // 2]
    busy = [rate for rate, u in points if u >= 0.95]
    return min(busy) if busy else None


def saturation_mark(
    ax: Any, rate: float | None, rates: Sequence[float], color: str, label: str
) -> str | None:
    """Draw the saturation `rate` on `ax` if it lies inside the measured `rates`; else return
    the note to print instead (a line far past the last point would claim what was not
    measured: the estimate is a linear extrapolation of the utilisation)."""
    if rate is None:
        return None
    if min(rates) <= rate <= max(rates):
        ax.axvline(rate, color=color, linestyle=":", linewidth=1.5)
        return None
    side = "below the lowest" if rate < min(rates) else "beyond the highest"
    return f"{label}: saturation ~{number(rate)}/s, {side} rate measured (no line drawn)"


def load_chart(rows: Sequence[Mapping[str, Any]], path: str, base_rate: float, title: str) -> None:
    """Write a PNG of expired and missed shares and lateness against the offered rate,
    saturation marked.

    Missed: not answered within the timeout of the arrival (expired, or completed late after
    queueing); past saturation it rises with the queue, where the expired share may fall (an
    operation watched late often finds its condition already met).

    One colour per configuration other than the rate (the timeout scale, typically; worst
    purgatory of each), the same in both panels; the line style says what is drawn (expired
    solid, missed dashed; timer pass solid, expiry dashed). The x axis is `base_rate` times
    ``rate_scale``, in arrivals per second per purgatory. A configuration's saturation rate
    (from rate / utilisation, `saturation_rate`) is a dotted line of its colour when it lies
    within the measured rates, and a note under the chart otherwise.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    series: dict[tuple[Any, ...], dict[float, dict[str, float]]] = {}
    for row in rows:
        key = (row["tick"], row["wheel_size"], row["purge_interval"], row["timeout_scale"])
        point = series.setdefault(key, {}).setdefault(
            base_rate * row["rate_scale"],
            dict.fromkeys(("expired", "missed", "operations", "late", "pass", "util"), 0.0),
        )
        point["expired"] += row["expired"]
        point["missed"] += row["missed"]
        point["operations"] += row["operations"]
        point["late"] = max(point["late"], row["lateness_p99"] or 0.0)
        point["pass"] = max(point["pass"], row["pass_lateness_p99"] or 0.0)
        point["util"] = max(point["util"], row["utilisation"])
    labels, _ = config_labels(
        [
            dict(zip(("tick", "wheel_size", "purge_interval", "timeout_scale"), k, strict=True))
            | {"rate_scale": 1.0, "trigger": ""}
            for k in sorted(series)
        ]
    )
    fig, axes = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    notes, colours = [], []
    for i, points in enumerate(series[key] for key in sorted(series)):
        color, label = f"C{i}", labels[i] if len(series) > 1 else "all"
        rates = sorted(points)
        share = [100 / max(1.0, points[r]["operations"]) for r in rates]
        for name, style in (("expired", "-"), ("missed", "--")):
            values = [points[r][name] * k for r, k in zip(rates, share, strict=True)]
            axes[0].plot(rates, values, color=color, linestyle=style, marker="o", markersize=4)
        for name, style in (("pass", "-"), ("late", "--")):
            values = [1000 * points[r][name] for r in rates]
            axes[1].plot(rates, values, color=color, linestyle=style, marker="o", markersize=4)
        rate = saturation_rate([(r, points[r]["util"]) for r in rates])
        for ax in axes:
            note = saturation_mark(ax, rate, rates, color, label)
        if note:  # (the same for both panels)
            notes.append(note)
        colours.append(Line2D([], [], color=color, label=label))
    styles = (
        (axes[0], "expired", "missed: expired or answered after the timeout"),
        (axes[1], "timer pass p99", "expiry p99"),
    )
    for ax, solid, dashed in styles:
        ax.grid(alpha=0.3)
        handles = [
            Line2D([], [], color="black", linestyle="-", label=solid),
            Line2D([], [], color="black", linestyle="--", label=dashed),
            Line2D([], [], color="black", linestyle=":", label="saturation (rate / utilisation)"),
        ]
        ax.legend(handles=handles + (colours if len(series) > 1 else []), fontsize=8)
    axes[0].set_ylabel("share of operations (%)")
    axes[1].set_ylabel("lateness p99 (ms)")
    axes[1].set_xlabel("offered rate (arrivals/s per purgatory)")
    fig.suptitle(title)
    if notes:
        fig.text(0.01, 0.005, "\n".join(notes), fontsize=8, va="bottom")
    fig.tight_layout(rect=(0, 0.03 * len(notes), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
