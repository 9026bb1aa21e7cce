"""The critical-path trace reading a stack's events off the real broker (``strata_tools.trace.read_events``):
a scripted update on topics of its own (the stack's policy topic is followed by other tests' services)."""

from __future__ import annotations

import time
import uuid

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from strata.bus import Publisher, Topic, topics
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2
from strata_tools.trace import read_events, trace

pytestmark = pytest.mark.integration


def _at(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def test_a_scripted_update_is_traced_from_the_topics(infra: StrataSettings) -> None:
    own = uuid.uuid4().hex[:8]
    names = [Topic(f"test.trace.{own}.{t.name}", t.message_type, t.key_field, compacted=t.compacted)
             for t in (topics.POLICY_UPDATED, topics.REWARDS_SCORED, topics.ROLLOUTS_GENERATED, topics.PROMPTS_LEVEL1)]
    ensure_topics(infra, 2, topics=names)
    policy, rewards, rollouts, routed = names
    t0 = time.time()
    prompt, response, request = content_hash(f"p {uuid.uuid4()}"), content_hash(f"r {uuid.uuid4()}"), "req-trace"
    publisher = Publisher(infra, client_id="test-trace")
    try:
        events = [
            (policy, events_pb2.PolicyUpdated(policy_version=7, published_at=_at(t0), checksum="0" * 64,
                                                             lineage=f"trace-{uuid.uuid4().hex[:6]}")),
            (routed, events_pb2.PromptRouted(prompt_hash=prompt, request_id=request,
                                                            tier=common_pb2.TIER_LEVEL_1, submitted_at=_at(t0 + 1),
                                                            routed_at=_at(t0 + 2))),
            (rollouts, events_pb2.RolloutGenerated(
                prompt_hash=prompt, response_hash=response, request_id=request, tier=common_pb2.TIER_LEVEL_1,
                routed_at=_at(t0 + 2), generated_at=_at(t0 + 5))),
            (rewards, events_pb2.RewardScored(
                prompt_hash=prompt, response_hash=response, request_id=request, tier=common_pb2.TIER_LEVEL_1,
                final=True, generated_at=_at(t0 + 5), scored_at=_at(t0 + 6))),
            (policy, events_pb2.PolicyUpdated(
                policy_version=8, published_at=_at(t0 + 10), checksum="0" * 64,
                metrics={"perf/update_seconds": 3.0, "sync/seconds": 0.5})),
        ]
        publisher.wait([publisher.publish(topic, event) for topic, event in events])
    finally:
        publisher.close()

    run = trace(*read_events(infra, since=t0, newest=500, names=names))
    [update] = run.updates
    assert update.version == 8 and update.wall == pytest.approx(10.0)
    expected = {"driver": 1.0, "scheduler+probe": 1.0, "generation": 3.0, "reward": 1.0, "batching": 0.5,
                "training": 3.0, "sync": 0.5}
    assert update.seconds == pytest.approx(expected)
