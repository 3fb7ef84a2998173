"""The replay engine alone (`purgatory.pipeline._replay`, no Spark): its input conversion."""

from __future__ import annotations

import pyarrow as pa
import pytest

from purgatory.pipeline import ReplayConfig, replay_table
from purgatory.pipeline._replay import _key_tuples

ROWS = [["a", "b", "c"], ["b", "c", "d"], ["a", "d", "e"], ["c", "a", "b"]]


@pytest.mark.parametrize(
    "rows",
    [ROWS, [["a"], ["b", "c"], ["a", "b", "c", "d"], ["d"]], [["only"]], [["x", "y"]]],
    ids=["fixed", "varying", "one-row-one-key", "one-row"],
)
@pytest.mark.parametrize("sliced", [False, True])
def test_key_tuples_are_the_rows_keys_with_one_object_per_key(
    rows: list[list[str]], sliced: bool
) -> None:
    column = pa.array([["pad", "ding"], *rows, ["tail"]], pa.list_(pa.string()))
    column = column.slice(1, len(rows)) if sliced else pa.array(rows, pa.list_(pa.string()))
    words: dict[str, str] = {}
    tuples = _key_tuples(column, words)
    assert tuples == [tuple(row) for row in rows]
    assert {type(t) for t in tuples} == {tuple}
    shared = {id(words[key]) for row in tuples for key in row}
    assert shared == {id(key) for row in tuples for key in row}  # the same object per key
    again = _key_tuples(column, words)
    assert {id(key) for row in again for key in row} == shared  # across batches too


def test_replay_of_varying_key_counts() -> None:
    trace = pa.table(
        {
            "purgatory": ["p"] * 3,
            "op_id": pa.array([1, 2, 3], pa.int64()),
            "arrival": [0.0, 0.001, 0.002],
            "keys": pa.array([["a"], ["a", "b"], ["b", "c", "a"]], pa.list_(pa.string())),
            "timeout": [0.1, 0.1, 0.1],
            "condition_at": pa.array([0.05, None, 0.01], pa.float64()),
        }
    )
    out = replay_table(trace, {0: ReplayConfig()}, check=True)
    outcomes = {row["op_id"]: row["outcome"] for row in out.to_pylist() if row["op_id"]}
    assert outcomes == {1: "completed", 2: "expired", 3: "completed"}
