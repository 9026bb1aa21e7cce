"""Following a control topic: every replica sees every version announcement, the newest wins.

``strata.policy.updated`` and ``strata.rm.updated`` announce new versions (a path and a checksum,
never tensors). They are not work to share out: every replica of a generator or of the reward
service must see every announcement. So a follower reads the topic's single partition from the
beginning with no consumer group and commits nothing:

- ``catch_up()`` reads up to the current end and hands only the **newest** event to ``apply``: what
  was announced last wins (an announcement of an older version is a rollback and wins too);
- afterwards each poll's newest event is handed to ``apply`` as it comes;
- an undecodable event is logged and skipped: a poison announcement never stops the follower.

A follower reads the newest event it can use: on catch-up and in each poll it walks from the newest
event back, past events that can never be taken.

- ``check(event)`` (the subclass's) raises ``ControlEventError`` for such an event: a path outside
  the root, no checksum, a forged version. Every replica would refuse it the same way, at every
  start, so it is **dead-lettered once** to ``<topic>.dlq`` (stage ``control``) and, once there,
  skipped without a second look: the follower reads the DLQ's source offsets when it connects.
  Replicas refusing the same new event at the same moment may each write a copy; all name the same
  source offset.
- ``apply(event) -> bool`` verifies the checksum, loads the weights and says whether the version was
  taken; an event refused for a reason that may pass (``ControlEventUnavailable``: its files are
  not readable here now, e.g. a wiped checkpoint directory) leaves the current version serving, or
  on catch-up the newest older event that is readable, and is not dead-lettered.

Control topics are compacted (``Topic.compacted``), so the newest announcement of each version
survives Kafka's retention and a restart a month later still finds the promoted RM and policy.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from kafka import KafkaConsumer, TopicPartition

from strata.bus.producer import Publisher
from strata.bus.security import KafkaTarget, kafka_connection
from strata.bus.serde import PoisonMessageError, decode
from strata.bus.topics import Topic
from strata.bus.worker import dead_letter_headers, publish_dead_letter
from strata.contract.control import ControlEventError, ControlEventUnavailable

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


class VersionFollower(Generic[M]):
    def __init__(self, cluster: KafkaTarget, topic: Topic[M], dead_letters: Publisher | None = None,
                 group: str = "follower") -> None:
        self._cluster = cluster
        self._topic = topic
        self._partition = TopicPartition(topic.name, 0)
        self._consumer: KafkaConsumer | None = None
        self._dead_letters = dead_letters
        self._group = group
        self._refused_offsets: set[int] = set()  # offsets of this topic already in its DLQ
        self.rejected = 0  # events refused, by check() or by apply()

    def check(self, event: M) -> None:
        """Raise ``ControlEventError`` for an event that no replica can ever take (subclasses)."""

    def apply(self, event: M) -> bool:
        """Take the version ``event`` announces; True when it was taken (subclasses)."""
        raise NotImplementedError

    def offer(self, event: M) -> bool:
        """Check ``event`` and apply it; True when it was taken."""
        try:
            self.check(event)
        except (ControlEventError, ControlEventUnavailable) as exc:
            self._count_refusal(exc)
            return False
        return self.apply(event)

    def connect(self) -> None:
        self._consumer = KafkaConsumer(**kafka_connection(self._cluster), enable_auto_commit=False,
                                       auto_offset_reset="earliest", group_id=None)
        self._refused_offsets = self._read_refused_offsets(self._consumer)
        self._consumer.assign([self._partition])
        self._consumer.seek_to_beginning(self._partition)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _require(self) -> KafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("follower is not connected; call connect() or run()")
        return self._consumer

    def catch_up(self, timeout_s: float = 30.0) -> bool:
        """Read every event published so far and apply the newest usable one. True if it was taken."""
        records, end = read_to_end(self._require(), self._partition, timeout_s)
        if end is not None:
            raise TimeoutError(f"could not read {self._topic.name} up to offset {end} in {timeout_s:.0f} s")
        return self._take_newest(records)

    def poll_once(self, timeout_s: float = 0.5) -> bool:
        """Apply the newest usable event of one poll, if any. True if it was taken."""
        batches = self._require().poll(timeout_ms=int(timeout_s * 1000))
        return self._take_newest([record for batch in batches.values() for record in batch])

    def run(self, stop: threading.Event) -> None:
        """Catch up, then follow the topic until ``stop`` is set (a ``ServiceParts`` loop)."""
        if self._consumer is None:
            self.connect()
            self.catch_up()
        try:
            while not stop.is_set():
                self.poll_once(0.5)
        finally:
            self.close()

    def _take_newest(self, records: list[Any]) -> bool:
        """Apply the newest record that is not refused for good; older ones are history."""
        for record in sorted(records, key=lambda r: r.offset, reverse=True):
            if record.offset in self._refused_offsets:
                continue
            try:
                event = decode(self._topic, record.value, record.key)
                self.check(event)
            except PoisonMessageError as exc:
                self._refuse_for_good(record, "decode", exc)
                continue
            except ControlEventError as exc:
                self._count_refusal(exc)
                self._refuse_for_good(record, "control", exc)
                continue
            except ControlEventUnavailable as exc:  # an older event may still be usable here
                self._count_refusal(exc)
                continue
            return self.apply(event)
        return False

    def _count_refusal(self, exc: Exception) -> None:
        self.rejected += 1
        log.error("%s: event refused: %s", self._topic.name, exc)

    def _refuse_for_good(self, record: Any, stage: str, exc: Exception) -> None:
        """Dead-letter a record no replica can take, so that no start reads it again."""
        self._refused_offsets.add(record.offset)
        if self._dead_letters is None:
            log.error("%s@%d refused (%s): %s", self._topic.name, record.offset, stage, exc)
            return
        headers = dead_letter_headers(record, stage, str(exc), 1, self._group)
        try:
            publish_dead_letter(self._dead_letters, self._topic, record, headers)
        except Exception as publish_failure:  # the follower stays live; the next start tries again
            self._refused_offsets.discard(record.offset)
            log.error("%s@%d refused (%s) but not dead-lettered: %s", self._topic.name, record.offset, stage,
                      publish_failure)
            return
        log.error("%s@%d dead-lettered to %s (%s): %s", self._topic.name, record.offset, self._topic.dlq, stage, exc)

    def _read_refused_offsets(self, consumer: KafkaConsumer) -> set[int]:
        """The offsets of this topic that a follower already dead-lettered (read from the DLQ)."""
        if not consumer.partitions_for_topic(self._topic.dlq):
            return set()
        dlq = TopicPartition(self._topic.dlq, 0)
        consumer.assign([dlq])
        consumer.seek_to_beginning(dlq)
        refused: set[int] = set()
        for record in read_to_end(consumer, dlq, 30.0)[0]:  # what could be read in time
            headers = dict(record.headers or [])
            if headers.get("strata-dlq-source-topic") == self._topic.name.encode():
                refused.add(int(headers.get("strata-dlq-source-offset", b"-1")))
        return refused


def newest_event(cluster: KafkaTarget, topic: Topic[M], timeout_s: float = 30.0, look_back: int = 50) -> M | None:
    """The newest decodable event of a single-partition topic (None when it has none)."""
    consumer = KafkaConsumer(**kafka_connection(cluster), enable_auto_commit=False, group_id=None)
    partition = TopicPartition(topic.name, 0)
    try:
        consumer.assign([partition])
        begin = consumer.beginning_offsets([partition])[partition]
        end = consumer.end_offsets([partition])[partition]
        if end <= begin:
            return None
        consumer.seek(partition, max(begin, end - look_back))
        records, missed = read_to_end(consumer, partition, timeout_s)
        if missed is not None:
            raise TimeoutError(f"could not read {topic.name} up to offset {missed} in {timeout_s:.0f} s")
        newest: M | None = None
        for record in records:
            try:
                newest = decode(topic, record.value, record.key)
            except PoisonMessageError:
                continue
        return newest
    finally:
        consumer.close()


def read_to_end(consumer: KafkaConsumer, partition: TopicPartition, timeout_s: float) -> tuple[list[Any], int | None]:
    """The records from ``consumer``'s position up to the partition's current end, in offset order,
    and None; or, past ``timeout_s``, those read so far and the end offset that was not reached."""
    end = consumer.end_offsets([partition])[partition]
    records: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while consumer.position(partition) < end:
        if time.monotonic() > deadline:
            return records, end
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
    return records, None
