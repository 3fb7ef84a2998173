"""`JsonLinesEventLog`: an `EventLog` that writes one JSON line per operation, at its end.

The hot path, the files, anchors and failures are `FileRecorder`'s (``_recorder.py``). This
module renders a batch: every line of it at once, column by column (names and keys JSON-encoded
once and remembered), with the anchor line first when the batch carries one. With pyarrow
installed, the lines are joined by its C++ kernels (numbers as their shortest decimal text);
without it, or for a batch holding a non-finite time or an operation still open, by one
``%``-format per line (numbers as Python's ``repr``). The lines mean the same either way.
Files are ``<prefix>-<token>-<seq>.jsonl``. Operations still open at `close` are written with
``"outcome": "open"`` and ``"ended_at": null``.

Standard JSON only. A number JSON cannot hold (an infinite threshold, a NaN from ``fields=``,
a non-finite time) is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``:
strict parsers accept every line, and Spark's JSON reader reads these strings back as doubles.

The line schema (version 2) is documented in ``docs/pipeline-schemas.md``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple, final

from ._recorder import ANCHOR_DRIFT, EVENT_LOG_VERSION, SAME_CLOCK, Batch, FileRecorder

__all__ = ("ANCHOR_DRIFT", "EVENT_LOG_VERSION", "SAME_CLOCK", "JsonLinesEventLog")

_LINE = (
    '{"v":2,"purgatory":%s,"id":%s,"keys":[%s],"thresholds":%s,"watched_at":%s,"timeout":%s,'
    '"deadline":%s,"outcome":"%s","ended_at":%s%s}\n'
)
# Key tuples whose JSON rendering is remembered; past this the cache starts over (unique keys
# such as request ids would otherwise grow it without bound).
_KEY_CACHE_LIMIT = 65536


@final
class JsonLinesEventLog(FileRecorder):
    """Record each operation's lifecycle as one JSON line, written when the operation ends.

    Args:
        directory: Where the files go (created if missing).
        prefix: The start of every file name.
        max_bytes: Rotate to a new file once the current one holds at least this many bytes.
        buffer_lines: Finished operations kept before a batch is rendered and written.
        fields: Called once per operation at its watch; the mapping it returns is written as
            the line's ``"fields"`` object (values JSON-encoded, ``str()`` for anything JSON does
            not know). For instance ``fields=lambda op: {"request_id": op.request_id}``.
        op_id: Called once per operation at its watch for the line's ``"id"`` (an int or a str);
            ``None``: a counter per purgatory name, from 0 in watch order.
        key: Renders one key as a string for ``"keys"``; default ``str``.
        clock: The purgatory's clock, read (with ``time.time()``) once per batch to anchor the
            log to UTC; default ``time.monotonic``, the clock of asyncio's event loops.
            ``None``: no anchors (the times are not of a real clock, as in a replay).
        render: ``"auto"``: render batches with pyarrow's C++ kernels when pyarrow is
            installed (numbers then appear as their shortest decimal text, ``1`` for ``1.0``),
            else in Python; ``"python"``: always in Python (numbers as Python's ``repr``). The
            lines mean the same either way.
        watch_records: Also write a *watch record* for each operation as it is watched
            (outcome ``watched``, ``ended_at`` null), then its end record as usual: a reader
            that follows the published files (``analyze --follow --stuck``) knows of every
            operation watched, and so of those whose end never comes (a killed process, a lost
            wake-up). Twice the records; the pipeline's batch readers skip watch records.

    Raises:
        ValueError: `max_bytes` or `buffer_lines` is < 1, or `render` is unknown.
    """

    __slots__ = ("_arrow", "_key_cache", "_name_cache", "_one_key_cache")

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        prefix: str = "events",
        max_bytes: int = 64 * 1024 * 1024,
        buffer_lines: int = 8192,
        fields: Callable[[Any], Mapping[str, Any]] | None = None,
        op_id: Callable[[Any], int | str] | None = None,
        key: Callable[[Hashable], str] = str,
        clock: Callable[[], float] | None = time.monotonic,
        watch_records: bool = False,
        render: Literal["auto", "python"] = "auto",
    ) -> None:
        if render not in ("auto", "python"):
            raise ValueError(f"render must be 'auto' or 'python', got {render!r}")
        super().__init__(
            directory,
            ".jsonl",
            prefix=prefix,
            max_bytes=max_bytes,
            buffer_lines=buffer_lines,
            fields=fields,
            op_id=op_id,
            key=key,
            clock=clock,
            watch_records=watch_records,
        )
        self._arrow = _pyarrow_compute() if render == "auto" else None
        self._key_cache: dict[tuple[Hashable, ...], str] = {}
        self._one_key_cache: dict[Hashable, str] = {}
        self._name_cache: dict[str, str] = {}

    # -- rendering ----------------------------------------------------------------------------

    def _render(self, batch: Batch, anchor: tuple[float, float] | None, new: bool) -> bytes:
        """Every line of `batch`, built column by column (see the module docstring)."""
        n = len(batch)
        ids, outcomes, ends = batch.ids, batch.outcomes, batch.ended
        watched, timeouts, deadlines = batch.watched, batch.timeouts, batch.deadlines
        names = _rendered(batch.names, self._name_cache, self._name)
        keys = _rendered(batch.keys, self._key_cache, self._render_keys)
        thresholds = ["null"] * n
        if batch.thresholds.count(None) != n:
            thresholds = ["null" if t is None else _json(list(t)) for t in batch.thresholds]
        fields = [""] * n
        if batch.fields.count(None) != n:
            fields = ["" if f is None else ',"fields":' + _json(f) for f in batch.fields]
        texts = _Columns(
            names, ids, keys, thresholds, watched, timeouts, deadlines, outcomes, ends, fields
        )
        if (
            self._arrow is not None
            and None not in ends
            and _all_finite(watched, timeouts, deadlines, ends)
        ):
            data = self._render_arrow(texts)
        else:
            data = self._render_python(texts)
        if new and anchor is not None:
            line = f'{{"v":2,"anchor":{{"clock":{anchor[0]!r},"utc":{anchor[1]!r}}}}}\n'
            data = line.encode() + data
        return data

    def _render_python(self, texts: _Columns) -> bytes:
        """The lines through one ``%``-format each (floats as their ``repr``)."""
        ids = [i if type(i) is int else json.dumps(i) for i in texts.ids]
        ends = texts.ends
        if None in ends:
            ends = ["null" if e is None else _number(e) for e in ends]
        else:
            ends = list(_numbers(ends))
        rows = zip(
            texts.names,
            ids,
            texts.keys,
            texts.thresholds,
            _numbers(texts.watched),
            _numbers(texts.timeouts),
            _numbers(texts.deadlines),
            texts.outcomes,
            ends,
            texts.fields,
            strict=True,
        )
        return "".join(map(_LINE.__mod__, rows)).encode()

    def _render_arrow(self, texts: _Columns) -> bytes:
        """The same lines, joined by Arrow in C++ (numbers as their shortest decimal text).

        Only for batches whose times are all finite and ended (`_render` checks).
        """
        names, ids, keys, thresholds = texts.names, texts.ids, texts.keys, texts.thresholds
        watched, timeouts, deadlines = texts.watched, texts.timeouts, texts.deadlines
        outcomes, ends, fields = texts.outcomes, texts.ends, texts.fields
        assert self._arrow is not None
        pa, pc = self._arrow
        string = pa.string()

        def text(values: list[Any]) -> Any:
            if values.count(values[0]) == len(values):
                return values[0]  # one value: a scalar, no column
            return pa.array(values, string)

        def number(values: list[Any]) -> Any:
            return pc.cast(pa.array(values, pa.float64()), string)

        try:
            id_column = pa.array(ids, pa.int64()).cast(string)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            # Mixed, or beyond 64 bits: each rendered as the Python renderer does.
            id_column = pa.array([str(i) if type(i) is int else json.dumps(i) for i in ids], string)
        joined = pc.binary_join_element_wise(
            '{"v":2,"purgatory":',
            text(names),
            ',"id":',
            id_column,
            ',"keys":[',
            text(keys),
            '],"thresholds":',
            text(thresholds),
            ',"watched_at":',
            number(watched),
            ',"timeout":',
            number(timeouts),
            ',"deadline":',
            number(deadlines),
            ',"outcome":"',
            text(outcomes),
            '","ended_at":',
            number(ends),
            text(fields),
            "}\n",
            "",
        )
        size = pc.sum(pc.binary_length(joined)).as_py()
        data: bytes = joined.buffers()[2].to_pybytes()[:size]
        return data

    def _name(self, name: str) -> str:
        return json.dumps(name)

    def _render_keys(self, keys: tuple[Hashable, ...]) -> str:
        """JSON of `keys` without the brackets, remembered per key tuple (by `_rendered`) and
        per key (bounded)."""
        one = self._one_key_cache
        if len(one) >= _KEY_CACHE_LIMIT:
            one.clear()
        parts = []
        for key in keys:
            text = one.get(key)
            if text is None:
                text = one[key] = json.dumps(self._key(key))
            parts.append(text)
        return ",".join(parts)


class _Columns(NamedTuple):
    """A batch's columns as the lines take them: names, keys, thresholds and fields as JSON
    text, the rest as values."""

    names: list[str]
    ids: list[Any]
    keys: list[str]
    thresholds: list[str]
    watched: list[float]
    timeouts: list[float]
    deadlines: list[float]
    outcomes: list[str]
    ends: list[Any]
    fields: list[str]


def _rendered(values: list[Any], cache: dict[Any, str], render: Callable[[Any], str]) -> list[str]:
    """`values` rendered: each distinct one once (remembered in `cache`, bounded), then a
    C-level lookup per value."""
    distinct = dict.fromkeys(values)
    if len(cache) + len(distinct) > _KEY_CACHE_LIMIT:
        cache.clear()
    for value in distinct:
        if value not in cache:
            cache[value] = render(value)
    return list(map(cache.__getitem__, values))


def _pyarrow_compute() -> tuple[Any, Any] | None:
    """pyarrow and its compute module, or None without pyarrow (then lines render in Python)."""
    try:
        import pyarrow  # optional: a faster rendering when installed
        import pyarrow.compute
    except ImportError:
        return None
    return pyarrow, pyarrow.compute


def _all_finite(*columns: list[Any]) -> bool:
    """True if every number of `columns` is finite (C-level sums; an overflow says False)."""
    total = 0.0
    for column in columns:
        total += sum(column)
    return total - total == 0.0


_NON_FINITE: Final = {math.inf: '"Infinity"', -math.inf: '"-Infinity"'}


def _numbers(column: Sequence[Any]) -> Sequence[Any]:
    """A column of floats for ``%s``: itself if all are finite (one C-level sum says so)."""
    total = sum(column)
    if total - total == 0.0:
        return column
    return [_number(x) for x in column]  # a NaN, an infinity, or an overflow of the sum


def _number(value: Any) -> Any:
    """A float as JSON: itself if finite, else the string ``"NaN"`` or ``"[-]Infinity"``."""
    if value - value == 0.0:
        return value
    return _NON_FINITE.get(value, '"NaN"')


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by its string (recursively in containers)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json(value: Any) -> str:
    """Standard JSON of `value` (``str()`` for what JSON does not know; see `_finite`)."""
    try:
        return json.dumps(value, default=str, separators=(",", ":"), allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), default=str, separators=(",", ":"), allow_nan=False)
