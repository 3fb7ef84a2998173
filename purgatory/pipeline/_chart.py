"""The sweep chart: expiry share, p99 wait and peak watched entries per configuration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ("load_chart", "saturation_rate", "sweep_chart")


def sweep_chart(rows: Sequence[Mapping[str, Any]], path: str, title: str) -> None:
    """Write a PNG of one bar per configuration (summed over purgatories) in three panels.

    `rows` are replay summary rows (one per purgatory and configuration).
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
    labels = [_label(by_config[i]["row"]) for i in ids]
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
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[-1].set_xticks(range(len(ids)), labels, rotation=30, ha="right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _label(row: Mapping[str, Any]) -> str:
    return (
        f"timeout x{row['timeout_scale']:g}, rate x{row['rate_scale']:g}\n"
        f"tick {row['tick'] * 1000:g} ms, wheel {row['wheel_size']}"
    )


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


def load_chart(rows: Sequence[Mapping[str, Any]], path: str, base_rate: float, title: str) -> None:
    """Write a PNG of expired share and lateness against the offered rate, saturation marked.

    One line per configuration other than the rate (worst purgatory of each); the x axis is
    `base_rate` times ``rate_scale``, in arrivals per second per purgatory.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[Any, ...], dict[float, dict[str, float]]] = {}
    for row in rows:
        key = (row["tick"], row["wheel_size"], row["purge_interval"], row["timeout_scale"])
        point = series.setdefault(key, {}).setdefault(
            base_rate * row["rate_scale"],
            {"expired": 0.0, "operations": 0.0, "late": 0.0, "pass": 0.0, "util": 0.0},
        )
        point["expired"] += row["expired"]
        point["operations"] += row["operations"]
        point["late"] = max(point["late"], row["lateness_p99"] or 0.0)
        point["pass"] = max(point["pass"], row["pass_lateness_p99"] or 0.0)
        point["util"] = max(point["util"], row["utilisation"])
    fig, axes = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    saturation = []
    for key, points in sorted(series.items()):
        rates = sorted(points)
        label = f"timeout x{key[3]:g}" if len(series) > 1 else None
        axes[0].plot(
            rates,
            [100 * points[r]["expired"] / max(1.0, points[r]["operations"]) for r in rates],
            marker="o",
            label=label,
        )
        axes[1].plot(
            rates, [1000 * points[r]["pass"] for r in rates], marker="o", label="timer pass p99"
        )
        axes[1].plot(
            rates,
            [1000 * points[r]["late"] for r in rates],
            marker="s",
            linestyle="--",
            label="expiry p99",
        )
        rate = saturation_rate([(r, points[r]["util"]) for r in rates])
        if rate is not None:
            saturation.append(rate)
    if saturation:
        rate = min(saturation)
        for ax in axes:
            ax.axvline(rate, color="tab:red", linestyle=":")
        axes[0].annotate(
            f"saturation ~{rate:,.0f}/s",
            (rate, 0),
            xycoords=("data", "axes fraction"),
            xytext=(4, 6),
            textcoords="offset points",
            color="tab:red",
        )
    axes[0].set_ylabel("expired (%)")
    axes[1].set_ylabel("lateness p99 (ms)")
    axes[1].set_xlabel("offered rate (arrivals/s per purgatory)")
    for ax in axes:
        ax.grid(alpha=0.3)
    if len(series) > 1:
        axes[0].legend(fontsize=8)
    handles, labels = axes[1].get_legend_handles_labels()
    axes[1].legend(handles[:2], labels[:2], fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
