"""Following a control topic: every replica sees every version announcement, the newest wins.

``strata.policy.updated`` and ``strata.rm.updated`` announce new versions (a path and a checksum,
never tensors). They are not work to share out: every replica of a generator or of the reward
service must see every announcement. So a follower reads the topic's single partition from the
beginning with no consumer group and commits nothing:

- ``catch_up()`` reads up to the current end and hands only the **newest** event to ``apply``: what
  was announced last wins (an announcement of an older version is a rollback and wins too);
- afterwards each poll's newest event is handed to ``apply`` as it comes;
- an undecodable event is logged and skipped: a poison announcement never stops the follower.

``apply(event) -> bool`` is the subclass's: it verifies the checksum, loads the weights and says
whether the version was taken; an event it refuses leaves the current version serving.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message
from kafka import KafkaConsumer, TopicPartition

from strata.bus.security import KafkaTarget, kafka_connection
from strata.bus.serde import PoisonMessageError, decode
from strata.bus.topics import Topic

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Message)


class VersionFollower(Generic[M]):
    def __init__(self, cluster: KafkaTarget, topic: Topic[M]) -> None:
        self._cluster = cluster
        self._topic = topic
        self._partition = TopicPartition(topic.name, 0)
        self._consumer: KafkaConsumer | None = None

    def apply(self, event: M) -> bool:
        """Take the version ``event`` announces; True when it was taken (subclasses)."""
        raise NotImplementedError

    def connect(self) -> None:
        self._consumer = KafkaConsumer(**kafka_connection(self._cluster), enable_auto_commit=False,
                                       auto_offset_reset="earliest", group_id=None)
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
        """Read every event published so far and apply the newest one. True if it was taken."""
        consumer = self._require()
        end = consumer.end_offsets([self._partition])[self._partition]
        newest: M | None = None
        deadline = time.monotonic() + timeout_s
        while consumer.position(self._partition) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {self._topic.name} up to offset {end} in {timeout_s:.0f} s")
            newest = self._newest(consumer.poll(timeout_ms=500)) or newest
        return newest is not None and self.apply(newest)

    def poll_once(self, timeout_s: float = 0.5) -> bool:
        """Apply the newest event of one poll, if any. True if it was taken."""
        newest = self._newest(self._require().poll(timeout_ms=int(timeout_s * 1000)))
        return newest is not None and self.apply(newest)

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

    def _newest(self, batches: dict[Any, list[Any]]) -> M | None:
        newest = None
        for records in batches.values():
            for record in records:
                try:
                    newest = decode(self._topic, record.value, record.key)
                except PoisonMessageError as exc:
                    log.error("ignoring an undecodable event on %s at offset %d: %s", self._topic.name,
                              record.offset, exc)
        return newest
