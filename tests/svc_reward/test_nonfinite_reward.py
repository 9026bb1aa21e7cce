"""A reward model that answers NaN for one response: that rollout alone is dead-lettered, before
anything of its batch is published, so a NaN never reaches the learner."""

from __future__ import annotations

import uuid

import pytest
from recording import RecordingPublisher

from strata import ledger
from strata.bus import Delivery, PoisonMessageError, topics
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from svc_reward.config import RewardSettings
from svc_reward.models import Scores
from svc_reward.worker import RewardWorker, done_key

pytestmark = pytest.mark.integration


class NanForOne:
    """Scores every response 3.0 except the one containing "broken", which gets NaN."""

    has_strong = False

    def score(self, prompts, responses, strong=False) -> Scores:
        rewards = [float("nan") if "broken" in r else 3.0 for r in responses]
        return Scores(rewards, [0.0] * len(responses), "light-test", [ledger.Charge("rm_light", 1)] * len(responses))


def test_a_nan_reward_is_refused_before_its_batch_mates_are_published(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    prompt = store.put(f"What is rain? {uuid.uuid4()}")
    events = [events_pb2.RolloutGenerated(prompt_hash=prompt, response_hash=store.put(f"{text} {uuid.uuid4()}"),
                                          tier=common_pb2.TIER_LEVEL_1, request_id=f"r{i}", sample_index=i)
              for i, text in enumerate(["Water falling from clouds.", "broken answer"])]
    publisher = RecordingPublisher()
    worker = RewardWorker(RewardSettings(**infra.model_dump()), NanForOne(), store, redis_client,  # type: ignore[arg-type]
                          publisher)  # type: ignore[arg-type]
    deliveries = [Delivery(topics.ROLLOUTS_GENERATED, e, None, 0, i, 1, 0) for i, e in enumerate(events)]
    with pytest.raises(PoisonMessageError, match="not a finite number"):
        worker.handle_batch(deliveries)
    assert publisher.published == []  # the bus now handles them one by one
    worker.handle_batch(deliveries[:1])
    assert [(t, m.reward) for t, m in publisher.published if t == topics.REWARDS_SCORED.name] == [
        (topics.REWARDS_SCORED.name, 3.0)]
    with pytest.raises(PoisonMessageError):
        worker.handle_batch(deliveries[1:])  # dead-lettered by the bus: the learner never sees a NaN
    assert not redis_client.exists(done_key(events[1]))
