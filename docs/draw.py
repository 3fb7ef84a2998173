"""Draw the documentation's pictures from the code, so they cannot drift.

Each picture is drawn from what the code exposes, not from a hand-kept copy:

- ``docs/assets/lifecycle.svg`` (``lifecycle``): the life of an operation.
  Its outcomes are the event log's (``purgatory._events.Outcome``) and the
  time-parked histogram's (``purgatory._histograms.PARKED_OUTCOMES``), each
  with its counter in `purgatory.PurgatoryStatistics`; the purge shows the
  default ``purge_interval`` and the quiet-server bound
  (``purgatory._purge_rule.LINGER``). An outcome the code gains without a
  description here stops the drawing with an error. The SVG is text, the same
  for the same code: ``tests/test_pictures.py`` draws it again and compares it
  with the committed file, and the site's build (``docs/hooks.py``) publishes
  the one it draws.
- ``docs/metrics-demo.png`` (``metrics``): the broker demo's ``/metrics`` over
  a real run, drawn by ``docs/metrics_picture.py`` (the ``examples`` and
  ``docs`` extras), which says more.

::

    python docs/draw.py lifecycle          # writes docs/assets/lifecycle.svg
    python docs/draw.py lifecycle --check  # status 1 if the file is stale
    python docs/draw.py metrics            # runs the demo: metrics-demo.png
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import sys
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Final, get_args

# Run as a script, from anywhere: the package is at the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from purgatory import DelayedOperationPurgatory, PurgatoryStatistics
from purgatory._events import Outcome
from purgatory._histograms import PARKED_OUTCOMES
from purgatory._purge_rule import LINGER

ROOT: Final = Path(__file__).resolve().parent.parent
LIFECYCLE: Final = ROOT / "docs" / "assets" / "lifecycle.svg"


@dataclass(frozen=True)
class Ending:
    """How a parked operation reaches an outcome (`how`), what runs (`then`).

    Text between backticks is set in a monospace font, as code on the pages.
    """

    how: str
    then: str


#: Every outcome of a parked operation, in the order drawn. The drawing
#: checks that they are the code's (`PARKED_OUTCOMES`): a new outcome cannot
#: be left out of the picture.
ENDINGS: Final = {
    "completed": Ending(
        "`check_and_complete(key)` re-tries it and it holds,"
        " or `force_complete()`",
        "`on_complete()`; `await op` returns its value",
    ),
    "expired": Ending(
        "its deadline passed: a timer pass (never before it, within a tick)",
        "`on_complete()`, then `on_expiration()`; `is_expired` is set",
    ),
    "drained": Ending(
        "`drain()` (a shutdown: `drain_on_signals`) answers it early",
        "as an expiry: `on_complete()`, `on_expiration()`, `is_expired`",
    ),
    "cancelled": Ending(
        "`cancel_for_key(key)`, a cancelled `watch()`, `shutdown()`",
        "no callback; the awaiter gets `OperationCancelled`",
    ),
}

#: The outcome of a watch call that raised: the operation never parked.
REFUSED: Final = "refused"

# -- the SVG ------------------------------------------------------------------

WIDTH: Final = 1000
FONT: Final = "Helvetica, Arial, sans-serif"
MONO: Final = "DejaVu Sans Mono, Menlo, Consolas, monospace"
#: A character's estimated advance, in ems: generous for the fonts a reader
#: may get (DejaVu Sans, the widest common one). Every line is checked to fit.
EM_PER_CHAR: Final = 0.6
ARROW: Final = "#444"

#: (fill, stroke) of each outcome's box, and of the other kinds of box.
COLOURS: Final = {
    "completed": ("#e8f5e9", "#2e7d32"),
    "expired": ("#fff3e0", "#ef6c00"),
    "drained": ("#e3f2fd", "#1565c0"),
    "cancelled": ("#eceff1", "#546e7a"),
    "step": ("#e8eaf6", "#3f51b5"),
    "pending": ("#fff8e1", "#f9a825"),
    "purge": ("#f3e5f5", "#6a1b9a"),
}


def text_width(text: str, size: float) -> float:
    """Estimated width (px) of `text` at `size` px, backticks not counted."""
    return len(text.replace("`", "")) * size * EM_PER_CHAR


def spans(text: str) -> str:
    """`text` as SVG character data, the parts between backticks monospace."""
    parts = text.split("`")
    if len(parts) % 2 == 0:
        raise ValueError(f"unbalanced backticks in {text!r}")
    return "".join(
        f'<tspan font-family="{MONO}">{escape(part)}</tspan>'
        if i % 2
        else escape(part)
        for i, part in enumerate(parts)
        if part
    )


@dataclass
class Drawing:
    """An SVG picture built element by element, every line checked to fit."""

    title: str
    elements: list[str] = dataclasses.field(default_factory=list)

    def box(self, x: float, y: float, w: float, h: float, kind: str) -> None:
        fill, stroke = COLOURS[kind]
        self.elements.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" rx="8"'
            f' fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>'
        )

    def text(
        self,
        x: float,
        y: float,
        text: str,
        room: float,
        *,
        size: float = 14,
        anchor: str = "start",
        bold: bool = False,
        colour: str = "#111",
    ) -> None:
        """A line at (`x`, `y`) that must fit in `room` px (estimated)."""
        needs = text_width(text, size)
        if needs > room:
            raise ValueError(
                f"{text!r} needs about {needs:.0f} px, has {room:g}: reword it"
            )
        weight = ' font-weight="bold"' if bold else ""
        self.elements.append(
            f'<text x="{x:g}" y="{y:g}" font-size="{size:g}"'
            f' text-anchor="{anchor}" fill="{colour}"{weight}>'
            f"{spans(text)}</text>"
        )

    def line(self, path: str, *, arrow: bool = False) -> None:
        end = ' marker-end="url(#arrow)"' if arrow else ""
        self.elements.append(
            f'<path d="{path}" fill="none" stroke="{ARROW}"'
            f' stroke-width="1.5"{end}/>'
        )

    def svg(self, height: float) -> str:
        head = [
            '<svg xmlns="http://www.w3.org/2000/svg"'
            f' viewBox="0 0 {WIDTH} {height:g}" width="{WIDTH}"'
            f' height="{height:g}" font-family="{FONT}">',
            f"<title>{escape(self.title)}</title>",
            "<!-- Drawn by docs/draw.py from the code: edit that. -->",
            "<defs>",
            '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5"'
            ' markerWidth="7" markerHeight="7" orient="auto-start-reverse">',
            f'<path d="M0,0 L10,5 L0,10 z" fill="{ARROW}"/>',
            "</marker>",
            "</defs>",
            f'<rect width="{WIDTH}" height="{height:g}" fill="#ffffff"/>',
        ]
        return "\n".join([*head, *self.elements, "</svg>"]) + "\n"


def check_outcomes() -> None:
    """The outcomes drawn are the code's, each with its statistics counter."""
    parked = tuple(ENDINGS)
    if set(parked) != set(PARKED_OUTCOMES):
        raise SystemExit(
            f"a parked operation's outcomes are {PARKED_OUTCOMES} in the code,"
            f" {parked} in the picture: describe each in docs/draw.py"
        )
    if set(get_args(Outcome)) != {*parked, REFUSED}:
        raise SystemExit(
            f"the event log's outcomes are {get_args(Outcome)}, the"
            f" picture's {parked} and {REFUSED!r}"
        )
    fields = {field.name for field in dataclasses.fields(PurgatoryStatistics)}
    missing = [
        name for name in (*parked, "purged", "purges") if name not in fields
    ]
    if missing:
        raise SystemExit(f"PurgatoryStatistics has no field {missing}")


def default_purge_interval() -> int:
    """The default ``purge_interval``, read from the purgatory's signature."""
    signature = inspect.signature(DelayedOperationPurgatory)
    value = signature.parameters["purge_interval"].default
    if not isinstance(value, int):
        raise SystemExit(f"purge_interval's default is {value!r}, no int")
    return value


def watch_call(drawing: Drawing) -> None:
    """The watch call: four steps in a row, then the two notes under them."""
    steps = (
        ("watch(op, keys)", "`try_complete_else_watch`"),
        ("try_complete()", "attempt 1"),
        ("register op", "on every key's list"),
        ("try_complete()", "attempt 2: closes the race"),
    )
    for i, (title, detail) in enumerate(steps):
        x = 20 + i * (STEP_W + STEP_GAP)
        drawing.box(x, TOP, STEP_W, STEP_H, "step")
        centre = x + STEP_W / 2
        room = STEP_W - 12
        drawing.text(centre, TOP + 24, title, room, anchor="middle", bold=True)
        drawing.text(centre, TOP + 43, detail, room, size=12, anchor="middle")
        if i:
            middle = TOP + STEP_H / 2
            drawing.line(f"M{x - STEP_GAP},{middle:g} H{x - 2}", arrow=True)
    notes = (
        "attempt 1 or 2 may complete it at once: the call returns True,"
        " nothing is timed",
        "a watch call that raises (`PurgatoryFull`, a raising first attempt)"
        f" ends it as {REFUSED!r}: never parked",
    )
    for i, note in enumerate(notes):
        drawing.text(20, 104 + 20 * i, note, 820, size=13, colour="#555")


# The layout: the watch call's steps along the top, then pending on the left
# with a row per outcome beside it, then the purge along the bottom.
TOP, STEP_W, STEP_H, STEP_GAP = 20, 215, 56, 30
ROW_X, ROW_W, ROW_H, ROW_GAP, ROWS_TOP = 300, 660, 58, 12, 160
TITLE_W = 104
PENDING_W, PENDING_H = 236, 64


def outcomes(drawing: Drawing) -> float:
    """Pending, and a row per way out of it; returns where the rows end."""
    rows_bottom = ROWS_TOP + len(ENDINGS) * (ROW_H + ROW_GAP) - ROW_GAP
    centre = 20 + PENDING_W / 2
    y = (ROWS_TOP + rows_bottom) / 2 - PENDING_H / 2
    drawing.box(20, y, PENDING_W, PENDING_H, "pending")
    drawing.text(
        centre, y + 27, "pending", PENDING_W, anchor="middle", bold=True
    )
    drawing.text(
        centre,
        y + 47,
        "in the timer, on its keys",
        PENDING_W - 12,
        anchor="middle",
    )
    last_step = 20 + 3 * (STEP_W + STEP_GAP) + STEP_W / 2
    drawing.line(
        f"M{last_step:g},{TOP + STEP_H} V146 H{centre:g} V{y - 2:g}", arrow=True
    )
    start = f"M{20 + PENDING_W},{y + PENDING_H / 2:g}"
    bus = ROW_X + ROW_W + 15
    for i, (outcome, ending) in enumerate(ENDINGS.items()):
        top = ROWS_TOP + i * (ROW_H + ROW_GAP)
        middle = top + ROW_H / 2
        drawing.box(ROW_X, top, ROW_W, ROW_H, outcome)
        drawing.line(f"{start} L{ROW_X - 2},{middle:g}", arrow=True)
        x, room = ROW_X + 14, TITLE_W - 14
        drawing.text(x, top + 24, outcome, room, bold=True)
        counter = f"`.{outcome}`"
        drawing.text(x, top + 43, counter, room, size=11, colour="#555")
        x, room = ROW_X + TITLE_W, ROW_W - TITLE_W - 12
        drawing.text(x, top + 24, ending.how, room, size=13)
        drawing.text(x, top + 43, ending.then, room, size=13)
        # Each outcome leaves the operation finished: on to the purge.
        drawing.line(f"M{ROW_X + ROW_W},{middle:g} H{bus}")
    purge_top = rows_bottom + 40
    drawing.line(
        f"M{bus},{ROWS_TOP + ROW_H / 2:g} V{purge_top - 2}", arrow=True
    )
    return purge_top


def purge(drawing: Drawing, top: float) -> float:
    """The purge, with the code's own values; returns where it ends."""
    interval = default_purge_interval()
    lines = (
        "a finished operation stays on its other keys' lists until a purge"
        " removes it, in bulk:",
        f"by Kafka's rule, once more than `purge_interval` ({interval:,} by"
        " default) finished since the last purge;",
        f"on the event loop also at most {LINGER:g} s after the first one"
        " finished (a quiet server); `purge()`: now",
        "`statistics().purged`: entries removed; `.purges`: timer passes"
        " that purged",
    )
    height = 46 + 19 * len(lines)
    drawing.box(20, top, WIDTH - 40, height, "purge")
    centre = WIDTH / 2
    drawing.text(centre, top + 24, "purge", 200, anchor="middle", bold=True)
    for i, line in enumerate(lines):
        y = top + 46 + 19 * i
        drawing.text(centre, y, line, WIDTH - 60, size=13, anchor="middle")
    return top + height


def lifecycle_svg() -> str:
    """The life of a delayed operation, as SVG: the same for the same code."""
    check_outcomes()
    drawing = Drawing("The life of a delayed operation")
    watch_call(drawing)
    end = purge(drawing, outcomes(drawing))
    return drawing.svg(end + 16)


# -- the command line ---------------------------------------------------------


def draw_lifecycle(check: bool) -> int:
    drawn = lifecycle_svg()
    name = LIFECYCLE.relative_to(ROOT)
    if not check:
        LIFECYCLE.write_text(drawn, encoding="utf-8")
        print(f"wrote {name}")
        return 0
    if LIFECYCLE.read_text(encoding="utf-8") != drawn:
        print(f"{name} is stale: python docs/draw.py lifecycle draws it")
        return 1
    print(f"{name} is up to date")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    pictures = parser.add_subparsers(dest="picture", required=True)
    lifecycle = pictures.add_parser(
        "lifecycle", help="docs/assets/lifecycle.svg, from the code"
    )
    lifecycle.add_argument(
        "--check", action="store_true", help="compare, write nothing"
    )
    pictures.add_parser(
        "metrics",
        help="docs/metrics-demo.png, from a real run of the broker demo"
        " (its options: python docs/metrics_picture.py --help)",
        add_help=False,
    )
    args, rest = parser.parse_known_args(argv)
    if args.picture == "lifecycle":
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return draw_lifecycle(args.check)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import metrics_picture

    return metrics_picture.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
