"""A consumer-group member in a process of its own, so that the demo (or a test) can kill it.

``python -m examples.minibroker member --bootstrap HOST:PORT --group G --topic T`` runs a
client's quick-start consumer (a group id and a subscription, offsets committed automatically)
and prints one line ``assigned P,Q,...`` each time its assignment changes, and ``read N`` as it
consumes. ``--client`` picks aiokafka (the default), kafka-python or confluent-kafka. A SIGKILL
leaves no LeaveGroup behind: the coordinator notices only when the member's session (its
`DelayedHeartbeat`) expires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ("CLIENTS", "MemberConfig", "run_member")


@dataclass(frozen=True)
class MemberConfig:
    bootstrap: str
    group: str
    topic: str
    session_timeout_ms: int = 2000
    heartbeat_interval_ms: int = 300

    def consumer_settings(self) -> dict[str, Any]:
        """The quick-start consumer's settings, by the names aiokafka and kafka-python share."""
        return {
            "bootstrap_servers": self.bootstrap,
            "group_id": self.group,
            "auto_offset_reset": "earliest",
            "auto_commit_interval_ms": 500,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "fetch_max_wait_ms": 200,
        }


class _Reporter:
    """Prints the assignment when it changes, and how many records each poll read."""

    def __init__(self) -> None:
        self._shown: list[int] | None = None

    def __call__(self, assigned: list[int], read: int) -> None:
        assigned = sorted(assigned)
        if assigned != self._shown:
            self._shown = assigned
            print("assigned " + ",".join(map(str, assigned)), flush=True)
        if read:
            print(f"read {read}", flush=True)


def _aiokafka(config: MemberConfig) -> None:
    asyncio.run(_aiokafka_main(config))


async def _aiokafka_main(config: MemberConfig) -> None:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(config.topic, **config.consumer_settings())
    report = _Reporter()
    await consumer.start()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=200)
            read = sum(len(records) for records in batches.values())
            report([tp.partition for tp in consumer.assignment()], read)
    finally:
        await consumer.stop()


def _kafka_python(config: MemberConfig) -> None:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(config.topic, **config.consumer_settings())
    report = _Reporter()
    try:
        while True:
            batches = consumer.poll(timeout_ms=200)
            read = sum(len(records) for records in batches.values())
            report([tp.partition for tp in consumer.assignment()], read)
    finally:
        consumer.close()


def _confluent_kafka(config: MemberConfig) -> None:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": config.bootstrap,
            "group.id": config.group,
            "auto.offset.reset": "earliest",
            "auto.commit.interval.ms": 500,
            "session.timeout.ms": config.session_timeout_ms,
            "heartbeat.interval.ms": config.heartbeat_interval_ms,
            "fetch.wait.max.ms": 200,
        }
    )
    report = _Reporter()
    consumer.subscribe([config.topic])
    try:
        while True:
            message = consumer.poll(0.2)
            read = int(message is not None and message.error() is None)
            report([tp.partition for tp in consumer.assignment()], read)
    finally:
        consumer.close()


#: The clients a member can run, by their package's name.
CLIENTS: dict[str, Callable[[MemberConfig], None]] = {
    "aiokafka": _aiokafka,
    "kafka-python": _kafka_python,
    "confluent-kafka": _confluent_kafka,
}


def run_member(client: str, config: MemberConfig) -> None:
    """Consume in `config`'s group with `client` until killed, printing each new assignment."""
    CLIENTS[client](config)
