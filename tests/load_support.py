"""The load model's tests' shared trace (the validation's W1 workload), cost profile, and a
replay's gauges."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from purgatory.pipeline import W1
from purgatory.pipeline._generate import chunk_plan, generate_chunk

if TYPE_CHECKING:
    from purgatory.pipeline._load import CostProfile

US = 1e-6
MS = 1e-3


def base_profile() -> CostProfile:
    """Costs of the order the validation's calibration measures (a W1 arrival about 15 us of CPU
    with its application work), with a wake-up's latency. Made per test module: a module's
    ``[python]`` twin imports the pipeline anew, and a profile compares equal only to one of
    its own class."""
    from purgatory.pipeline._load import CostProfile

    return CostProfile(
        dispatch=1 * US,
        wake=25 * US,
        watch=0.6 * US,
        watch_key=0.1 * US,
        attempt=0.05 * US,
        completion=0.4 * US,
        expiry=0.4 * US,
        timer_pass=14 * US,
        purged_entry=0.05 * US,
        application=12 * US,
        iteration=0.4 * US,
        wake_resolution=MS,
        wake_latency=(0, 40e-6, 60e-6, 90e-6, 120e-6, 160e-6, 190e-6, 240e-6, 300e-6, 500e-6, 1e-3),
    )


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
