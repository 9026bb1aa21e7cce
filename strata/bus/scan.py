"""Reading topics as they are now, for tools: no consumer group, nothing committed.

Recovery reads whole topics, ``strata rm distill`` the newest of the rollout log, ``strata diagnose``
the newest rollouts, the demo a topic's size: one reader for all of them, so that none hand-writes
"assign, seek, poll to the end" again. Short timeouts: a tool must say within seconds that Kafka is
unreachable; a read that makes no progress for ``idle_timeout_s`` is an error naming the topic and
the address. (The services' own range re-read is ``strata.bus.tail.read_ranges``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from kafka import KafkaConsumer
from kafka.errors import KafkaError
from kafka.structs import TopicPartition

from strata.bus.security import KafkaTarget, kafka_connection
from strata.bus.serde import PoisonMessageError, decode
from strata.bus.topics import Topic
from strata.bus.worker import Delivery
from strata.errors import CliError

Bounds = Mapping[TopicPartition, tuple[int, int]]  # partition -> [first offset, end offset)


def tool_consumer(cluster: KafkaTarget, client_id: str, group_id: str | None = None) -> KafkaConsumer:
    """A consumer for a command-line tool: short timeouts, nothing auto-committed or auto-created, and
    an unreachable Kafka as one :class:`CliError` naming the address."""
    try:
        return KafkaConsumer(
            **kafka_connection(cluster), client_id=client_id, group_id=group_id, enable_auto_commit=False,
            bootstrap_timeout_ms=3000, request_timeout_ms=10_000, allow_auto_create_topics=False,
        )
    except KafkaError as exc:
        raise CliError(f"Kafka at {kafka_connection(cluster)['bootstrap_servers']} is unreachable: {exc}") from None


def newest_of(bounds: Bounds, per_partition: int) -> dict[TopicPartition, tuple[int, int]]:
    """``bounds`` narrowed to the last ``per_partition`` events of each partition."""
    return {tp: (max(begin, end - max(0, per_partition)), end) for tp, (begin, end) in bounds.items()}


Progress = Callable[[str, int, int], None]  # (topic, events read, events to read)


class TopicScan:
    """Reads topics as they are now: whole (:meth:`events`), or the newest events of each partition
    (:meth:`newest`, then ``events(..., bounds=...)``). Unreachable Kafka, a missing topic and a
    stalled read are :class:`CliError` naming the topic and the address."""

    def __init__(self, cluster: KafkaTarget, client_id: str = "strata-tool", idle_timeout_s: float = 20.0) -> None:
        self.address = kafka_connection(cluster)["bootstrap_servers"]
        self._idle_timeout_s = idle_timeout_s
        self.skipped = 0  # events the last ``events`` call left out
        self._consumer = tool_consumer(cluster, client_id)

    def close(self) -> None:
        self._consumer.close(autocommit=False)

    def __enter__(self) -> TopicScan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bounds(self, name: str, required: bool = True) -> dict[TopicPartition, tuple[int, int]]:
        """partition -> (beginning, end) offsets now; a missing topic is a CliError when ``required``."""
        numbers = self._consumer.partitions_for_topic(name)
        if not numbers:
            if not required:
                return {}
            raise CliError(f"topic {name} does not exist on Kafka at {self.address} (`strata infra up` creates it)")
        parts = [TopicPartition(name, p) for p in sorted(numbers)]
        beginning, end = self._consumer.beginning_offsets(parts), self._consumer.end_offsets(parts)
        return {tp: (beginning[tp], end[tp]) for tp in parts}

    def newest(self, name: str, per_partition: int, required: bool = True) -> dict[TopicPartition, tuple[int, int]]:
        """The bounds of the last ``per_partition`` events of each partition (fewer where it holds fewer)."""
        return newest_of(self.bounds(name, required), per_partition)

    def size(self, name: str) -> int:
        """Events ``name`` retains now, over its partitions (0 for a missing topic)."""
        return sum(end - begin for begin, end in self.bounds(name, required=False).values())

    def _records(self, bounds: Bounds, progress: Progress | None = None,
                 first_only: bool = False) -> Iterator[Any]:
        """Records in ``[beginning, end)`` of each partition, in offset order per partition (only each
        partition's first with ``first_only``)."""
        todo = {tp: end for tp, (begin, end) in bounds.items() if begin < end}
        if not todo:
            return
        total, done = sum(end - bounds[tp][0] for tp, end in todo.items()), 0
        self._consumer.assign(list(todo))
        for tp in todo:
            self._consumer.seek(tp, bounds[tp][0])
        last_progress = time.monotonic()
        while todo:
            batches = self._consumer.poll(timeout_ms=500)
            if not batches and time.monotonic() - last_progress > self._idle_timeout_s:
                names = ", ".join(sorted({f"{tp.topic}[{tp.partition}]" for tp in todo}))
                raise CliError(f"could not read {names} from Kafka at {self.address}: no progress for "
                               f"{self._idle_timeout_s:.0f} s")
            for tp, records in batches.items():
                if tp not in todo:
                    continue
                last_progress = time.monotonic()
                for record in records:
                    if record.offset >= todo[tp]:
                        break
                    done += 1
                    yield record
                    if first_only:
                        todo[tp] = -1  # done with it
                        break
            for tp in [tp for tp, end in todo.items() if self._consumer.position(tp) >= end]:
                del todo[tp]
                self._consumer.pause(tp)
            if progress is not None and batches:
                progress(next(iter(bounds)).topic, done, total)
        self._consumer.assign([])

    def oldest_s(self, topic: Topic[Any]) -> float | None:
        """The timestamp of the oldest event ``topic`` retains (None when it holds none)."""
        stamps = [r.timestamp for r in self._records(self.bounds(topic.name), first_only=True)]
        return min(stamps) / 1000 if stamps else None

    def events(self, topic: Topic[Any], progress: Progress | None = None, skip: Collection[tuple[int, int]] = (),
               bounds: Bounds | None = None) -> Iterator[Delivery[Any]]:
        """Every decodable event ``topic`` retains (within ``bounds``, e.g. :meth:`newest`'s), in offset
        order per partition; undecodable ones and ``skip`` ((partition, offset): refused for good, see
        :meth:`refused`) are left out and counted."""
        self.skipped = 0
        for record in self._records(self.bounds(topic.name) if bounds is None else bounds, progress):
            if (record.partition, record.offset) in skip:
                self.skipped += 1
                continue
            try:
                message = decode(topic, record.value, record.key)
            except PoisonMessageError:
                self.skipped += 1
                continue
            yield Delivery(topic, message, record.key, record.partition, record.offset, 1, record.timestamp)

    def refused(self, topic: Topic[Any]) -> set[tuple[int, int]]:
        """(partition, offset) of ``topic``'s events in its DLQ: what followers refused for good."""
        found: set[tuple[int, int]] = set()
        for record in self._records(self.bounds(topic.dlq, required=False)):
            headers = dict(record.headers or ())
            if headers.get("strata-dlq-source-topic") != topic.name.encode():
                continue
            try:
                found.add((int(headers.get("strata-dlq-source-partition", b"0")),
                           int(headers.get("strata-dlq-source-offset", b"-1"))))
            except ValueError:
                continue
        return found
