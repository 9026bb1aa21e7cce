"""Consumer-group workers: at-least-once, commit after success, dead-letter instead of blocking.

The loop has the vLLM engine shape: (1) poll a batch, (2) hand each event to its handler, (3)
commit the offsets of what is done. Per event the outcome is one of:

* handled                   -> counted, offset committed after the batch;
* undecodable (poison)      -> original bytes to ``<topic>.dlq`` (acknowledged), offset committed;
* handler failed            -> retried with exponential backoff, the partition paused meanwhile
                               (other partitions keep flowing); after ``max_delivery_attempts``
                               the event is dead-lettered and the partition moves on;
* transient (infra outage)  -> retried with backoff for as long as it takes, never dead-lettered:
                               a Redis outage is not the message's fault.

Offsets are only committed for events that were handled or dead-lettered, so a worker killed at any
point redelivers the rest to whoever takes its partitions. Handlers must therefore be idempotent
(by content hash). ``stop`` lets the current event finish, commits, and leaves the group.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic

from kafka import KafkaConsumer
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import CommitFailedError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata, TopicPartition

from strata.bus.errors import TransientError, is_too_large, is_transient
from strata.bus.producer import Publisher
from strata.bus.security import kafka_connection
from strata.bus.serde import PoisonMessageError, decode
from strata.bus.topics import M, Topic
from strata.config import StrataSettings
from strata.telemetry import BUS_CONSUMED, BUS_DEAD_LETTERED, BUS_HANDLER_SECONDS, BUS_RETRIES

log = logging.getLogger(__name__)




@dataclass(frozen=True)
class Delivery(Generic[M]):
    """One decoded event handed to a handler."""

    topic: Topic[M]
    message: M
    key: bytes | None
    partition: int
    offset: int
    attempt: int          # 1 on first delivery to this worker
    timestamp_ms: int     # broker timestamp of the record


Handler = Callable[[Delivery[Any]], None]
# A batch handler gets every decoded event of one poll for its topic (across partitions, in partition
# order) and handles them together, e.g. one generation batch. It is all or nothing: when it raises,
# the worker falls back to handling the events one by one, so that only a bad event is retried and
# dead-lettered and the rest still go through.
BatchHandler = Callable[[list[Delivery[Any]]], None]


def _one_at_a_time(batch_handler: BatchHandler) -> Handler:
    """A batch handler's one-by-one fallback: each event as a batch of one."""
    def handle(delivery: Delivery[Any]) -> None:
        batch_handler([delivery])
    return handle


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._worker._forget(revoked)

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._worker._settle_pauses(assigned)
        log.info("group %s: assigned %s", self._worker.group_id,
                 ", ".join(f"{tp.topic}[{tp.partition}]" for tp in assigned) or "nothing")


class Worker:
    """Consume ``handlers``' topics in consumer group ``group_id``."""

    def __init__(
        self,
        settings: StrataSettings,
        group_id: str,
        handlers: Mapping[Topic[Any], Handler] | None = None,
        publisher: Publisher | None = None,
        client_id: str | None = None,
        batch_handlers: Mapping[Topic[Any], BatchHandler] | None = None,
    ) -> None:
        handlers = dict(handlers or {})
        batch_handlers = dict(batch_handlers or {})
        if not handlers and not batch_handlers:
            raise ValueError("a worker needs at least one topic handler")
        if publisher is None:
            raise ValueError("a worker needs a publisher for its dead-letter topics")
        if overlap := {t.name for t in handlers} & {t.name for t in batch_handlers}:
            raise ValueError(f"topics with both a handler and a batch handler: {sorted(overlap)}")
        self.group_id = group_id
        self._settings = settings
        self._handlers = {topic.name: (topic, handler) for topic, handler in handlers.items()}
        self._batch_handlers = {topic.name: handler for topic, handler in batch_handlers.items()}
        for topic, batch_handler in batch_handlers.items():
            self._handlers[topic.name] = (topic, _one_at_a_time(batch_handler))
        self._publisher = publisher
        self._client_id = client_id or group_id
        self._consumer: KafkaConsumer | None = None
        self._attempts: dict[tuple[str, int, int], int] = {}
        self._paused_until: dict[TopicPartition, float] = {}
        # Events already dead-lettered but not yet committed: a partition rewound for a retry must
        # not send them to the DLQ twice. Pruned at each commit.
        self._dead: set[tuple[str, int, int]] = set()
        # Offsets of finished events whose commit met a rebalance in progress: committed at the next poll, so
        # that a rebalance costs no redelivery it need not.
        self._unsent: dict[TopicPartition, OffsetAndMetadata] = {}
        self.handled = 0
        self.dead_lettered = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def connect(self) -> None:
        s = self._settings
        self._consumer = KafkaConsumer(
            **kafka_connection(s),
            group_id=self.group_id,
            client_id=self._client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=s.consumer_session_timeout_ms,
            heartbeat_interval_ms=s.consumer_heartbeat_interval_ms,
            max_poll_interval_ms=s.consumer_max_poll_interval_ms,
            max_poll_records=s.consumer_max_poll_records,
        )
        self._wait_for_topics(self._consumer)
        self._consumer.subscribe(topics=list(self._handlers), listener=_Rebalance(self))

    def _wait_for_topics(self, consumer: KafkaConsumer, timeout_s: float = 30.0) -> None:
        """Know every topic's partitions before joining the group.

        A member that joins before its client has the metadata of a just-created topic is assigned
        nothing and stays idle until the next metadata refresh.
        """
        deadline = time.monotonic() + timeout_s
        for name in self._handlers:
            while not consumer.partitions_for_topic(name):
                if time.monotonic() > deadline:
                    raise TransientError(f"topic {name} does not exist (create the topics: `strata infra up`)")
                time.sleep(0.2)

    def close(self) -> None:
        """Leave the group without committing anything not already committed."""
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None

    def assignment(self) -> set[TopicPartition]:
        """Partitions this worker owns right now (empty until the group has balanced)."""
        return set(self._require_consumer().assignment())

    def run(self, stop: threading.Event, poll_timeout_s: float = 0.5) -> None:
        """Poll until ``stop`` is set, then leave the group cleanly."""
        if self._consumer is None:
            self.connect()
        try:
            while not stop.is_set():
                self.poll_once(poll_timeout_s, stop)
        finally:
            self.close()

    # -- one step --------------------------------------------------------------------------------

    def poll_once(self, timeout_s: float = 0.5, stop: threading.Event | None = None) -> int:
        """Poll one batch, handle it, commit what is done. Returns events handled or dead-lettered."""
        consumer = self._require_consumer()
        self._resume_due_partitions()
        batches = consumer.poll(timeout_ms=int(timeout_s * 1000))
        done: dict[TopicPartition, OffsetAndMetadata] = {}
        count = 0
        if self._batch_handlers and (stop is None or not stop.is_set()):
            count += self._process_batches(batches, done)
        for tp, records in batches.items():
            if tp in done:
                continue  # handled as a batch
            for record in records:
                if stop is not None and stop.is_set():
                    consumer.seek(tp, record.offset)  # not ours to finish; keep it for the next owner
                    break
                if (record.topic, record.partition, record.offset) in self._dead:
                    done[tp] = OffsetAndMetadata(record.offset + 1, "", -1)
                    count += 1
                    continue
                if not self._process(tp, record):
                    break  # retry later from this record; later records of tp wait behind it
                done[tp] = OffsetAndMetadata(record.offset + 1, "", -1)
                count += 1
        if done or self._unsent:
            self._commit(done)
        return count

    # -- internals -------------------------------------------------------------------------------

    def _require_consumer(self) -> KafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("worker is not connected; call connect() or run()")
        return self._consumer

    def _process_batches(self, batches: Mapping[TopicPartition, list[Any]],
                         done: dict[TopicPartition, OffsetAndMetadata]) -> int:
        """Hand each batch topic's fresh events to its batch handler; fills ``done`` on success.

        Undecodable events are dead-lettered first (once: see ``_dead``).
        """
        count = 0
        for topic_name, batch_handler in self._batch_handlers.items():
            topic = self._handlers[topic_name][0]
            # Partitions with an event under retry take the one-by-one path until it is resolved.
            parts = {
                tp: records for tp, records in batches.items()
                if tp.topic == topic_name and records
                and not any((tp.topic, tp.partition, r.offset) in self._attempts for r in records)
            }
            if not parts:
                continue
            deliveries: list[Delivery[Any]] = []
            for records in parts.values():
                for record in records:
                    if (record.topic, record.partition, record.offset) in self._dead:
                        continue
                    try:
                        message = decode(topic, record.value, record.key)
                    except PoisonMessageError as exc:
                        self._dead_letter(topic, record, "decode", str(exc), 1)
                        continue
                    deliveries.append(Delivery(topic, message, record.key, record.partition, record.offset, 1,
                                               record.timestamp))
            started = time.perf_counter()
            try:
                if deliveries:
                    batch_handler(deliveries)
            except Exception as exc:
                log.warning("%s: batch of %d failed (%s: %s); handling its events one by one",
                            topic_name, len(deliveries), type(exc).__name__, exc)
                continue  # the per-record loop takes these partitions
            if deliveries:
                BUS_HANDLER_SECONDS.labels(topic=topic_name, group=self.group_id).observe(time.perf_counter() - started)
                BUS_CONSUMED.labels(topic=topic_name, group=self.group_id).inc(len(deliveries))
            self.handled += len(deliveries)
            for tp, records in parts.items():
                done[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
                count += len(records)
        return count

    def _process(self, tp: TopicPartition, record: Any) -> bool:
        """Handle one record. True when finished with it (handled or dead-lettered)."""
        topic, handler = self._handlers[record.topic]
        attempt_key = (record.topic, record.partition, record.offset)
        attempt = self._attempts.get(attempt_key, 0) + 1
        try:
            message = decode(topic, record.value, record.key)
        except PoisonMessageError as exc:
            self._dead_letter(topic, record, "decode", str(exc), attempt)
            return True
        delivery = Delivery(topic, message, record.key, record.partition, record.offset, attempt, record.timestamp)
        started = time.perf_counter()
        try:
            handler(delivery)
        except PoisonMessageError as exc:
            self._dead_letter(topic, record, "handler", str(exc), attempt)
            return True
        except Exception as exc:
            if is_transient(exc):  # the world is broken, not the message: wait, never dead-letter
                log.warning("%s[%d]@%d: transient failure (attempt %d), will retry: %s: %s",
                            record.topic, record.partition, record.offset, attempt, type(exc).__name__, exc)
                self._retry_later(tp, record.offset, attempt_key, attempt)
                return False
            if attempt >= self._settings.max_delivery_attempts:
                log.exception("%s[%d]@%d: handler failed %d times, dead-lettering",
                              record.topic, record.partition, record.offset, attempt)
                self._dead_letter(topic, record, "handler", f"{type(exc).__name__}: {exc}", attempt)
                return True
            log.warning("%s[%d]@%d: handler failed (attempt %d of %d), will retry: %s: %s",
                        record.topic, record.partition, record.offset, attempt,
                        self._settings.max_delivery_attempts, type(exc).__name__, exc)
            self._retry_later(tp, record.offset, attempt_key, attempt)
            return False
        BUS_HANDLER_SECONDS.labels(topic=record.topic, group=self.group_id).observe(time.perf_counter() - started)
        BUS_CONSUMED.labels(topic=record.topic, group=self.group_id).inc()
        self._attempts.pop(attempt_key, None)
        self.handled += 1
        return True

    def _retry_later(self, tp: TopicPartition, offset: int, attempt_key: tuple[str, int, int], attempt: int) -> None:
        consumer = self._require_consumer()
        self._attempts[attempt_key] = attempt
        BUS_RETRIES.labels(topic=tp.topic, group=self.group_id).inc()
        s = self._settings
        backoff = min(s.retry_backoff_max_s, s.retry_backoff_initial_s * 2 ** (attempt - 1))
        consumer.seek(tp, offset)
        consumer.pause(tp)
        self._paused_until[tp] = time.monotonic() + backoff

    def _resume_due_partitions(self) -> None:
        now = time.monotonic()
        due = [tp for tp, until in self._paused_until.items() if until <= now]
        if due:
            owned = self._require_consumer().assignment()
            if mine := [tp for tp in due if tp in owned]:
                self._require_consumer().resume(*mine)
            for tp in due:
                del self._paused_until[tp]

    def _settle_pauses(self, assigned: Any) -> None:
        """After a rebalance: a partition we got (back) that is paused with no retry due is resumed,
        so that no partition stays paused forever."""
        consumer = self._require_consumer()
        stuck = [tp for tp in assigned if tp in consumer.paused() and tp not in self._paused_until]
        if stuck:
            consumer.resume(*stuck)

    def _forget(self, partitions: Any) -> None:
        """Partitions left us. Attempt counts and dead-letter marks are kept (by offset): if a
        partition comes back, its counting goes on; commits prune them."""
        for tp in partitions:
            self._paused_until.pop(tp, None)

    def _dead_letter(self, topic: Topic[Any], record: Any, stage: str, reason: str, attempt: int) -> None:
        # Waits for the acknowledgement: the offset is committed only once the DLQ copy is durable.
        publish_dead_letter(self._publisher, topic, record, dead_letter_headers(record, stage, reason, attempt,
                                                                                self.group_id))
        BUS_DEAD_LETTERED.labels(topic=record.topic, group=self.group_id, stage=stage).inc()
        self._attempts.pop((record.topic, record.partition, record.offset), None)
        self._dead.add((record.topic, record.partition, record.offset))
        self.dead_lettered += 1
        log.error("%s[%d]@%d dead-lettered to %s (%s): %s",
                  record.topic, record.partition, record.offset, topic.dlq, stage, reason)

    def _commit(self, done: dict[TopicPartition, OffsetAndMetadata]) -> None:
        consumer = self._require_consumer()
        # Deferred offsets are of events this worker finished: right to commit whoever owns the partition now.
        offsets = {**self._unsent, **done}
        self._unsent = {}
        if not offsets:
            return
        try:
            consumer.commit(offsets)
            def pending(key: tuple[str, int, int]) -> bool:
                tp = TopicPartition(key[0], key[1])
                return tp not in offsets or key[2] >= offsets[tp].offset

            self._dead = {k for k in self._dead if pending(k)}
            self._attempts = {k: v for k, v in self._attempts.items() if pending(k)}
        except RebalanceInProgressError:
            # The group is rebalancing now: keep the offsets for the next commit; a partition that goes to
            # another member meanwhile is redelivered there (handlers are idempotent).
            log.info("group %s: commit deferred, the group is rebalancing", self.group_id)
            self._unsent = offsets
        except CommitFailedError as exc:
            # The group rebalanced under us: the new owner will redeliver; handlers are idempotent.
            log.warning("group %s: commit failed after a rebalance, events will be redelivered: %s",
                        self.group_id, exc)


def dead_letter_headers(record: Any, stage: str, reason: str, attempts: int, group: str) -> list[tuple[str, bytes]]:
    """Where a dead letter came from and why (``strata dlq`` reads these)."""
    return [
        ("strata-dlq-source-topic", record.topic.encode()),
        ("strata-dlq-source-partition", str(record.partition).encode()),
        ("strata-dlq-source-offset", str(record.offset).encode()),
        ("strata-dlq-stage", stage.encode()),
        ("strata-dlq-error", reason[:2000].encode("utf-8", "replace")),
        ("strata-dlq-attempts", str(attempts).encode()),
        ("strata-dlq-group", group.encode()),
    ]


def publish_dead_letter(publisher: Publisher, topic: Topic[Any], record: Any,
                        headers: list[tuple[str, bytes]]) -> None:
    """Copy ``record`` to ``topic``'s DLQ and wait for the acknowledgement."""
    try:
        publisher.publish_raw(topic.dlq, record.key, record.value, headers)
    except Exception as exc:
        if not is_too_large(exc):
            raise
        # A record near the size limit grows past it with the headers: keep where it was and its
        # digest (the bytes stay readable at the source offset within retention), drop the bytes,
        # instead of failing the dead-lettering and crash-looping the worker on this record.
        value = record.value or b""
        note = f"{len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()}; too large with headers"
        publisher.publish_raw(topic.dlq, record.key, b"", [*headers, ("strata-dlq-value-dropped", note.encode())])
