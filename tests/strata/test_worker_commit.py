"""A commit that meets a rebalance in progress is deferred, not lost and not fatal (strata/bus/worker.py); the
broker-backed behaviour of the worker is in tests/integration/test_bus.py."""

from __future__ import annotations

from typing import Any

from kafka.errors import CommitFailedError, RebalanceInProgressError
from kafka.structs import OffsetAndMetadata, TopicPartition

from strata.bus import Topic, Worker
from strata.config import StrataSettings
from strata.v1 import events_pb2

TOPIC = Topic("test.commits", events_pb2.PromptRouted)


class Consumer:
    """A KafkaConsumer's commit, failing with the errors given, in order, then succeeding."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.committed: list[dict[TopicPartition, int]] = []

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> None:
        if self.failures:
            raise self.failures.pop(0)
        self.committed.append({tp: o.offset for tp, o in offsets.items()})


def worker(consumer: Any) -> Worker:
    built = Worker(StrataSettings(), "g", {TOPIC: lambda delivery: None}, publisher=object())  # type: ignore[arg-type]
    built._consumer = consumer
    return built


def at(offset: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, "", -1)


def test_offsets_a_rebalance_refused_go_with_the_next_commit() -> None:
    p0, p1 = TopicPartition(TOPIC.name, 0), TopicPartition(TOPIC.name, 1)
    consumer = Consumer(RebalanceInProgressError(), RebalanceInProgressError())
    w = worker(consumer)
    w._commit({p0: at(5)})  # the group is rebalancing: kept
    w._commit({})  # still rebalancing (a poll with nothing new): still kept
    w._commit({p1: at(3), p0: at(7)})  # the newer offset of p0 wins
    assert consumer.committed == [{p0: 7, p1: 3}]
    assert w._unsent == {}


def test_a_commit_after_losing_the_generation_is_dropped_for_redelivery() -> None:
    p0 = TopicPartition(TOPIC.name, 0)
    consumer = Consumer(CommitFailedError())
    w = worker(consumer)
    w._commit({p0: at(5)})
    w._commit({})
    assert consumer.committed == [] and w._unsent == {}  # the partition's next owner redelivers (idempotent)
