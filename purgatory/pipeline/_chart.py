"""The sweep chart: expiry share, p99 wait and peak watched entries per configuration."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ("sweep_chart",)


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
