"""Plot W2 (cost, memory and lateness against N) from the results JSON, if matplotlib is there."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ("plot_w2",)

PANELS = (
    (("median", "schedule_us"), "schedule (CPU us / op)"),
    (("median", "complete_us"), "complete (CPU us / op)"),
    (("median", "expire_us"), "expire (CPU us / op)"),
    (("memory", "bytes_per_op"), "memory (bytes / pending op)"),
    (("median", "lateness_ms", "p99"), "expiry lateness p99 (ms)"),
    (("median", "lateness_ms", "max"), "expiry lateness max (ms)"),
)
STYLES = {"ours": "o-", "A": "s--", "A-lean": "D--", "B": "^--", "C": "v:", "Floor": "k.-"}


def _value(entry: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = entry
    for part in path:
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value if isinstance(value, int | float) else None


def plot_w2(w2: dict[str, Any], path: Path) -> str | None:
    """Write the W2 figure to `path`; return why not if it could not be drawn."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install matplotlib, or the 'bench' extra)"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names: list[str] = []
    for block in w2["sizes"]:
        names += [n for n in block["contenders"] if n not in names]
    figure, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    for axis, (path_in_entry, title) in zip(axes.flat, PANELS, strict=True):
        for name in names:
            xs: list[int] = []
            ys: list[float] = []
            for block in w2["sizes"]:
                entry = block["contenders"].get(name)
                value = None if entry is None else _value(entry, path_in_entry)
                if value is not None and value > 0:
                    xs.append(block["n"])
                    ys.append(value)
            if xs:
                axis.plot(xs, ys, STYLES.get(name, "x-"), label=name)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(title)
        axis.set_xlabel("N pending")
        axis.grid(True, which="both", alpha=0.3)
        if axis.lines:
            axis.legend(fontsize="small")
    figure.suptitle("W2: N operations pending at once (medians; log-log)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None
