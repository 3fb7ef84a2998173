"""A consumer-group member in a process of its own, so that the demo (or a test) can kill it.

``python -m examples.minibroker member --bootstrap HOST:PORT --group G --topic T`` runs aiokafka's
quick-start consumer (a group id and a subscription, offsets committed automatically) and prints
one line ``assigned P,Q,...`` each time its assignment changes, and ``read N`` as it consumes.
A SIGKILL leaves no LeaveGroup behind: the coordinator notices only when the member's session
(its `DelayedHeartbeat`) expires.
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer

__all__ = ("run_member",)


async def run_member(
    bootstrap: str, group: str, topic: str, *, session_timeout_ms: int, heartbeat_interval_ms: int
) -> None:
    """Consume `topic` in `group` until cancelled, printing each new assignment."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=500,
        session_timeout_ms=session_timeout_ms,
        heartbeat_interval_ms=heartbeat_interval_ms,
        fetch_max_wait_ms=200,
    )
    await consumer.start()
    shown: list[int] | None = None
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            assigned = sorted(tp.partition for tp in consumer.assignment())
            if assigned != shown:
                shown = assigned
                print("assigned " + ",".join(map(str, assigned)), flush=True)
            count = sum(len(records) for records in batches.values())
            if count:
                print(f"read {count}", flush=True)
    finally:
        await consumer.stop()
