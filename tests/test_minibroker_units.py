"""The mini broker's sans-IO parts in one process: log, replication rules, delayed operations,
topic names, and the command line's help.

No sockets, no event loop: the purgatories run on a `ManualClock`, so the expirations and the
threshold triggers are exact. These pin down the Kafka rules the process tests rely on.
"""

from __future__ import annotations

import re

import pytest
from minibroker_support import batch

from examples.minibroker.__main__ import main
from examples.minibroker.log import BatchError, PartitionLog, parse_batches
from examples.minibroker.protocol import Errors
from examples.minibroker.purgatories import (
    DelayedFetch,
    DelayedProduce,
    FetchPartition,
    ProducePartition,
    trigger,
)
from examples.minibroker.replication import Partition
from examples.minibroker.topics import collision, invalid_name
from purgatory import DelayedOperationPurgatory
from purgatory.testing import ManualClock, check_invariants

KEY = ("t", 0)


class Events:
    """Records what a partition reports, as the leader's callbacks would."""

    def __init__(self) -> None:
        self.appends: list[int] = []
        self.high_watermarks: list[int] = []
        self.isr: list[str] = []

    def partition(self, *, lag: float = 1.0, min_insync: int = 2) -> Partition:
        return Partition(
            key=KEY,
            leader_id=0,
            follower_ids=(1, 2),
            min_insync=min_insync,
            lag_max=lag,
            on_append=lambda p: self.appends.append(p.log_end_offset),
            on_high_watermark=lambda p: self.high_watermarks.append(p.high_watermark),
            on_isr_change=lambda p, what: self.isr.append(what),
        )


def corrupt(data: bytes) -> bytes:
    """Flip a byte of the last record's value: the CRC no longer matches."""
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    return bytes(flipped)


def append(partition: Partition, *values: bytes) -> tuple[int, int]:
    return partition.append(parse_batches(batch(*values), 1 << 20))


def test_log_assigns_offsets_and_reads_whole_batches() -> None:
    log = PartitionLog()
    assert log.append(parse_batches(batch(b"a", b"b"), 1 << 20)) == (0, 1)
    assert log.append(parse_batches(batch(b"c"), 1 << 20)) == (2, 2)
    assert log.log_end_offset == 3
    first, second = len(batch(b"a", b"b")), len(batch(b"c"))
    assert len(log.read(0, 3, 1 << 20, at_least_one=True)) == first + second
    assert len(log.read(1, 3, 1 << 20, at_least_one=True)) == first + second  # whole batch
    assert len(log.read(2, 3, 1 << 20, at_least_one=True)) == second
    assert log.read(0, 2, 1 << 20, at_least_one=True) == log.read(0, 3, first, at_least_one=True)
    assert len(log.read(0, 3, 1, at_least_one=True)) == first  # KIP-74: one batch anyway
    assert log.read(0, 3, 1, at_least_one=False) == b""
    assert log.read(3, 3, 1 << 20, at_least_one=True) == b""
    assert log.bytes_between(0, 2) == first
    assert log.bytes_between(2, 2) == 0
    copy = PartitionLog()
    assert copy.append_replicated(log.read(0, 3, 1 << 20, at_least_one=True)) == 2
    assert copy.append_replicated(log.read(0, 3, 1 << 20, at_least_one=True)) == 0  # refetch
    assert copy.log_end_offset == 3


def test_log_finds_offsets_by_timestamp() -> None:
    log = PartitionLog()
    log.append(parse_batches(batch(b"a", timestamp=100), 1 << 20))
    log.append(parse_batches(batch(b"b", timestamp=200), 1 << 20))
    # Kafka's answer: the earliest record at or after the time asked, with its own timestamp.
    assert log.offset_for_timestamp(0) == (0, 100)
    assert log.offset_for_timestamp(100) == (0, 100)
    assert log.offset_for_timestamp(150) == (1, 200)
    assert log.offset_for_timestamp(201) is None


@pytest.mark.parametrize(
    ("records", "code"),
    [
        (None, Errors.CORRUPT_MESSAGE),
        (b"", Errors.CORRUPT_MESSAGE),
        (batch(b"x")[:-1], Errors.CORRUPT_MESSAGE),
        (corrupt(batch(b"some value")), Errors.CORRUPT_MESSAGE),
        (batch(b"x" * 100), Errors.MESSAGE_TOO_LARGE),
    ],
    ids=["none", "empty", "truncated", "bad-crc", "too-large"],
)
def test_parse_batches_refuses_with_kafkas_error(records: bytes | None, code: int) -> None:
    with pytest.raises(BatchError) as caught:
        parse_batches(records, 90)
    assert caught.value.code == code


def test_high_watermark_is_the_slowest_in_sync_log_end_and_only_moves_forward() -> None:
    events = Events()
    partition = events.partition()
    append(partition, b"a", b"b")
    assert events.appends == [2]
    assert partition.high_watermark == 0
    partition.follower_fetch(1, 2, now=0.1)
    assert partition.high_watermark == 0  # follower 2 has nothing yet
    partition.follower_fetch(2, 1, now=0.1)
    assert partition.high_watermark == 1
    partition.follower_fetch(2, 2, now=0.2)
    assert partition.high_watermark == 2
    assert events.high_watermarks == [1, 2]
    partition.follower_fetch(2, 0, now=0.3)  # restarted empty: the watermark stays
    assert partition.high_watermark == 2


def test_isr_shrinks_after_the_lag_time_and_a_follower_rejoins_at_the_high_watermark() -> None:
    events = Events()
    partition = events.partition(lag=1.0)
    append(partition, b"a")
    partition.follower_fetch(1, 1, now=0.5)
    partition.follower_fetch(2, 0, now=0.5)  # behind, last caught up at creation (0.0)
    partition.shrink_isr(now=1.0)
    assert partition.isr == {0, 1, 2}  # not yet: 1.0 - 0.0 is not over the lag
    partition.shrink_isr(now=1.01)
    assert partition.isr == {0, 1}
    assert partition.high_watermark == 1  # the laggard no longer holds it back
    assert events.isr == ["replica 2 left the ISR of ('t', 0)"]
    partition.shrink_isr(now=5.0)
    assert partition.isr == {0, 1}  # follower 1 is at the log end: never out of sync
    partition.follower_fetch(2, 1, now=5.1)
    assert partition.isr == {0, 1, 2}
    assert events.isr[-1] == "replica 2 rejoined the ISR of ('t', 0)"


def test_delayed_produce_answers_as_kafka_documents() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[DelayedProduce]("produce", clock=clock)
    events = Events()
    partition = events.partition(min_insync=2)
    first, last = append(partition, b"a")
    ok = DelayedProduce(5.0, {KEY: ProducePartition(partition, first, last + 1)})
    assert not purgatory.try_complete_else_watch(ok, {KEY: last + 1})
    partition.follower_fetch(1, 1, now=0.0)
    partition.follower_fetch(2, 1, now=0.0)
    trigger(purgatory, KEY, partition.high_watermark)
    assert ok.is_completed
    assert ok.on_complete()[KEY].error_code == Errors.NONE

    first, last = append(partition, b"b")
    shrunk = DelayedProduce(5.0, {KEY: ProducePartition(partition, first, last + 1)})
    assert not purgatory.try_complete_else_watch(shrunk, {KEY: last + 1})
    partition.shrink_isr(now=10.0)  # both followers behind for too long: the ISR is {0}
    trigger(purgatory, KEY, partition.high_watermark)
    assert shrunk.is_completed
    assert shrunk.partitions[KEY].error_code == Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND

    partition.isr.add(1)  # in sync on paper (behind), and it never fetches again
    first, last = append(partition, b"c")
    late = DelayedProduce(0.5, {KEY: ProducePartition(partition, first, last + 1)})
    assert not purgatory.try_complete_else_watch(late, {KEY: last + 1})
    clock.advance(0.5)
    assert late.is_expired
    assert late.partitions[KEY].error_code == Errors.REQUEST_TIMED_OUT
    purgatory.purge()
    check_invariants(purgatory)
    assert purgatory.watched() == purgatory.num_delayed() == 0


class CountingFetch(DelayedFetch):
    """A DelayedFetch that counts its attempts."""

    __slots__ = ("attempts",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.attempts = 0

    def try_complete(self) -> bool:
        self.attempts += 1
        return super().try_complete()


def test_a_trigger_re_tries_only_the_operations_whose_threshold_was_reached() -> None:
    clock = ManualClock()
    purgatory = DelayedOperationPurgatory[DelayedFetch]("fetch", clock=clock)
    partition = Events().partition(min_insync=1)
    partition.isr = {0}  # leader alone: every append moves the high watermark
    append(partition, b"a")  # offset 0; high watermark 1

    def high_watermark(p: Partition) -> int:
        return p.high_watermark

    near = CountingFetch(9.0, [FetchPartition(KEY, partition, 1, 1 << 20)], 1, high_watermark)
    far = CountingFetch(9.0, [FetchPartition(KEY, partition, 50, 1 << 20)], 1, high_watermark)
    assert not purgatory.try_complete_else_watch(near, {KEY: 2})
    assert not purgatory.try_complete_else_watch(far, {KEY: 51})
    tries_far = far.attempts
    append(partition, b"b")  # high watermark 2
    assert trigger(purgatory, KEY, partition.high_watermark) == 1
    assert near.is_completed
    assert far.attempts == tries_far  # not re-tried: its offset is far beyond
    check_invariants(purgatory)


@pytest.mark.parametrize(
    "name", [".", "..", "../x", "bad name", "t" * 250, "", "a/b", "caf\u00e9", "tab\t"]
)
def test_topic_names_kafka_refuses(name: str) -> None:
    assert invalid_name(name) is not None


@pytest.mark.parametrize("name", ["t", "...", "a.b_c-D9", "t" * 249, "__consumer_offsets"])
def test_topic_names_kafka_takes(name: str) -> None:
    assert invalid_name(name) is None


def test_topic_names_that_differ_only_by_dot_and_underscore_collide() -> None:
    assert collision("a_b", ["a.b", "c"]) == "Topic 'a_b' collides with existing topic: a.b"
    assert collision("a.b", ["a.b"]) is None  # the same topic: it exists, it does not collide
    assert collision("a-b", ["a.b", "a_b"]) is None


def test_the_command_line_help_keeps_its_layout_and_shows_defaults(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    # The description's command examples keep their own lines (argparse would reflow them).
    assert (
        "\n    python -m examples.minibroker serve --port 9092   # leader + 2 followers; "
        "Ctrl-C stops\n    python -m examples.minibroker demo "
    ) in top
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    serve = " ".join(capsys.readouterr().out.split())
    for option, default in [
        ("--port PORT", "9092"),
        ("--followers N", "2"),
        ("--topics NAME:N,...", "demo:4"),
        ("--min-insync-replicas N", "2"),
        ("--replica-lag-time-max-ms MS", "1000"),
        ("--num-partitions N", "4"),
        ("--group-initial-rebalance-delay-ms MS", "200"),
        ("--group-min-session-timeout-ms MS", "500"),
        ("--metrics-port PORT", "9464"),
    ]:
        assert re.search(rf"{re.escape(option)} [^-]*\(default: {re.escape(default)}[;)]", serve), (
            option
        )
