"""`JsonLinesEventLog`: one whole JSON line per operation, at its end; rotation; open operations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import FlagOperation

from purgatory import JsonLinesEventLog
from purgatory._events import EventLog


def lines(directory: Path) -> list[dict[str, Any]]:
    """Every line of every complete file, in file order."""
    out: list[dict[str, Any]] = []
    for path in sorted(directory.glob("*.jsonl")):
        text = path.read_text()
        assert text.endswith("\n"), f"{path} does not end with a whole line"
        out.extend(json.loads(line) for line in text.splitlines())
    return out


def watch(
    log: JsonLinesEventLog, name: str, op: FlagOperation, keys: tuple[Any, ...], at: float
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
        "v": 1,
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
