"""The idea alone: park an operation until a condition holds or its deadline passes.

Run: ``python examples/minimal.py``. No server, no dependency: one purgatory, two operations;
a trigger completes the first, the timer expires the second.
"""

from __future__ import annotations

import asyncio

from purgatory import DelayedOperation, DelayedOperationPurgatory


class WaitForData(DelayedOperation[bytes]):
    """Completes once `box` holds data; on expiry, answers with what is there (nothing)."""

    def __init__(self, box: list[bytes], timeout: float) -> None:
        super().__init__(timeout)
        self.box = box

    def try_complete(self) -> bool:  # at watch time, then on each trigger of a watched key
        return self.force_complete() if self.box else False

    def on_complete(self) -> bytes:  # exactly once: condition met or deadline passed
        return b"".join(self.box)


async def main() -> None:
    hello: list[bytes] = []
    # purge_interval=0: finished operations leave the watcher lists at once (Kafka batches 1000).
    async with DelayedOperationPurgatory[WaitForData]("minimal", purge_interval=0) as purgatory:
        fast, slow = WaitForData(hello, timeout=5.0), WaitForData([], timeout=0.05)
        first = asyncio.create_task(purgatory.watch(fast, ["hello"]))
        second = asyncio.create_task(purgatory.watch(slow, ["quiet"]))
        await asyncio.sleep(0)  # both tasks run up to their wait: the operations are parked
        print(f"parked: watched={purgatory.watched()} delayed={purgatory.num_delayed()}")

        hello.append(b"hello")
        purgatory.check_and_complete("hello")  # the trigger: re-try what watches the key
        print(f"completed by trigger: {await first!r} expired={fast.is_expired}")
        print(f"completed by expiry: {await second!r} expired={slow.is_expired}")
        print(f"at rest: watched={purgatory.watched()} delayed={purgatory.num_delayed()}")


if __name__ == "__main__":
    asyncio.run(main())
