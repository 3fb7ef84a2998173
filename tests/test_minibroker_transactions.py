"""Transactions are refused at once, by each of the three clients, with a message.

The broker has no transaction coordinator. Had it answered the retriable
``COORDINATOR_NOT_AVAILABLE``, each client would retry for its whole timeout (20 s here, a minute
or more by default) and the broker would log nothing; it answers
``TRANSACTIONAL_ID_AUTHORIZATION_FAILED``, the one error all three treat as final, and logs one
warning per transactional id. Each client's own transaction call, with a 20 s timeout, must
raise that error (a hang would end in a timeout error instead).
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import aiokafka.errors
import kafka.errors
import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as ConfluentProducer
from kafka import KafkaProducer
from minibroker_support import run

from examples.minibroker.cluster import Cluster, ClusterConfig

ALONE = ClusterConfig(followers=0, min_insync_replicas=1)
TIMEOUT_MS = 20_000
MESSAGE = "transactions are not supported by this broker (minibroker)"


def kafka_python_init(bootstrap: str, transactional_id: str) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=transactional_id,
        max_block_ms=TIMEOUT_MS,
        request_timeout_ms=TIMEOUT_MS,
    )
    try:
        with pytest.raises(kafka.errors.TransactionalIdAuthorizationFailedError):
            producer.init_transactions()
    finally:
        producer.close(timeout=5)


async def aiokafka_start(bootstrap: str, transactional_id: str) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=transactional_id,
        request_timeout_ms=TIMEOUT_MS,
    )
    try:
        with pytest.raises(aiokafka.errors.TransactionalIdAuthorizationFailed):
            await producer.start()  # starting a transactional producer initialises it
    finally:
        await producer.stop()


def confluent_init(bootstrap: str, transactional_id: str) -> KafkaError:
    producer = ConfluentProducer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id}
    )
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(TIMEOUT_MS / 1000)
    error: KafkaError = raised.value.args[0]
    return error


def test_each_client_is_refused_a_transaction_at_once_with_one_warning_per_id() -> None:
    async def main(log: Any) -> None:
        async with Cluster(ALONE, start_followers=False, log=log) as cluster:
            bootstrap = cluster.bootstrap
            for _ in range(2):  # a second attempt with the same id is not logged again
                await asyncio.to_thread(kafka_python_init, bootstrap, "tx-kafka-python")
            await aiokafka_start(bootstrap, "tx-aiokafka")
            error = await asyncio.to_thread(confluent_init, bootstrap, "tx-confluent")
            assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert error.fatal()
            assert MESSAGE in error.str()  # librdkafka shows the broker's message

    with tempfile.TemporaryFile() as log:
        run(lambda: main(log), timeout=90)
        log.seek(0)
        lines = log.read().decode().splitlines()
    refused = [line for line in lines if "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in line]
    assert len(refused) == 3, lines
    for line, transactional_id in zip(
        refused, ["tx-kafka-python", "tx-aiokafka", "tx-confluent"], strict=True
    ):
        assert " leader WARNING minibroker.apis: " in line
        assert f"for transactional id {transactional_id!r}: " in line
        assert MESSAGE in line
