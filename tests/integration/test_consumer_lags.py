"""Consumer lag as `strata status` reads it, against a real broker: a group's committed offsets on a
single-partition compacted topic (as strata.policy.updated is) and on a many-partition one."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from strata.bus import Topic
from strata.bus.admin import consumer_lags, ensure_topics
from strata.bus.security import kafka_connection
from strata.config import StrataSettings
from strata.v1 import events_pb2

pytestmark = pytest.mark.integration


def commit(infra: StrataSettings, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = KafkaConsumer(**kafka_connection(infra), group_id=group, enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
    finally:
        consumer.close(autocommit=False)


@pytest.mark.parametrize("compacted,partitions", [(True, 1), (False, 3)])
def test_lag_is_published_minus_committed(infra: StrataSettings, compacted: bool, partitions: int) -> None:
    topic = Topic(f"test.lag.{uuid.uuid4().hex[:10]}", events_pb2.PolicyUpdated, key_field="policy_version",
                  compacted=compacted)
    ensure_topics(infra, partitions, topics=[topic])
    producer = KafkaProducer(**kafka_connection(infra))
    for i in range(5):
        producer.send(topic.name, key=str(i).encode(), value=b"x", partition=0)
    producer.flush()
    producer.close()
    group = f"test-lag-{uuid.uuid4().hex[:8]}"
    commit(infra, group, topic.name, {0: 2})

    # A fresh reader, as `strata status` is: no metadata of the topic cached beforehand.
    assert consumer_lags(infra, [group, f"never-committed-{uuid.uuid4().hex[:6]}"]) == {(group, topic.name): 3}
