"""An escalation is claimed only once Kafka acknowledged it: a publish that fails leaves it to the
redelivered rollout instead of losing it (issue 23)."""

from __future__ import annotations

import uuid

import pytest

from strata import ledger
from strata.bus import Delivery, topics
from strata.bus.producer import PublishError
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from svc_reward.config import RewardSettings
from svc_reward.models import Scores
from svc_reward.worker import RewardWorker, escalation_key

pytestmark = pytest.mark.integration


class LowScores:
    """Every response scores 1.0: under the escalation threshold, so each Level-1 sample escalates."""

    has_strong = False

    def score(self, prompts, responses, strong=False) -> Scores:
        return Scores([1.0] * len(responses), [0.0] * len(responses), "light-test",
                      [ledger.Charge("rm_light", 1)] * len(responses))


class FlakyPublisher:
    """Records what is published; the acknowledgement fails while ``broken``."""

    def __init__(self) -> None:
        self.published: list[tuple[str, object]] = []
        self.broken = True

    def publish(self, topic, message):
        self.published.append((topic.name, message))

    def wait(self, futures) -> None:
        if self.broken:
            raise PublishError("event not acknowledged by Kafka: KafkaTimeoutError")

    def escalations(self) -> list[events_pb2.PromptRouted]:
        return [m for t, m in self.published if t == topics.PROMPTS_LEVEL2.name]  # type: ignore[misc]


def test_a_failed_publish_leaves_the_escalation_to_the_redelivery(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    prompt = store.put(f"How do tides work? {uuid.uuid4()}")
    request = f"req-{uuid.uuid4().hex[:8]}"
    samples = [events_pb2.RolloutGenerated(prompt_hash=prompt, response_hash=store.put(f"Moon {i} {uuid.uuid4()}"),
                                           tier=common_pb2.TIER_LEVEL_1, request_id=request, sample_index=i)
               for i in range(2)]
    publisher = FlakyPublisher()
    worker = RewardWorker(RewardSettings(**infra.model_dump()), LowScores(), store, redis_client,  # type: ignore[arg-type]
                          publisher)  # type: ignore[arg-type]
    deliveries = [Delivery(topics.ROLLOUTS_GENERATED, e, None, 0, i, 1, 0) for i, e in enumerate(samples)]
    escalations_before = int(redis_client.hget(ledger.COUNTS_KEY, "escalations") or 0)

    with pytest.raises(PublishError):
        worker.handle_batch(deliveries)
    assert len(publisher.escalations()) == 1  # two low samples of one request: one escalation
    assert not redis_client.exists(escalation_key(samples[0]))  # not claimed: it may not be on Kafka

    publisher.broken, publisher.published = False, []
    worker.handle_batch(deliveries)  # the redelivery
    assert [(e.prompt_hash, e.request_id) for e in publisher.escalations()] == [(prompt, request)]
    assert redis_client.exists(escalation_key(samples[0]))
    assert int(redis_client.hget(ledger.COUNTS_KEY, "escalations") or 0) == escalations_before + 1

    later = events_pb2.RolloutGenerated(prompt_hash=prompt, response_hash=store.put(f"late {uuid.uuid4()}"),
                                        tier=common_pb2.TIER_LEVEL_1, request_id=request, sample_index=2)
    publisher.published = []
    worker.handle_batch([Delivery(topics.ROLLOUTS_GENERATED, later, None, 0, 2, 1, 0)])
    assert publisher.escalations() == []  # claimed: a later sample of the request does not escalate again


def test_a_level2_reward_awaiting_annotation_hands_its_event_to_the_annotation_service(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    sample = events_pb2.RolloutGenerated(prompt_hash=store.put(f"Why is the sky blue? {uuid.uuid4()}"),
                                         response_hash=store.put(f"Rayleigh scattering. {uuid.uuid4()}"),
                                         tier=common_pb2.TIER_LEVEL_2, request_id="r-l2", sample_index=0)
    publisher = FlakyPublisher()
    publisher.broken = False
    settings = RewardSettings(**{**infra.model_dump(), "await_annotation": True})
    worker = RewardWorker(settings, LowScores(), store, redis_client, publisher)  # type: ignore[arg-type]
    worker.handle_batch([Delivery(topics.ROLLOUTS_GENERATED, sample, None, 0, 0, 1, 0)])
    [scored] = [m for t, m in publisher.published if t == topics.REWARDS_SCORED.name]
    [request] = [m for t, m in publisher.published if t == topics.ANNOTATIONS_REQUESTED.name]
    assert (scored.final, scored.awaiting_annotation) == (False, True)  # type: ignore[attr-defined]
    assert request.provisional == scored  # type: ignore[attr-defined]
    assert not [t for t, _ in publisher.published if t == topics.ROLLOUT_LOG.name]  # logged once final


def test_a_sampled_level1_answer_is_annotated_without_awaiting_the_human(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    sample = events_pb2.RolloutGenerated(prompt_hash=store.put(f"Why do cats purr? {uuid.uuid4()}"),
                                         response_hash=store.put(f"Nobody knows. {uuid.uuid4()}"),
                                         tier=common_pb2.TIER_LEVEL_1, request_id=f"r-{uuid.uuid4().hex[:8]}")
    publisher = FlakyPublisher()
    publisher.broken = False
    settings = RewardSettings(**{**infra.model_dump(), "await_annotation": True, "annotate_level1_share": 1.0})
    worker = RewardWorker(settings, LowScores(), store, redis_client, publisher)  # type: ignore[arg-type]
    worker.handle_batch([Delivery(topics.ROLLOUTS_GENERATED, sample, None, 0, 0, 1, 0)])
    [scored] = [m for t, m in publisher.published if t == topics.REWARDS_SCORED.name]
    [request] = [m for t, m in publisher.published if t == topics.ANNOTATIONS_REQUESTED.name]
    assert (scored.final, scored.escalated, scored.awaiting_annotation) == (False, True, False)  # type: ignore[attr-defined]
    assert request.provisional == scored and "sampled for annotation" in request.reason  # type: ignore[attr-defined]
    assert len(publisher.escalations()) == 1  # routed as without the draw
