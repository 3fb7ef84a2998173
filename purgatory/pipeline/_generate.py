"""The W1 trace generator (Kafka's ``TestPurgatoryPerformance`` model), chunk by chunk.

Pure numpy and pyarrow: the Spark job maps `generate_chunk` over a table of chunks, one task
each, and a test can call it directly.

A purgatory's Poisson arrivals are cut into chunks of a fixed number of operations so that
chunks are independent work: the time from a chunk's start to its last arrival is the sum of
`count` exponential gaps, a Gamma(count, 1/rate) variable, drawn on the driver (`chunk_plan`);
given that span, the chunk's other arrivals are uniform order statistics inside it, which is
exactly a Poisson process conditioned on its `count`-th arrival. Every draw is seeded by
(seed, purgatory index, chunk index), so a trace is the same on any cluster and partitioning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa

__all__ = ("TRACE_SCHEMA", "W1", "chunk_plan", "generate_chunk")

#: Trace schema version 1 (docs/pipeline-schemas.md).
TRACE_SCHEMA: Final = pa.schema(
    [
        pa.field("purgatory", pa.string(), nullable=False),
        pa.field("op_id", pa.int64(), nullable=False),
        pa.field("arrival", pa.float64(), nullable=False),
        pa.field("keys", pa.list_(pa.string()), nullable=False),
        pa.field("timeout", pa.float64(), nullable=False),
        pa.field("condition_at", pa.float64()),
    ]
)


@dataclass(frozen=True, slots=True)
class W1:
    """The W1 workload's parameters (Kafka's TestPurgatoryPerformance), per purgatory.

    Attributes:
        purgatories: How many purgatories (``p0000``, ``p0001``, ...).
        operations: Operations per purgatory.
        rate: Poisson arrival rate per purgatory (operations per second).
        timeout: Every operation's timeout in seconds.
        p50: Median completion latency (seconds).
        p75: 75th percentile of the completion latency (seconds), > p50.
        keys: Size of each purgatory's key space (``k0`` .. ``k<keys-1>``).
        keys_per_op: Distinct keys per operation.
        key_skew: Zipf exponent of key popularity (0: uniform).
        never: Share of operations whose condition never becomes true (null condition).
        seed: The seed of every draw.
        chunk: Operations per generation task.
    """

    purgatories: int = 4
    operations: int = 100_000
    rate: float = 1000.0
    timeout: float = 0.2
    p50: float = 0.02
    p75: float = 0.06
    keys: int = 100
    keys_per_op: int = 3
    key_skew: float = 0.0
    never: float = 0.0
    seed: int = 1
    chunk: int = 200_000

    def __post_init__(self) -> None:
        if self.purgatories < 1 or self.operations < 1 or self.chunk < 1:
            raise ValueError("purgatories, operations and chunk must be >= 1")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a finite number > 0, got {self.rate!r}")
        if not (self.timeout >= 0 and math.isfinite(self.timeout)):
            raise ValueError(f"timeout must be a finite number >= 0, got {self.timeout!r}")
        if not 0 < self.p50 < self.p75:
            raise ValueError(f"need 0 < p50 < p75, got p50={self.p50!r} p75={self.p75!r}")
        if not 1 <= self.keys_per_op <= self.keys:
            raise ValueError(f"need 1 <= keys_per_op <= keys, got {self.keys_per_op}/{self.keys}")
        if not 0 <= self.never <= 1:
            raise ValueError(f"never must be a share in [0, 1], got {self.never!r}")
        if self.key_skew < 0:
            raise ValueError(f"key_skew must be >= 0, got {self.key_skew!r}")


Chunk = tuple[int, int, int, int, float, float]


def chunk_plan(w1: W1) -> list[Chunk]:
    """The generation tasks: (purgatory index, chunk index, first op_id, count, start, span)."""
    plan = []
    for p in range(w1.purgatories):
        rng = np.random.default_rng([w1.seed, p, 0xC4])
        start = 0.0
        for c, first in enumerate(range(0, w1.operations, w1.chunk)):
            count = min(w1.chunk, w1.operations - first)
            span = float(rng.gamma(count, 1.0 / w1.rate))
            plan.append((p, c, first, count, start, span))
            start += span
    return plan


def generate_chunk(w1: W1, chunk: Chunk) -> pa.RecordBatch:
    """The trace rows of one `chunk_plan` entry, in arrival order (`TRACE_SCHEMA`)."""
    p, c, first, count, start, span = chunk
    rng = np.random.default_rng([w1.seed, p, c + 1])
    gaps = np.sort(rng.random(count - 1)) * span
    arrivals = start + np.concatenate([gaps, [span]])
    mu = math.log(w1.p50)
    sigma = (math.log(w1.p75) - mu) / 0.67449
    latency = np.exp(rng.normal(mu, sigma, count))
    condition = arrivals + latency
    never = rng.random(count) < w1.never if w1.never else np.zeros(count, dtype=bool)
    keys = _draw_keys(rng, w1, count)
    names = pa.array([f"k{i}" for i in range(w1.keys)], pa.string())
    flat = names.take(pa.array(keys.ravel()))
    offsets = pa.array(np.arange(0, count * w1.keys_per_op + 1, w1.keys_per_op, dtype=np.int32))
    return pa.RecordBatch.from_arrays(
        [
            pa.array([f"p{p:04d}"] * count, pa.string()),
            pa.array(np.arange(first, first + count, dtype=np.int64)),
            pa.array(arrivals),
            pa.ListArray.from_arrays(offsets, flat),
            pa.array(np.full(count, w1.timeout)),
            pa.array(condition, mask=never),
        ],
        schema=TRACE_SCHEMA,
    )


def _draw_keys(rng: np.random.Generator, w1: W1, count: int) -> np.ndarray:
    """`count` rows of `keys_per_op` distinct key indices drawn by popularity."""
    shape = (count, w1.keys_per_op)
    if w1.key_skew == 0:
        probs = None
    else:
        weights = 1.0 / np.arange(1, w1.keys + 1) ** w1.key_skew
        probs = weights / weights.sum()
    keys = rng.choice(w1.keys, size=shape, p=probs)
    for _ in range(1000):
        ordered = np.sort(keys, axis=1)
        bad = np.nonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))[0]
        if not len(bad):
            return keys
        keys[bad] = rng.choice(w1.keys, size=(len(bad), w1.keys_per_op), p=probs)
    raise ValueError(
        f"could not draw {w1.keys_per_op} distinct keys per operation out of {w1.keys} with "
        f"key_skew={w1.key_skew}: lower the skew or the keys per operation"
    )
