"""Make docs/metrics-demo.png: the broker demo's /metrics, scraped as it runs.

Runs ``python -m examples.minibroker demo`` (from the repository root, with
the ``examples`` and ``docs`` extras), reads the ``/metrics`` address it
prints, scrapes it every ``--interval`` seconds until the demo ends, parses
each scrape with prometheus_client's own parser, and plots three panels over
the run's time line: the requests parked per purgatory
(``purgatory_delayed``); ``purgatory_watched`` beside ``purgatory_delayed``
for the produce and fetch purgatories; and the produce purgatory's
completions and expiries per second (the rates of
``purgatory_completed_total`` and ``purgatory_expired_total``). The demo's
faults are marked at their scheduled times (``FAULTS``), on the time line of
its progress lines (``t=``). It prints what the metrics page says of the
picture: how long ``watched`` stayed above ``delayed`` with nothing parked.

The PNG carries the fingerprint of what shaped it (`fingerprint`: this
script, the demo, the purge's rule), which ``tests/test_pictures.py``
compares with the code's: a change to any of them asks for the picture to be
drawn again::

    python docs/draw.py metrics           # writes docs/metrics-demo.png
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import itertools
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import matplotlib
from prometheus_client.parser import text_string_to_metric_families

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Run as a script, from anywhere: the examples are at the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from examples.minibroker import demo as demo_module
from examples.minibroker.demo import FAULTS
from purgatory import DelayedOperationPurgatory
from purgatory._purge_rule import LINGER

ROOT = Path(__file__).resolve().parent.parent
#: The PNG text chunk holding `fingerprint`.
FINGERPRINT = "purgatory-inputs"
PURGATORIES = ("produce", "fetch", "follower-fetch", "rebalance", "heartbeat")
PROGRESS = re.compile(r"^\s+t=\s*(?P<t>[\d.]+)s ")

Series = dict[tuple[str, str], list[tuple[float, float]]]
"""(sample name, purgatory) -> [(seconds since the load started, value)]"""


class Demo:
    """The demo as a child process; its stdout read on a thread of its own."""

    def __init__(self, seed: int, seconds: float) -> None:
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "examples.minibroker", "demo"),
                *("--seed", str(seed), "--seconds", str(seconds)),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url: str | None = None
        self.load_started: list[float] = []  # one estimate per progress line
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            now = time.monotonic()
            self.output.append(line)
            if "metrics (Prometheus): " in line:
                self.url = line.split("metrics (Prometheus): ")[1].strip()
            progress = PROGRESS.match(line)
            if progress is not None:  # printed at t: when the load began
                self.load_started.append(now - float(progress["t"]))

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self) -> int:
        code = self.process.wait()
        self._reader.join()
        return code


def scrape(url: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
    return {
        (sample.name, sample.labels["purgatory"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def record(
    demo: Demo, interval: float
) -> list[tuple[float, dict[tuple[str, str], float]]]:
    """(monotonic time, samples) of each scrape, until the demo ends."""
    while demo.url is None and demo.running():
        time.sleep(0.05)
    if demo.url is None:
        raise SystemExit("the demo printed no /metrics address")
    scrapes = []
    while demo.running():
        started = time.monotonic()
        try:
            scrapes.append((started, scrape(demo.url)))
        except (urllib.error.URLError, ConnectionError):
            break  # the demo is stopping its brokers
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
    return scrapes


def series(
    scrapes: list[tuple[float, dict[tuple[str, str], float]]], zero: float
) -> Series:
    found: Series = defaultdict(list)
    for when, samples in scrapes:
        for key, value in samples.items():
            found[key].append((when - zero, value))
    return found


def rate(points: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Per-second increase between consecutive scrapes of a counter."""
    times, rates = [], []
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        times.append(t1)
        rates.append((v1 - v0) / (t1 - t0))
    return times, rates


def fingerprint() -> str:
    """What shapes the picture, in one line: the SHA-256 of this script and
    of the demo, and the purge's rule (the default ``purge_interval``, the
    quiet-server bound)."""
    interval = (
        inspect.signature(DelayedOperationPurgatory)
        .parameters["purge_interval"]
        .default
    )
    digest = hashlib.sha256()
    for path in (Path(__file__), Path(inspect.getfile(demo_module))):
        # As text with "\n" line ends: a checkout with "\r\n" has the same.
        digest.update(path.read_bytes().replace(b"\r\n", b"\n"))
    return (
        f"sha256 {digest.hexdigest()[:16]}; purge_interval {interval}; "
        f"purge bound {LINGER:g} s"
    )


def plateaus(found: Series, name: str) -> tuple[float, float]:
    """For purgatory `name`: how long at most its `watched` stayed above
    `delayed` with nothing parked (the longest such stretch of scrapes, from
    the scrape before it to the scrape after it, which did not see it), and
    the most entries it held so."""
    delayed = dict(found[("purgatory_delayed", name)])
    points = found[("purgatory_watched", name)]
    left = [delayed.get(t) == 0 and entries > 0 for t, entries in points]
    longest, most = 0.0, 0.0
    for i, (_, entries) in enumerate(points):
        if not left[i]:
            continue
        most = max(most, entries)
        first = i
        while first > 0 and left[first - 1]:
            first -= 1
        last = i
        while last + 1 < len(points) and left[last + 1]:
            last += 1
        before = points[max(0, first - 1)][0]
        after = points[min(len(points) - 1, last + 1)][0]
        longest = max(longest, after - before)
    return longest, most


SHORT = {
    "pause follower 2 (SIGSTOP)": "follower 2 paused",
    "kill group member B (SIGKILL)": "member B killed",
    "pause follower 1 (SIGSTOP)": "follower 1 paused",
    "resume followers 1 and 2 (SIGCONT)": "both resumed",
}


def plot(
    found: Series, faults: list[tuple[float, str]], out: Path, title: str
) -> None:
    fig, (parked, watched, rates) = plt.subplots(
        3, 1, sharex=True, figsize=(11, 8.5)
    )
    for name in PURGATORIES:
        points = found[("purgatory_delayed", name)]
        parked.step(*zip(*points, strict=True), where="post", label=name)
    parked.set_ylabel("requests parked now\n(purgatory_delayed)")
    for name, color in (("produce", "tab:blue"), ("fetch", "tab:orange")):
        for sample, style in (
            ("purgatory_watched", "-"),
            ("purgatory_delayed", ":"),
        ):
            points = found[(sample, name)]
            watched.step(
                *zip(*points, strict=True),
                style,
                color=color,
                where="post",
                label=f"{sample.removeprefix('purgatory_')}, {name}",
            )
    watched.set_ylabel("watcher-list entries\n/ operations timed")
    for sample, color in (
        ("purgatory_completed_total", "tab:green"),
        ("purgatory_expired_total", "tab:red"),
    ):
        times, per_second = rate(found[(sample, "produce")])
        label = sample.removeprefix("purgatory_").removesuffix("_total")
        rates.plot(times, per_second, color=color, label=f"{label} per second")
    rates.set_ylabel("produce purgatory:\nrates of the counters")
    rates.set_xlabel("seconds since the load started")
    for axis in (parked, watched, rates):
        axis.grid(alpha=0.3)
        axis.legend(
            loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small"
        )
        for t, _ in faults:
            axis.axvline(t, color="grey", linewidth=0.8, linestyle="--")
    for index, (t, note) in enumerate(faults):
        parked.annotate(
            SHORT.get(note, note),
            (t, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 3 + 10 * (index % 2)),  # staggered: faults may be close
            textcoords="offset points",
            fontsize="x-small",
            ha="center",
            va="bottom",
        )
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    # No date nor version in the file: its one text chunk says what shaped it.
    metadata = {"Software": None, FINGERPRINT: fingerprint()}
    fig.savefig(out, dpi=80, metadata=metadata)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument(
        "--interval", type=float, default=0.25, help="seconds between scrapes"
    )
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "metrics-demo.png"
    )
    args = parser.parse_args(argv)
    demo = Demo(args.seed, args.seconds)
    scrapes = record(demo, args.interval)
    if demo.wait() != 0:
        sys.stdout.writelines(demo.output)
        raise SystemExit("the demo failed")
    if not demo.load_started:
        raise SystemExit("the demo printed no progress line")
    zero = sorted(demo.load_started)[len(demo.load_started) // 2]
    found = series(scrapes, zero)
    title = (
        f"broker demo (seed {args.seed}, {args.seconds:g} s of load): "
        f"/metrics scraped {len(scrapes)} times, every {args.interval:g} s"
    )
    faults = [(fraction * args.seconds, what) for fraction, what in FAULTS]
    plot(found, faults, args.out, title)
    print(f"{len(scrapes)} scrapes; wrote {args.out}")
    for name in ("produce", "fetch"):
        longest, most = plateaus(found, name)
        print(
            f"{name}: watched above delayed with nothing parked for under"
            f" {longest:.2f} s at a time (scrape to scrape), up to"
            f" {most:g} entries"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
