"""The load model's tests' shared trace: the validation's W1 workload, and a replay's gauges."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from purgatory.pipeline import W1
from purgatory.pipeline._generate import chunk_plan, generate_chunk


def w1_trace(rate: float, seconds: float = 1.5, purgatories: int = 1) -> pa.Table:
    """The validation's workload: 100 keys, 3 keys per operation, 200 ms timeouts."""
    w1 = W1(
        purgatories=purgatories,
        operations=int(rate * seconds),
        rate=rate,
        keys=100,
        keys_per_op=3,
        never=0.05,
        seed=7,
    )
    return pa.Table.from_batches([generate_chunk(w1, chunk) for chunk in chunk_plan(w1)])


def gauges(table: pa.Table) -> dict[str, dict[str, float]]:
    return {r["purgatory"]: r for r in table.filter(pc.is_null(table["op_id"])).to_pylist()}
