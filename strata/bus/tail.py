"""A non-group Kafka reader: every partition of some topics, from a chosen point, never committing.

Each scheduler replica needs *every* event of a few topics, not a share of them: Watch streams any
prompt's events, and every replica's index needs every newly indexed prompt. A consumer group would
split the partitions between replicas, so this reader assigns all partitions to itself (manual
assignment, no group, nothing committed) and positions itself by time or at the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from kafka import KafkaConsumer
from kafka.structs import TopicPartition

from strata.bus.security import kafka_connection
from strata.bus.serde import PoisonMessageError, decode
from strata.bus.topics import Topic
from strata.bus.worker import Delivery, TransientError
from strata.config import StrataSettings

log = logging.getLogger(__name__)


class TailReader:
    def __init__(self, settings: StrataSettings, topics: Sequence[Topic[Any]], client_id: str) -> None:
        self._topics = {t.name: t for t in topics}
        self._consumer = KafkaConsumer(
            **kafka_connection(settings), group_id=None, enable_auto_commit=False,
            client_id=client_id, auto_offset_reset="latest",
        )
        self.partitions = [
            TopicPartition(name, p)
            for name in self._topics
            for p in sorted(self._consumer.partitions_for_topic(name))
        ]
        if not self.partitions:
            raise RuntimeError(f"no partitions for {sorted(self._topics)}; `strata infra up` creates the topics")
        self._consumer.assign(self.partitions)

    def seek_to_end(self) -> None:
        """Start after everything published so far (positions resolved now, not at the first poll)."""
        self._consumer.seek_to_end(*self.partitions)
        for tp in self.partitions:
            self._consumer.position(tp)

    def seek_to_time(self, timestamp_ms: int) -> None:
        """Start at the first event at or after ``timestamp_ms`` (the end where there is none)."""
        found = self._consumer.offsets_for_times(dict.fromkeys(self.partitions, max(0, timestamp_ms)))
        for tp in self.partitions:
            offset = found.get(tp)
            if offset is None:
                self._consumer.seek_to_end(tp)
                self._consumer.position(tp)
            else:
                self._consumer.seek(tp, offset.offset)

    def poll(self, timeout_s: float) -> list[tuple[Topic[Any], Any]]:
        """Decoded events in partition order; undecodable ones are logged and skipped (the groups
        that own these topics dead-letter them)."""
        events = []
        for tp, records in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).items():
            topic = self._topics[tp.topic]
            for record in records:
                try:
                    events.append((topic, decode(topic, record.value, record.key)))
                except PoisonMessageError as exc:
                    log.debug("%s[%d]@%d skipped: %s", tp.topic, tp.partition, record.offset, exc)
        return events

    def end_offsets(self) -> dict[TopicPartition, int]:
        """The current end of every partition read."""
        return self._consumer.end_offsets(self.partitions)

    def reached(self, ends: dict[TopicPartition, int]) -> bool:
        """True once every partition was read up to ``ends``."""
        return all(self._consumer.position(tp) >= end for tp, end in ends.items())

    def close(self) -> None:
        self._consumer.close(autocommit=False)


def read_ranges(settings: StrataSettings, topic: Topic[Any], ranges: dict[int, tuple[int, int]],
                client_id: str, timeout_s: float = 60.0) -> Iterator[list[Delivery[Any]]]:
    """The events of ``topic`` in ``[start, end)`` per partition, as batches of deliveries, then stop.

    For re-reading what a group committed but a checkpoint does not hold (the learner's recovery).
    Undecodable events are skipped: the run that committed them dead-lettered them.
    """
    consumer = KafkaConsumer(**kafka_connection(settings), group_id=None, enable_auto_commit=False,
                             client_id=client_id)
    try:
        assignment = [TopicPartition(topic.name, p) for p, (start, end) in ranges.items() if start < end]
        consumer.assign(assignment)
        for tp in assignment:
            consumer.seek(tp, ranges[tp.partition][0])
        remaining = set(assignment)
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TransientError(f"could not re-read {topic.name} up to the wanted offsets in {timeout_s} s")
            deliveries = []
            for tp, records in consumer.poll(timeout_ms=500).items():
                end = ranges[tp.partition][1]
                for record in records:
                    if record.offset >= end:
                        break
                    try:
                        message = decode(topic, record.value, record.key)
                    except PoisonMessageError:
                        continue
                    deliveries.append(Delivery(topic, message, record.key, record.partition, record.offset, 1,
                                               record.timestamp))
            for tp in list(remaining):
                if consumer.position(tp) >= ranges[tp.partition][1]:
                    remaining.discard(tp)
            if deliveries:
                yield deliveries
    finally:
        consumer.close(autocommit=False)
