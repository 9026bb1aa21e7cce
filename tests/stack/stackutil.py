"""Helpers shared by the stack tests: tail a topic without a group, submit prompts, spawn services."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from strata.bus import Publisher, topics
from strata.bus.security import kafka_connection
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2

TIMEOUT_S = 240.0


class Tail:
    """Reads a topic from "now" on, across all partitions, without a consumer group."""

    def __init__(self, infra: StrataSettings, topic: topics.Topic) -> None:
        self.topic = topic
        self.consumer = KafkaConsumer(**kafka_connection(infra), enable_auto_commit=False, group_id=None)
        partitions = self.consumer.partitions_for_topic(topic.name)
        assignment = [TopicPartition(topic.name, p) for p in sorted(partitions)]
        self.consumer.assign(assignment)
        self.consumer.seek_to_end(*assignment)
        for tp in assignment:
            self.consumer.position(tp)  # resolve "end" now, before anything is published

    def read(self, until, timeout_s: float = TIMEOUT_S) -> list:
        seen: list = []
        deadline = time.monotonic() + timeout_s
        while not until(seen):
            assert time.monotonic() < deadline, f"{self.topic.name}: condition not reached; saw {len(seen)} events"
            for records in self.consumer.poll(timeout_ms=500).values():
                seen.extend(self.topic.message_type.FromString(r.value) for r in records)
        return seen

    def drain(self, seconds: float) -> list:
        """Everything that arrives within ``seconds`` (to catch late duplicates)."""
        seen: list = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for records in self.consumer.poll(timeout_ms=250).values():
                seen.extend(self.topic.message_type.FromString(r.value) for r in records)
        return seen

    def close(self) -> None:
        self.consumer.close()


def submit(infra: StrataSettings, texts: list[str], tier: int = common_pb2.TIER_LEVEL_0,
           record: tuple[float, float] | None = None) -> dict[str, str]:
    """Store prompts and publish them to a tier's topic, each with the neighbourhood's Level-1 ``record``
    (labelled, bad) when given, as the scheduler routes it; returns request_id -> prompt hash."""
    store = ContentStore.from_url(infra.redis_address, infra.content_ttl_s, infra.content_max_bytes)
    publisher = Publisher(infra, client_id="test-submit")
    requests = {}
    try:
        for text in texts:
            routed = events_pb2.PromptRouted(prompt_hash=store.put(text), tier=tier, n_samples=1,
                                             request_id=uuid.uuid4().hex, decision=common_pb2.DECISION_LEVEL_1)
            routed.routed_at.GetCurrentTime()
            if record is not None:
                routed.level1_record.labelled, routed.level1_record.bad = record
            publisher.publish(topics.prompts_topic(tier), routed)
            requests[routed.request_id] = routed.prompt_hash
        publisher.flush()
    finally:
        publisher.close()
    return requests


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a service process with its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
