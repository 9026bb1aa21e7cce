"""The tools' topic reader (strata.bus.scan) against the real broker: sizes, the newest events of each
partition, poison left out and counted, a missing topic named."""

from __future__ import annotations

import uuid

import pytest

from strata.bus import Publisher, Topic
from strata.bus.admin import ensure_topics
from strata.bus.scan import TopicScan
from strata.config import StrataSettings
from strata.errors import CliError
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2

pytestmark = pytest.mark.integration


def test_newest_reads_the_last_events_of_every_partition_and_leaves_poison_out(infra: StrataSettings) -> None:
    topic = Topic(f"test.scan.{uuid.uuid4().hex[:10]}", events_pb2.PromptRouted)
    ensure_topics(infra, 2, topics=[topic])
    publisher = Publisher(infra, client_id="test-scan")
    try:
        futures = [publisher.publish(topic, events_pb2.PromptRouted(prompt_hash=content_hash(f"p{i}"),
                                                                     tier=common_pb2.TIER_LEVEL_1))
                   for i in range(20)]
        publisher.wait(futures)
        publisher.publish_raw(topic.name, b"poison", b"not a protobuf")
    finally:
        publisher.close()

    with TopicScan(infra, client_id="test-scan", idle_timeout_s=20) as scan:
        bounds = scan.bounds(topic.name)
        assert len(bounds) == 2 and scan.size(topic.name) == 21
        everything = list(scan.events(topic))
        assert len(everything) == 20 and scan.skipped == 1
        newest = scan.newest(topic.name, 3)
        ends = {tp.partition: end for tp, (_, end) in bounds.items()}
        assert {tp.partition: span for tp, span in newest.items()} == {p: (e - 3, e) for p, e in ends.items()}
        recent = list(scan.events(topic, bounds=newest))
        assert all(ends[d.partition] - 3 <= d.offset < ends[d.partition] for d in recent)
        assert len(recent) == 5 and scan.skipped == 1  # six places, one of them the poison record's
        assert scan.size(f"{topic.name}.missing") == 0
        assert scan.newest(f"{topic.name}.missing", 3, required=False) == {}
        with pytest.raises(CliError, match=r"topic .*\.missing does not exist on Kafka at"):
            scan.bounds(f"{topic.name}.missing")
