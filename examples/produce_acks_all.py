"""Produce requests with ``acks=all``: each waits until every in-sync replica has its record.

A toy partition leader appends records and answers producers only once the followers have
fetched past the record (the high watermark), or with a timeout error after ``request_timeout``.
One follower is slow, so some requests expire. This is Kafka's ``DelayedProduce`` in miniature:
the produce handler parks the request in a purgatory keyed by partition, and each follower fetch
that moves the high watermark calls ``check_and_complete(partition)``.

Run: ``python examples/produce_acks_all.py [--requests N] [--uvloop]``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import dataclass, field

from purgatory import DelayedOperation, DelayedOperationPurgatory


@dataclass(eq=False)
class Partition:
    """A leader's log and what each in-sync follower has fetched."""

    name: str
    replicas: tuple[str, ...]
    log_end: int = 0
    fetched: dict[str, int] = field(default_factory=dict)

    def append(self) -> int:
        """Append one record; return its offset."""
        self.log_end += 1
        return self.log_end - 1

    @property
    def high_watermark(self) -> int:
        """The first offset not yet on every in-sync replica."""
        return min(self.fetched.get(replica, 0) for replica in self.replicas)


class DelayedProduce(DelayedOperation[str]):
    """Answers once the high watermark passes the record, or with a timeout error."""

    def __init__(self, partition: Partition, offset: int, timeout: float) -> None:
        super().__init__(timeout)
        self.partition = partition
        self.offset = offset

    def try_complete(self) -> bool:
        if self.partition.high_watermark > self.offset:
            return self.force_complete()
        return False

    def on_complete(self) -> str:
        # On expiry, is_expired is already True when on_complete runs.
        return "REQUEST_TIMED_OUT" if self.is_expired else "NONE"

    def on_expiration(self) -> None:
        pass  # a broker would bump a metric here


async def follower(
    name: str,
    *,
    partitions: list[Partition],
    purgatory: DelayedOperationPurgatory[DelayedProduce],
    delay: tuple[float, float],
    rng: random.Random,
    stop: asyncio.Event,
) -> None:
    """Fetch from the leader in a loop; every fetch may move a high watermark."""
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(*delay))
        for partition in partitions:
            if partition.fetched.get(name, 0) < partition.log_end:
                partition.fetched[name] = partition.log_end
                purgatory.check_and_complete(partition.name)


async def produce(
    partition: Partition, purgatory: DelayedOperationPurgatory[DelayedProduce], timeout: float
) -> str:
    """The produce handler: append, then park the request until acks=all holds."""
    offset = partition.append()
    return await purgatory.watch(DelayedProduce(partition, offset, timeout), [partition.name])


async def main(requests: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    replicas = ("leader", "fast", "slow")
    partitions = [Partition(f"orders-{i}", replicas) for i in range(4)]
    for partition in partitions:
        partition.fetched["leader"] = 0
    stop = asyncio.Event()
    async with DelayedOperationPurgatory[DelayedProduce]("produce") as purgatory:

        async def leader_self_fetch() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.001)
                for partition in partitions:
                    partition.fetched["leader"] = partition.log_end

        # Each follower fetches after a random delay in its range (seconds).
        follower_delays = {"fast": (0.001, 0.005), "slow": (0.02, 0.15)}
        fetchers = [asyncio.create_task(leader_self_fetch())]
        fetchers += [
            asyncio.create_task(
                follower(
                    name,
                    partitions=partitions,
                    purgatory=purgatory,
                    delay=delay,
                    rng=rng,
                    stop=stop,
                )
            )
            for name, delay in follower_delays.items()
        ]
        outcomes: dict[str, int] = {}
        handlers = []
        for _ in range(requests):
            await asyncio.sleep(rng.expovariate(2000))
            handlers.append(asyncio.create_task(produce(rng.choice(partitions), purgatory, 0.1)))
        for error in await asyncio.gather(*handlers):
            outcomes[error] = outcomes.get(error, 0) + 1
        stats = purgatory.statistics()
        stop.set()
        await asyncio.gather(*fetchers)
    print(f"{requests} produce requests with acks=all, request timeout 100 ms")
    for error, count in sorted(outcomes.items()):
        print(f"  {error:<18} {count}")
    print(f"  completed by the followers: {stats.completed}, expired: {stats.expired}")
    return outcomes


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(main(args.requests, args.seed))
    else:
        asyncio.run(main(args.requests, args.seed))
