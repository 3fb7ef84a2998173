"""A partition's log: record batches (v2) in memory, offsets assigned by the leader.

Batches are kept as the producer sent them, with one change made the way Kafka's leader makes it:
the batch's base offset (its first 8 bytes, outside the CRC) is overwritten with the offset the
log assigns. Fetches return whole batches, starting with the one that holds the fetch offset
(clients skip the records before their position, as they do with Kafka). Parsing and checking
batches (magic, CRC, sizes) is kafka-python's ``kafka.record``; nothing here decodes records.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import Any

from kafka.record.default_records import DefaultRecordBatch
from kafka.record.memory_records import MemoryRecords

from .protocol import Errors

__all__ = ("BatchError", "PartitionLog", "parse_batches")

_BASE_OFFSET = struct.Struct(">q")


class BatchError(Exception):
    """A produce payload the log refuses; ``code`` is the Kafka error to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_batches(records: Any, max_batch_bytes: int) -> list[bytearray]:
    """Split a produce payload into checked v2 batches, each as its own mutable copy.

    Raises:
        BatchError: ``CORRUPT_MESSAGE`` for a bad CRC, a truncated or empty payload;
            ``UNSUPPORTED_FOR_MESSAGE_FORMAT`` for magic 0/1; ``MESSAGE_TOO_LARGE`` for a batch
            over `max_batch_bytes`.
    """
    if records is None:
        raise BatchError(Errors.CORRUPT_MESSAGE, "no records")
    data = bytes(records)
    if not data:
        raise BatchError(Errors.CORRUPT_MESSAGE, "empty record set")
    memory = MemoryRecords(data)
    batches: list[bytearray] = []
    try:
        while memory.has_next():
            batch = memory.next_batch()
            if not isinstance(batch, DefaultRecordBatch):
                raise BatchError(
                    Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT, "only record batches v2 (magic 2)"
                )
            if batch.size_in_bytes > max_batch_bytes:
                raise BatchError(Errors.MESSAGE_TOO_LARGE, "batch over max.message.bytes")
            if batch.records_count < 1 or batch.last_offset_delta < 0:
                raise BatchError(Errors.CORRUPT_MESSAGE, "batch without records")
            if not batch.validate_crc():
                raise BatchError(Errors.CORRUPT_MESSAGE, "record batch CRC mismatch")
            batches.append(bytearray(batch._buffer))
    except BatchError:
        raise
    except Exception as exc:  # whatever kafka.record rejects is corrupt
        raise BatchError(Errors.CORRUPT_MESSAGE, f"unreadable record batch: {exc!r}") from exc
    if memory.valid_bytes() != len(data) or not batches:
        raise BatchError(Errors.CORRUPT_MESSAGE, "truncated record batch")
    return batches


@dataclass(eq=False)
class PartitionLog:
    """The batches of one partition, in offset order."""

    _batches: list[bytes] = field(default_factory=list)
    _last_offsets: list[int] = field(default_factory=list)
    log_end_offset: int = 0
    """The offset the next record gets (Kafka's LEO)."""

    def append(self, batches: list[bytearray]) -> tuple[int, int]:
        """Give `batches` their offsets and append them; return (first, last) offset written."""
        first = self.log_end_offset
        for batch in batches:
            parsed = DefaultRecordBatch(batch)
            _BASE_OFFSET.pack_into(batch, 0, self.log_end_offset)
            last = self.log_end_offset + parsed.last_offset_delta
            self._batches.append(bytes(batch))
            self._last_offsets.append(last)
            self.log_end_offset = last + 1
        return first, self.log_end_offset - 1

    def append_replicated(self, data: bytes) -> int:
        """A follower's append of batches the leader already numbered; return how many."""
        count = 0
        memory = MemoryRecords(data)
        while memory.has_next():
            batch = memory.next_batch()
            if batch.base_offset < self.log_end_offset:
                continue  # already have it (a re-fetch after a timeout)
            self._batches.append(bytes(batch._buffer))
            self._last_offsets.append(batch.last_offset)
            self.log_end_offset = batch.last_offset + 1
            count += 1
        return count

    def read(self, offset: int, upto: int, max_bytes: int, *, at_least_one: bool) -> bytes:
        """The batches holding offsets in [offset, upto), up to `max_bytes`.

        With `at_least_one`, the first batch is returned even when it is larger than
        `max_bytes` (KIP-74), so a consumer never stalls on a big batch.
        """
        if offset >= upto:
            return b""
        index = bisect.bisect_left(self._last_offsets, offset)
        out: list[bytes] = []
        size = 0
        while index < len(self._batches):
            batch = self._batches[index]
            base = _BASE_OFFSET.unpack_from(batch, 0)[0]
            if base >= upto:
                break
            if self._last_offsets[index] >= upto:
                break  # never hand out part of a batch beyond the limit
            if size + len(batch) > max_bytes and (out or not at_least_one):
                break
            out.append(batch)
            size += len(batch)
            index += 1
        return b"".join(out)

    def bytes_between(self, offset: int, upto: int) -> int:
        """Size of the whole batches in [offset, upto): what a fetch at `offset` could get."""
        if offset >= upto:
            return 0
        index = bisect.bisect_left(self._last_offsets, offset)
        size = 0
        while index < len(self._batches) and self._last_offsets[index] < upto:
            size += len(self._batches[index])
            index += 1
        return size

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """The first offset whose record has a timestamp >= `timestamp`, and that record's
        timestamp (ListOffsets); ``None`` if no record is that late."""
        for batch in self._batches:
            parsed = DefaultRecordBatch(batch)
            if parsed.max_timestamp < timestamp:
                continue
            try:
                for record in parsed:
                    if record.timestamp >= timestamp:
                        return int(record.offset), int(record.timestamp)
            except Exception:  # noqa: BLE001 - a codec kafka-python lacks: answer by batch
                return int(parsed.base_offset), int(parsed.max_timestamp)
        return None
