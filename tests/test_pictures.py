"""The documentation's pictures match the code: each is drawn by a command, and checked here.

- ``docs/assets/lifecycle.svg`` is drawn from the code by ``docs/draw.py``: the committed file
  must be what the code draws now, every outcome and the purge's rules in it.
- ``docs/metrics-demo.png`` is drawn from a real run of the broker demo (``docs/draw.py
  metrics``): its script must run, and the committed picture must carry the fingerprint of
  the script, the demo and the purge's rule as they are now (a change to them asks for the
  picture to be drawn again).
- The sweep chart (``purgatory.pipeline``'s ``sweep``) labels its bars so that bars of
  different values never read alike, and equal values always do.
"""

from __future__ import annotations

import struct
import sys
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path
from typing import Any

import pytest
from helpers import run_process
from hypothesis import given
from hypothesis import strategies as st

from purgatory import PurgatoryStatistics
from purgatory._histograms import PARKED_OUTCOMES
from purgatory._purge_rule import LINGER
from purgatory.pipeline import _chart

# The drawing scripts, docs/draw.py and docs/metrics_picture.py, are scripts, not a package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "docs"))
import draw

ROOT = Path(__file__).resolve().parent.parent

SVG = "{http://www.w3.org/2000/svg}"


def texts(svg: str) -> list[str]:
    """Each line of text of an SVG picture, as a reader sees it (spans joined)."""
    return ["".join(element.itertext()) for element in ET.fromstring(svg).iter(f"{SVG}text")]


def png_text(path: Path) -> dict[str, str]:
    """The text chunks (``tEXt``, uncompressed ``iTXt``) of the PNG file at `path`."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    found: dict[str, str] = {}
    at = 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"{path}: a damaged {kind!r} chunk"
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            if rest[0] == 0:  # not compressed: flags, method, language\0, keyword\0, text
                value = rest[2:].split(b"\0", 2)[2]
                found[key.decode("utf-8")] = value.decode("utf-8")
        at += 12 + length
    return found


# -- the life of an operation -------------------------------------------------------------------


def test_the_committed_lifecycle_picture_is_the_one_the_code_draws() -> None:
    committed = draw.LIFECYCLE.read_text(encoding="utf-8")
    assert committed == draw.lifecycle_svg(), "stale: python docs/draw.py lifecycle draws it"


def test_the_lifecycle_picture_shows_every_outcome_its_counter_and_both_purge_rules() -> None:
    lines = texts(draw.lifecycle_svg())
    counters = set(PurgatoryStatistics.__dataclass_fields__)
    for outcome in PARKED_OUTCOMES:
        assert outcome in lines, f"no box for {outcome!r}"
        assert f".{outcome}" in lines
        assert outcome in counters
    assert "drained" in lines
    joined = "\n".join(lines)
    assert "'refused'" in joined
    assert "purge_interval (1,000 by default)" in joined
    assert f"at most {LINGER:g} s after the first one finished (a quiet server)" in joined
    assert "statistics().purged" in joined


def test_the_drawing_stops_at_an_outcome_it_does_not_describe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(draw, "PARKED_OUTCOMES", (*PARKED_OUTCOMES, "abandoned"))
    with pytest.raises(SystemExit, match="abandoned"):
        draw.lifecycle_svg()


def test_the_drawing_stops_at_a_line_too_long_for_its_box() -> None:
    with pytest.raises(ValueError, match="reword it"):
        draw.Drawing("t").text(0, 0, "x" * 40, 100, size=14)


def test_the_lifecycle_check_says_stale_and_the_drawing_mends_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    picture = tmp_path / "docs" / "lifecycle.svg"
    picture.parent.mkdir()
    picture.write_text(draw.LIFECYCLE.read_text(encoding="utf-8").replace("drained", "gone"))
    monkeypatch.setattr(draw, "ROOT", tmp_path)
    monkeypatch.setattr(draw, "LIFECYCLE", picture)
    assert draw.main(["lifecycle", "--check"]) == 1
    assert "docs/lifecycle.svg is stale" in capsys.readouterr().out
    assert draw.main(["lifecycle"]) == 0
    assert draw.main(["lifecycle", "--check"]) == 0
    assert picture.read_text(encoding="utf-8") == draw.lifecycle_svg()


def test_the_lifecycle_check_command_passes_on_the_committed_picture() -> None:
    done = run_process(
        sys.executable, ROOT / "docs" / "draw.py", "lifecycle", "--check", timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- the metrics page's picture -------------------------------------------------------------------


def test_the_committed_metrics_picture_was_drawn_from_the_current_inputs() -> None:
    import metrics_picture

    found = png_text(ROOT / "docs" / "metrics-demo.png").get(metrics_picture.FINGERPRINT)
    assert found == metrics_picture.fingerprint(), (
        "docs/metrics-demo.png was drawn from another script, demo or purge rule:"
        " python docs/draw.py metrics draws it again (then check the metrics page's prose)"
    )


@pytest.mark.realclock
def test_the_metrics_picture_is_drawn_from_a_short_real_run(tmp_path: Path) -> None:
    """The command the metrics page names, on a 6-second run of the demo (the demo's own test
    runs it so: its killed group member expires within the load): it scrapes the demo's
    /metrics, draws the PNG (matplotlib's Agg backend: no display) with the fingerprint of
    what it was drawn from, and prints the figures the page quotes."""
    import metrics_picture

    out = tmp_path / "metrics.png"
    done = run_process(
        *(sys.executable, ROOT / "docs" / "draw.py", "metrics"),
        *("--seconds", "6", "--out", out),
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert png_text(out)[metrics_picture.FINGERPRINT] == metrics_picture.fingerprint()
    assert f"wrote {out}" in done.stdout
    assert "produce: watched above delayed with nothing parked for under" in done.stdout


# -- the sweep chart's labels --------------------------------------------------------------------


@given(st.lists(st.floats(min_value=1e-6, max_value=1e7), min_size=1, max_size=8))
def test_bars_of_equal_values_read_alike_and_of_different_values_differently(
    values: list[float],
) -> None:
    labels = _chart.distinct_numbers(values)
    for a, label_a in zip(values, labels, strict=True):
        for b, label_b in zip(values, labels, strict=True):
            if a == b:
                assert label_a == label_b
            elif _chart.number(a, _chart.MOST_DIGITS) != _chart.number(b, _chart.MOST_DIGITS):
                assert float(label_a.replace(",", "")) != float(label_b.replace(",", ""))


def test_the_committed_sweep_figures_are_labelled_apart() -> None:
    """The default sweep's expired shares (of 80,000 operations per bar: pipeline-sweep.png),
    which three significant digits read as 16.0, 16.0 and 16; 7.77, 7.78, 7.77."""
    shares = [100 * n / 80_000 for n in (12_790, 12_793, 12_800, 6_216, 6_221, 6_218)]
    assert [_chart.number(v) for v in shares] == ["16.0", "16.0", "16", "7.77", "7.78", "7.77"]
    assert _chart.distinct_numbers(shares) == ["15.988", "15.991", "16", "7.77", "7.78", "7.772"]


def test_the_sweep_chart_draws_the_distinct_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.pyplot as plt

    close = plt.close
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)  # to read the figure drawn
    row = {
        "tick": 0.001,
        "wheel_size": 1024,
        "purge_interval": 1000,
        "timeout_scale": 1.0,
        "trigger": "key",
        "operations": 80_000,
        "wait_p99": 0.2,
        "peak_watched": 470,
    }
    rows = [
        {**row, "config_id": i, "rate_scale": float(2**i), "expired": expired}
        for i, expired in enumerate((6_216, 6_221, 6_218))
    ]
    _chart.sweep_chart(rows, str(tmp_path / "sweep.png"), "a sweep")
    (figure,) = figures
    expired_panel = figure.axes[0]
    assert [text.get_text() for text in expired_panel.texts] == ["7.77", "7.78", "7.772"]
    assert [text.get_text() for text in figure.axes[1].texts] == ["200"] * 3  # equal: alike
    close(figure)
