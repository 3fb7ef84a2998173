"""`JsonLinesEventLog`: one whole JSON line per operation, at its end; rotation; open operations."""

from __future__ import annotations

import asyncio
import errno
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pytest
from helpers import FlagOperation

import purgatory._events
from purgatory import ArrowEventLog, DelayedOperationPurgatory, JsonLinesEventLog
from purgatory._eventlog import ANCHOR_DRIFT, SAME_CLOCK
from purgatory._events import EventLog
from purgatory.testing import ManualClock


def every_line(directory: Path) -> list[dict[str, Any]]:
    """Every line of every complete file, in file order, anchors included."""
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        text = path.read_text()
        assert text.endswith("\n"), f"{path} does not end with a whole line"
        out.extend(json.loads(line) for line in text.splitlines())
    return out


def lines(directory: Path) -> list[dict[str, Any]]:
    """Every operation's line of every complete file, in file order."""
    return [line for line in every_line(directory) if "anchor" not in line]


def watch(
    log: JsonLinesEventLog | ArrowEventLog,
    name: str,
    op: FlagOperation,
    keys: tuple[Any, ...],
    at: float,
) -> None:
    log.record_watch(name, op, keys, None, at, at + op.timeout)


def test_one_line_per_operation_written_at_its_end(tmp_path: Path) -> None:
    log = JsonLinesEventLog(tmp_path, fields=lambda op: {"name": op.name, "obj": object})
    assert isinstance(log, EventLog)
    a, b, c = FlagOperation(0.5, "a"), FlagOperation(0.25, "b"), FlagOperation(1.0, "c")
    watch(log, "produce", a, ("t-0", 7), 1.0)
    watch(log, "produce", b, ("t-1",), 1.5)
    watch(log, "fetch", c, (("topic", 3),), 2.0)
    log.record_end("produce", b, "expired", 1.75)
    log.record_end("produce", a, "completed", 1.125)
    log.flush()
    first = lines(tmp_path)
    assert [line["id"] for line in first] == [1, 0]  # end order; ids per purgatory, watch order
    assert first[1] == {
        "v": 2,
        "purgatory": "produce",
        "id": 0,
        "keys": ["t-0", "7"],
        "thresholds": None,
        "watched_at": 1.0,
        "timeout": 0.5,
        "deadline": 1.5,
        "outcome": "completed",
        "ended_at": 1.125,
        "fields": {"name": "a", "obj": str(object)},
    }
    assert log.open_operations == 1
    log.record_end("fetch", c, "cancelled", 2.5)
    log.record_end("fetch", c, "cancelled", 2.5)  # a second end of the same operation
    log.close()
    every = lines(tmp_path)
    assert [(x["purgatory"], x["id"], x["outcome"]) for x in every[2:]] == [
        ("fetch", 0, "cancelled")
    ]
    assert every[2]["keys"] == ["('topic', 3)"]
    assert log.unmatched_ends == 1
    assert len(log.closed_files) == 2  # flush published the first file
    assert not list(tmp_path.glob("*.part"))


def test_rotation_keeps_whole_lines_and_part_files_are_unpublished(tmp_path: Path) -> None:
    log = JsonLinesEventLog(tmp_path, max_bytes=400, buffer_lines=2, op_id=lambda op: op.name)
    ops = [FlagOperation(1.0, f"op{i}") for i in range(11)]
    for i, op in enumerate(ops):
        watch(log, "p", op, ("k",), float(i))
        log.record_end("p", op, "completed", i + 0.5)
    # Ten lines went out in batches of two; the eleventh waits in the buffer. Published files
    # hold whole lines, the first ones in order; the file being written is not published.
    published = lines(tmp_path)
    assert [x["id"] for x in published] == [f"op{i}" for i in range(len(published))]
    assert len(list(tmp_path.glob("*.jsonl.part"))) == 1
    assert len(log.closed_files) >= 2, (
        "a batch of two lines is about 340 bytes: it must have rotated"
    )
    for path in log.closed_files:
        size = Path(path).stat().st_size
        assert size >= 400
    log.close()
    assert [x["id"] for x in lines(tmp_path)] == [f"op{i}" for i in range(11)]
    assert not list(tmp_path.glob("*.part"))


def test_operations_still_open_at_close_are_written_as_open(tmp_path: Path) -> None:
    with JsonLinesEventLog(tmp_path) as log:
        watch(log, "p", FlagOperation(3.0), ("k",), 0.0)
    (line,) = lines(tmp_path)
    assert (line["outcome"], line["ended_at"], line["deadline"]) == ("open", None, 3.0)
    assert log.open_operations == 0


def test_two_recorders_share_a_directory(tmp_path: Path) -> None:
    for _ in range(2):
        with JsonLinesEventLog(tmp_path) as log:
            op = FlagOperation(1.0)
            watch(log, "p", op, ("k",), 0.0)
            log.record_end("p", op, "refused", 0.0)
    assert [x["outcome"] for x in lines(tmp_path)] == ["refused", "refused"]


@pytest.mark.parametrize(("argument", "value"), [("max_bytes", 0), ("buffer_lines", 0)])
def test_bad_arguments(tmp_path: Path, argument: str, value: int) -> None:
    with pytest.raises(ValueError, match=argument):
        JsonLinesEventLog(tmp_path, **{argument: value})  # type: ignore[arg-type]


# -- standard JSON only -----------------------------------------------------------------------


def _refuse(token: str) -> Any:
    raise ValueError(f"not standard JSON: {token}")


def strict_lines(directory: Path) -> list[dict[str, Any]]:
    """Every operation's line, parsed by a reader that refuses NaN and Infinity."""
    parsed = [
        json.loads(line, parse_constant=_refuse)
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return [line for line in parsed if "anchor" not in line]


def test_non_finite_numbers_are_written_as_strings(tmp_path: Path) -> None:
    log = JsonLinesEventLog(
        tmp_path,
        fields=lambda op: {"nan": math.nan, "deep": [{"inf": -math.inf}], "ok": 1.5},
    )
    op, other = FlagOperation(1.0, "a"), FlagOperation(1.0, "b")
    log.record_watch("p", op, ("k", "j"), (math.inf, None), 1.0, 2.0)
    log.record_watch("p", other, ("k",), None, math.nan, math.inf)
    log.record_end("p", op, "completed", 1.5)
    log.record_end("p", other, "expired", -math.inf)
    log.close()
    first, second = strict_lines(tmp_path)
    assert first["thresholds"] == ["Infinity", None]
    assert first["fields"] == {"nan": "NaN", "deep": [{"inf": "-Infinity"}], "ok": 1.5}
    assert (second["watched_at"], second["deadline"], second["ended_at"]) == (
        "NaN",
        "Infinity",
        "-Infinity",
    )
    assert second["timeout"] == 1.0


# -- writes that fail -------------------------------------------------------------------------


def ended(log: JsonLinesEventLog | ArrowEventLog, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        op = FlagOperation(1.0, f"op{i}")
        watch(log, "p", op, ("k",), float(i))
        log.record_end("p", op, "completed", i + 0.5)


def test_a_removed_directory_counts_every_line_it_could_not_publish(tmp_path: Path) -> None:
    directory = tmp_path / "logs"
    log = JsonLinesEventLog(directory, buffer_lines=2)
    ended(log, 2)
    log.flush()
    ended(log, 4, start=2)  # two batches written to the open ".part" file
    shutil.rmtree(directory)
    with pytest.raises(FileNotFoundError) as publish:
        log.flush()  # the file's rename fails: its four lines are lost
    assert log.lost_lines == 4
    assert "4 records lost" in "".join(publish.value.__notes__)
    with pytest.raises(FileNotFoundError):
        ended(log, 2, start=6)  # a new file cannot be created: the batch of two is lost
    assert log.lost_lines == 6
    ended(log, 1, start=8)
    with pytest.raises(FileNotFoundError):
        log.close()  # the seventh line, still buffered, is lost too
    assert log.lost_lines == 7
    assert len(log.closed_files) == 1
    directory.mkdir()
    ended(log, 2, start=9)  # the recorder goes on once it can write again
    log.close()
    assert [x["watched_at"] for x in lines(directory)] == [9.0, 10.0]
    assert log.lost_lines == 7


class _FailingWrites:
    """``os.write`` that fails after writing `partial` bytes, `failures` times."""

    def __init__(self, failures: int, partial: int) -> None:
        self.failures = failures
        self.partial = partial
        self.real = os.write

    def __call__(self, fd: int, data: Any) -> int:
        if self.failures:
            self.failures -= 1
            if self.partial:
                self.real(fd, bytes(data[: self.partial]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data)


def test_a_failed_write_loses_its_batch_and_never_leaves_part_of_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = JsonLinesEventLog(tmp_path, buffer_lines=2)
    ended(log, 2)
    monkeypatch.setattr(os, "write", _FailingWrites(failures=1, partial=17))
    with pytest.raises(OSError, match="No space left"):
        ended(log, 2, start=2)
    assert log.lost_lines == 2
    ended(log, 2, start=4)
    log.close()
    assert [x["watched_at"] for x in strict_lines(tmp_path)] == [0.0, 1.0, 4.0, 5.0]
    assert log.lost_lines == 2


def test_a_failed_open_loses_its_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = JsonLinesEventLog(tmp_path, buffer_lines=3)
    real = os.open

    def failing_open(*args: Any, **kwargs: Any) -> int:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(os, "open", failing_open)
    with pytest.raises(PermissionError):
        ended(log, 3)
    log.close()  # nothing left to write
    assert log.lost_lines == 3
    monkeypatch.setattr(os, "open", real)
    ended(log, 1, start=3)
    log.close()
    assert [x["watched_at"] for x in lines(tmp_path)] == [3.0]
    assert log.lost_lines == 3


@pytest.mark.parametrize("fmt", ["json", "arrow"])
def test_writes_that_fail_in_the_shutdown_flush_lose_only_their_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """A shutdown's flush writes batch after batch: one whose write fails is counted lost, and
    the batches after it are still written and published, never left in memory uncounted."""
    log: Any = (JsonLinesEventLog if fmt == "json" else ArrowEventLog)(tmp_path, buffer_lines=2)
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("flush", clock=clock, event_log=log)
    ops = [FlagOperation(1.0, str(i)) for i in range(9)]
    for i, op in enumerate(ops):
        p.try_complete_else_watch(op, [i])
    for op in ops[:7]:
        op.force_complete()  # ended, and still in the purgatory's sink: no batch taken yet
    # The first two writes fail: one as the shutdown collects, one in the recorder's flush.
    monkeypatch.setattr(os, "write", _FailingWrites(failures=2, partial=0))
    errors: list[str] = []
    monkeypatch.setattr(
        purgatory._events, "report_exception", lambda message, exc, **_: errors.append(message)
    )
    asyncio.run(p.shutdown())  # 7 ended + 2 cancelled: 5 batches
    assert log.lost_lines == 4
    assert len(errors) == 2
    written = lines(tmp_path) if fmt == "json" else arrow_rows(tmp_path)
    assert len(written) == 5
    log.close()  # nothing was left behind to write now
    assert log.lost_lines == 4
    assert len(lines(tmp_path) if fmt == "json" else arrow_rows(tmp_path)) == 5


@pytest.mark.asyncio
@pytest.mark.virtualclock
async def test_a_purgatory_whose_recorder_lost_lines_settles_and_reports(
    tmp_path: Path,
) -> None:
    contexts: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: contexts.append(ctx))
    directory = tmp_path / "logs"
    log = JsonLinesEventLog(directory, buffer_lines=1)
    async with DelayedOperationPurgatory[FlagOperation]("lost", event_log=log) as p:
        first = FlagOperation(30.0, "first")
        p.try_complete_else_watch(first, ["a"])
        shutil.rmtree(directory)
        first.ready = True
        assert p.check_and_complete("a") == 1
        assert await p.watch(FlagOperation(0.01, "second"), ["b"]) is not None
    # Each line was a batch: the first's file could not be created, nor the second's.
    assert log.lost_lines == 2
    assert len(contexts) == 2
    assert all("event log" in ctx["message"] for ctx in contexts)


# -- anchors to UTC ---------------------------------------------------------------------------


class Clocks:
    """The purgatory's clock and the system clock, moved by hand (``time.time`` patched)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, now: float, wall: float) -> None:
        self.now = now
        self.wall = wall
        self.reads = 0
        monkeypatch.setattr(time, "time", self.time)

    def time(self) -> float:
        self.reads += 1
        return self.wall

    def clock(self) -> float:
        return self.now

    def move(self, seconds: float, wall_extra: float = 0.0) -> None:
        self.now += seconds
        self.wall += seconds + wall_extra


def test_each_file_starts_with_an_anchor_and_drift_re_anchors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clocks = Clocks(monkeypatch, now=1865.0, wall=1_790_000_000.0)
    log = JsonLinesEventLog(tmp_path, buffer_lines=2, clock=clocks.clock)

    def one(name: str) -> None:
        op = FlagOperation(1.0, name)
        log.record_watch("p", op, ("k",), None, clocks.now, clocks.now + 1.0)
        clocks.move(0.25)
        log.record_end("p", op, "completed", clocks.now)

    one("a")  # the first end checks the clock: the same as the events'
    assert log.anchor_error is None
    one("b")
    one("c")
    clocks.move(10.0, wall_extra=ANCHOR_DRIFT / 2)  # within the bound: no new anchor
    one("d")
    clocks.move(10.0, wall_extra=-0.5)  # the system clock stepped back half a second
    one("e")
    one("f")
    log.flush()
    one("g")  # a new file starts with an anchor
    log.close()
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) == 2
    first = [json.loads(line) for line in files[0].read_text().splitlines()]
    kinds = ["anchor" if "anchor" in line else "op" for line in first]
    assert kinds == ["anchor", "op", "op", "op", "op", "anchor", "op", "op"]
    start, stepped = first[0], first[5]
    assert start == {"v": 2, "anchor": {"clock": 1865.5, "utc": 1_790_000_000.5}}
    assert stepped["anchor"]["utc"] - stepped["anchor"]["clock"] == pytest.approx(
        1_790_000_000.0 - 1865.0 + ANCHOR_DRIFT / 2 - 0.5
    )
    second = [json.loads(line) for line in files[1].read_text().splitlines()]
    assert "anchor" in second[0]
    assert [x["id"] for x in second[1:]] == [6]


def test_a_purgatory_on_another_clock_gets_no_anchor(tmp_path: Path) -> None:
    log = JsonLinesEventLog(tmp_path)  # time.monotonic, but the events are on a ManualClock
    clock = ManualClock()
    p = DelayedOperationPurgatory[FlagOperation]("virtual", clock=clock, event_log=log)
    p.try_complete_else_watch(FlagOperation(1.0), ["k"])
    clock.advance(2.0)
    log.close()
    assert log.anchor_error is not None
    assert "another clock" in log.anchor_error
    assert [line["outcome"] for line in every_line(tmp_path)] == ["expired"]


def test_no_clock_no_anchor(tmp_path: Path) -> None:
    log = JsonLinesEventLog(tmp_path, clock=None)
    ended(log, 3)
    log.close()
    assert log.anchor_error == "no clock given"
    assert len(every_line(tmp_path)) == 3


@pytest.mark.asyncio
async def test_a_live_purgatory_is_anchored_to_the_system_clock(tmp_path: Path) -> None:
    log = JsonLinesEventLog(tmp_path)
    async with DelayedOperationPurgatory[FlagOperation]("live", event_log=log) as p:
        assert await p.watch(FlagOperation(0.001), ["k"]) is not None
    anchor, line = every_line(tmp_path)
    assert log.anchor_error is None
    offset = anchor["anchor"]["utc"] - anchor["anchor"]["clock"]
    # The anchor's offset is the system clock's against the loop's (read here, once more).
    assert offset == pytest.approx(time.time() - time.monotonic(), abs=SAME_CLOCK)
    assert line["watched_at"] <= anchor["anchor"]["clock"]


# -- the columnar recorder --------------------------------------------------------------------


def arrow_rows(directory: Path) -> list[dict[str, Any]]:
    """Every row of every published Arrow stream, in file order."""
    rows: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.arrows")):
        with pa.ipc.open_stream(pa.memory_map(str(path))) as reader:
            assert reader.schema.metadata == {b"purgatory.event_log": b"2"}
            rows.extend(reader.read_all().to_pylist())
    return rows


def feed(log: JsonLinesEventLog | ArrowEventLog) -> None:
    """The same calls for both recorders: plain and threshold watches, odd keys, all outcomes."""
    a, b, c = FlagOperation(0.5, "a"), FlagOperation(0.25, "b"), FlagOperation(1.0, "c")
    log.record_watch("produce", a, ("t-0", 7), None, 1.0, 1.5)
    log.record_watch("produce", b, ("t-1",), (3, None), 1.5, 1.75)
    log.record_watch("fetch", c, (("topic", 3),), (math.inf,), 2.0, 3.0)
    log.record_end("produce", b, "expired", 1.75)
    log.record_end("produce", a, "completed", 1.125)
    log.close()


def test_the_arrow_recorder_writes_what_the_json_one_does(tmp_path: Path) -> None:
    def fields(op: FlagOperation) -> dict[str, Any]:
        return {"name": op.name, "nan": math.nan}

    feed(JsonLinesEventLog(tmp_path / "json", fields=fields, clock=None))
    feed(ArrowEventLog(tmp_path / "arrow", fields=fields, clock=None))
    expected = strict_lines(tmp_path / "json")
    rows = arrow_rows(tmp_path / "arrow")
    assert len(rows) == len(expected) == 3
    for line, row in zip(expected, rows, strict=True):
        assert row.pop("anchor") is None
        row["id"] = int(row["id"])
        for name in ("thresholds", "fields"):
            row[name] = None if row[name] is None else json.loads(row[name])
        del line["v"]
        assert row == line
    assert rows[2]["keys"] == ["('topic', 3)"]
    assert rows[2]["outcome"] == "open"


def test_arrow_files_are_published_whole_and_a_part_file_reads_to_its_last_batch(
    tmp_path: Path,
) -> None:
    log = ArrowEventLog(tmp_path, max_bytes=2500, buffer_lines=2, op_id=lambda op: op.name)
    ended(log, 11)
    assert len(list(tmp_path.glob("*.arrows.part"))) == 1
    assert len(log.closed_files) >= 2
    published = [row["watched_at"] for row in arrow_rows(tmp_path)]
    assert published == [float(i) for i in range(len(published))]
    log.close()
    assert [row["id"] for row in arrow_rows(tmp_path)] == [f"op{i}" for i in range(11)]
    assert not list(tmp_path.glob("*.part"))


def test_arrow_rows_carry_the_anchor_and_keys_go_through_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clocks = Clocks(monkeypatch, now=50.0, wall=1_790_000_000.0)
    log = ArrowEventLog(tmp_path, buffer_lines=2, clock=clocks.clock, key=repr)
    for i in range(4):
        op = FlagOperation(1.0)
        log.record_watch("p", op, ("k", i), None, clocks.now, clocks.now + 1.0)
        clocks.move(0.5)
        log.record_end("p", op, "completed", clocks.now)
    log.close()
    rows = arrow_rows(tmp_path)
    assert [row["keys"] for row in rows] == [["'k'", str(i)] for i in range(4)]
    assert {(row["anchor"]["clock"], row["anchor"]["utc"]) for row in rows} == {
        (51.0, 1_790_000_001.0)
    }


def read_batches(data: bytes) -> tuple[int, BaseException | None]:
    """Rows of the whole batches of an Arrow stream, and the error that stopped the reading."""
    rows = 0
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    try:
        while True:
            rows += reader.read_next_batch().num_rows
    except StopIteration:
        return rows, None
    except OSError as exc:
        return rows, exc


def test_a_killed_process_leaves_an_arrow_part_file_readable_to_its_last_batch(
    tmp_path: Path,
) -> None:
    log = ArrowEventLog(tmp_path, buffer_lines=2, clock=None)
    ended(log, 6)  # three batches in the ".part" file
    (part,) = tmp_path.glob("*.arrows.part")
    data = part.read_bytes()
    assert read_batches(data) == (6, None)
    rows, error = read_batches(data[:-10])  # killed while writing the third batch
    assert rows == 4
    assert error is not None


@pytest.mark.parametrize("recorder", [JsonLinesEventLog, ArrowEventLog])
def test_either_recorder_counts_a_failed_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorder: type[JsonLinesEventLog]
) -> None:
    log = recorder(tmp_path, buffer_lines=2, clock=None)
    ended(log, 2)
    monkeypatch.setattr(os, "write", _FailingWrites(failures=1, partial=17))
    with pytest.raises(OSError, match="No space left"):
        ended(log, 2, start=2)
    monkeypatch.undo()
    ended(log, 2, start=4)
    log.close()
    assert log.lost_lines == 2
    read = lines if recorder is JsonLinesEventLog else arrow_rows
    assert [x["watched_at"] for x in read(tmp_path)] == [0.0, 1.0, 4.0, 5.0]


@pytest.mark.parametrize("recorder", [JsonLinesEventLog, ArrowEventLog])
def test_a_flush_whose_last_write_fails_still_publishes_the_whole_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recorder: type[JsonLinesEventLog]
) -> None:
    log = recorder(tmp_path, buffer_lines=2, clock=None)
    ended(log, 4)  # two whole batches in the ".part" file
    ended(log, 1, start=4)  # the last, written by the flush
    monkeypatch.setattr(os, "write", _FailingWrites(failures=1, partial=9))
    with pytest.raises(OSError, match="No space left"):
        log.flush()  # the disk fills at shutdown
    monkeypatch.undo()
    assert log.lost_lines == 1  # the failed batch, and nothing else
    assert not list(tmp_path.glob("*.part"))  # published, and the file closed
    read = lines if recorder is JsonLinesEventLog else arrow_rows
    assert [x["watched_at"] for x in read(tmp_path)] == [0.0, 1.0, 2.0, 3.0]


def test_lines_rendered_by_arrow_mean_what_python_renders(tmp_path: Path) -> None:
    def record(log: JsonLinesEventLog) -> None:
        for i in range(50):
            op = FlagOperation(0.125, f"op{i}")
            at = 1865.0 + i / 3
            thresholds = None if i % 3 else (i, None)
            log.record_watch(f"p{i % 2}", op, (f"k{i % 7}", i % 5), thresholds, at, at + 0.125)
            log.record_end(f"p{i % 2}", op, "completed" if i % 4 else "expired", at + 0.0625)
        log.flush()

    fast = JsonLinesEventLog(
        tmp_path / "auto", clock=None, fields=lambda op: {"name": op.name}, op_id=lambda op: op.name
    )
    slow = JsonLinesEventLog(
        tmp_path / "python",
        clock=None,
        fields=lambda op: {"name": op.name},
        op_id=lambda op: op.name,
        render="python",
    )
    assert fast._arrow is not None  # pyarrow is installed with the test dependencies
    record(fast)
    record(slow)
    auto, python = strict_lines(tmp_path / "auto"), strict_lines(tmp_path / "python")
    assert len(auto) == 50
    assert auto == python


def test_an_unknown_render_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="render must be 'auto' or 'python', got 'c'"):
        JsonLinesEventLog(tmp_path, render="c")  # type: ignore[arg-type]


def test_an_anchor_lost_with_a_failed_batch_is_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clocks = Clocks(monkeypatch, now=10.0, wall=1_790_000_000.0)
    log = JsonLinesEventLog(tmp_path, buffer_lines=2, clock=clocks.clock)

    def one() -> None:
        op = FlagOperation(1.0)
        log.record_watch("p", op, ("k",), None, clocks.now, clocks.now + 1.0)
        clocks.move(0.5)
        log.record_end("p", op, "completed", clocks.now)

    one()
    one()  # the file starts, with its anchor
    clocks.move(1.0, wall_extra=0.25)  # the system clock steps: the next batch re-anchors...
    with monkeypatch.context() as patch:
        patch.setattr(os, "write", _FailingWrites(failures=1, partial=0))
        one()
        with pytest.raises(OSError, match="No space left"):
            one()  # ...but that batch is lost, its anchor with it
    one()
    one()
    log.close()
    anchors = [line["anchor"] for line in every_line(tmp_path) if "anchor" in line]
    assert len(anchors) == 2
    assert anchors[1]["utc"] - anchors[1]["clock"] == pytest.approx(
        anchors[0]["utc"] - anchors[0]["clock"] + 0.25
    )
    assert log.lost_lines == 2


def test_ids_count_per_purgatory_whatever_the_order(tmp_path: Path) -> None:
    log = JsonLinesEventLog(tmp_path, clock=None)
    names = ["p", "q", "p", "p", "q", "r", "p"]
    for i, name in enumerate(names):
        op = FlagOperation(1.0)
        log.record_watch("".join(name), op, ("k",), None, float(i), i + 1.0)  # equal, not same
        log.record_end(name, op, "completed", i + 0.5)
    log.close()
    assert [(x["purgatory"], x["id"]) for x in lines(tmp_path)] == [
        ("p", 0),
        ("q", 0),
        ("p", 1),
        ("p", 2),
        ("q", 1),
        ("r", 0),
        ("p", 3),
    ]


def test_an_arrow_file_whose_first_write_failed_starts_again_with_its_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first batch of an Arrow file carries the stream's schema: if its write fails, the next
    batch must not go on in the same file without one (every published file must read)."""
    log = ArrowEventLog(tmp_path, buffer_lines=1, op_id=lambda op: op.name)
    monkeypatch.setattr(os, "write", _FailingWrites(failures=1, partial=10))
    with pytest.raises(OSError, match="No space left"):
        ended(log, 1)
    ended(log, 2, start=1)
    log.close()
    assert log.lost_lines == 1
    assert [row["id"] for row in arrow_rows(tmp_path)] == ["op1", "op2"]
    assert not list(tmp_path.glob("*.part"))


@pytest.mark.parametrize("render", ["auto", "python"])
def test_ids_of_mixed_types_or_beyond_64_bits_are_written_as_given(
    tmp_path: Path, render: Literal["auto", "python"]
) -> None:
    ids: Iterator[int | str] = iter([1, "a", 2**70, -3])
    log = JsonLinesEventLog(tmp_path, buffer_lines=4, op_id=lambda op: next(ids), render=render)
    ended(log, 4)
    log.close()
    assert [x["id"] for x in strict_lines(tmp_path)] == [1, "a", 2**70, -3]
    assert log.lost_lines == 0


def test_a_batch_whose_rendering_raises_is_counted_lost(tmp_path: Path) -> None:
    def key(value: Any) -> str:
        if value == "bad":
            raise RuntimeError("cannot render this key")
        return str(value)

    log = JsonLinesEventLog(tmp_path, buffer_lines=1, key=key)
    ended(log, 1)
    op = FlagOperation(1.0, "bad key")
    watch(log, "p", op, ("bad",), 1.0)
    with pytest.raises(RuntimeError, match="cannot render"):
        log.record_end("p", op, "completed", 1.5)
    assert log.lost_lines == 1
    ended(log, 1, start=2)
    log.close()
    assert [x["watched_at"] for x in lines(tmp_path)] == [0.0, 2.0]


# -- watch records ----------------------------------------------------------------------------


def watched_then_ended(log: JsonLinesEventLog | ArrowEventLog) -> None:
    """Three watches (one with a deadline that is not watched_at + timeout), two ends, one
    operation left open at close."""
    a, b, c = FlagOperation(0.5, "a"), FlagOperation(0.25, "b"), FlagOperation(1.0, "c")
    log.record_watch("produce", a, ("t-0",), None, 1.0, 1.5)
    log.record_watch("produce", b, ("t-1",), (3,), 1.5, 1.875)  # a deadline given as is
    log.record_watch("fetch", c, ("t-2",), None, 2.0, 3.0)
    log.record_end("produce", b, "expired", 1.875)
    log.record_end("produce", a, "completed", 1.125)
    log.close()


@pytest.mark.parametrize("buffer_lines", [1, 2, 100])
def test_watch_records_come_before_each_end_in_both_formats(
    tmp_path: Path, buffer_lines: int
) -> None:
    """``watch_records=True``: a ``watched`` record (no end time) as each operation is
    watched, then its end record as without them; whatever the batches, the two formats say
    the same and a given deadline is on both of an operation's records."""
    json_log = JsonLinesEventLog(
        tmp_path / "json", watch_records=True, clock=None, buffer_lines=buffer_lines
    )
    watched_then_ended(json_log)
    arrow_log = ArrowEventLog(
        tmp_path / "arrow", watch_records=True, clock=None, buffer_lines=buffer_lines
    )
    watched_then_ended(arrow_log)
    said = [
        (line["id"], line["outcome"], line["deadline"], line["ended_at"])
        for line in strict_lines(tmp_path / "json")
    ]
    assert said == [
        (0, "watched", 1.5, None),
        (1, "watched", 1.875, None),
        (0, "watched", 3.0, None),
        (1, "expired", 1.875, 1.875),
        (0, "completed", 1.5, 1.125),
        (0, "open", 3.0, None),
    ]
    rows = arrow_rows(tmp_path / "arrow")
    assert [(int(r["id"]), r["outcome"], r["deadline"], r["ended_at"]) for r in rows] == said
    without = JsonLinesEventLog(tmp_path / "plain", clock=None, buffer_lines=buffer_lines)
    watched_then_ended(without)
    assert [line for line in strict_lines(tmp_path / "json") if line["outcome"] != "watched"] == (
        strict_lines(tmp_path / "plain")
    )


@pytest.mark.asyncio
async def test_a_live_purgatorys_watch_records_are_anchored_before_any_end(
    tmp_path: Path,
) -> None:
    """The first watch record checks the clock as a first end would: a file published while
    every operation still waits (a process about to be killed) is anchored to UTC."""
    log = JsonLinesEventLog(tmp_path, watch_records=True)
    p = DelayedOperationPurgatory[FlagOperation]("live", event_log=log)
    p.try_complete_else_watch(FlagOperation(30.0, "long"), ["k"])
    log.flush()
    anchor, line = every_line(tmp_path)
    assert log.anchor_error is None
    assert "anchor" in anchor
    assert (line["outcome"], line["ended_at"], line["timeout"]) == ("watched", None, 30.0)
    await p.shutdown()
    log.close()
    assert [x["outcome"] for x in lines(tmp_path)] == ["watched", "cancelled"]
