"""Which partition replays which group: balanced by operation count, placed exactly.

A replay's groups are independent and each runs whole in one task, so the job is as fast as its
busiest task. Hash partitioning of a handful of groups into as many partitions as cores leaves
some partitions with twice the work of others (8 groups hashed into 2 partitions are rarely
4/4), and adaptive execution may coalesce small partitions into one task. Here the driver
assigns the groups itself (`assign`: longest processing time first, by operation count), and
`partition_keys` gives, for each partition, an integer that Spark's hash partitioning sends to
exactly that partition, so that ``repartition(n, key)`` places every group where it was
assigned. An explicit partition count is not coalesced by adaptive execution.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Mapping
from typing import Final, TypeVar

__all__ = ("assign", "murmur3_int", "partition_keys")

K = TypeVar("K", bound=Hashable)

#: The seed of Spark's ``hash`` function and of its hash partitioning (``Murmur3Hash``).
SPARK_HASH_SEED: Final = 42
_MASK: Final = 0xFFFFFFFF


def assign(weights: Mapping[K, int], partitions: int) -> dict[K, int]:
    """Each item's partition in ``range(partitions)``, by longest processing time first.

    Items are taken heaviest first (ties in the order of their ``repr``, so the same input
    always gives the same plan) and each goes to the partition with the least weight so far
    (ties: the lowest partition). The busiest partition is then within 4/3 of the best possible
    (Graham's bound), and equal weights are dealt out evenly: 8 equal groups over 2 partitions
    are 4/4.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, not {partitions}")
    loads = [(0, p) for p in range(partitions)]
    plan: dict[K, int] = {}
    for item in sorted(weights, key=lambda k: (-weights[k], repr(k))):
        load, p = heapq.heappop(loads)
        plan[item] = p
        heapq.heappush(loads, (load + weights[item], p))
    return plan


def murmur3_int(value: int, seed: int = SPARK_HASH_SEED) -> int:
    """Spark's ``hash`` of a 32-bit integer (``Murmur3_x86_32.hashInt``), a signed 32-bit int."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & _MASK

    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4  # the input's length in bytes
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def partition_keys(partitions: int) -> list[int]:
    """For each partition p, the smallest int ``k >= 0`` that ``repartition(partitions, k)``
    (an ``int`` column) sends to partition p: Spark's hash partitioning puts a row in
    ``pmod(hash(k), partitions)``."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, not {partitions}")
    keys: dict[int, int] = {}
    k = 0
    while len(keys) < partitions:
        keys.setdefault(murmur3_int(k) % partitions, k)  # Python's % is pmod for n > 0
        k += 1
    return [keys[p] for p in range(partitions)]
