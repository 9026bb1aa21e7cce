"""The reward worker keeps the escalation signals of the Level-1 answers it sends to people, so that a refresh
turn can refit the rule on their labels (``svc_reward.signals_store``); real Redis."""

from __future__ import annotations

import uuid

import pytest
from recording import RecordingPublisher

from strata import ledger
from strata.bus import Delivery, topics
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from svc_reward.config import RewardSettings
from svc_reward.escalation_rule import EscalationRule, features
from svc_reward.models import Scores
from svc_reward.signals_store import SIGNALS_PREFIX, StoredSignals, read_signals

pytestmark = pytest.mark.integration


class HighScores:
    """Every response scores 4.0: above the threshold, so routing alone sends nothing to people."""

    has_strong = False

    def score(self, prompts, responses, strong=False) -> Scores:
        return Scores([4.0] * len(responses), [0.0] * len(responses), "light-test",
                      [ledger.Charge("rm_light", 1)] * len(responses))


def rollout(store: ContentStore, prompt: str, tier: int, i: int) -> events_pb2.RolloutGenerated:
    event = events_pb2.RolloutGenerated(
        prompt_hash=prompt, response_hash=store.put(f"An answer {i} {uuid.uuid4()}"), tier=tier,
        request_id=f"req-{uuid.uuid4().hex[:8]}", sample_index=0, response_tokens=30 + i, policy_version=3,
        sampling=common_pb2.SamplingParams(max_new_tokens=64))
    if i % 2 == 0:  # half carry the generator's confidence and the neighbourhood's record
        event.response_logprob_mean, event.response_logprob_min = -0.5 - i / 100, -4.0
        event.level1_record.labelled, event.level1_record.bad = 6.0, 2.0
    return event


def test_the_answers_sent_to_people_keep_their_signals_and_no_others(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    prompt = store.put(f"How do tides work? {uuid.uuid4()}")
    level1 = [rollout(store, prompt, common_pb2.TIER_LEVEL_1, i) for i in range(40)]
    level2 = [rollout(store, prompt, common_pb2.TIER_LEVEL_2, i) for i in range(4)]
    settings = RewardSettings(**infra.model_dump(), annotate_level1_share=0.5)
    recorder = RecordingPublisher()
    from svc_reward.worker import RewardWorker

    worker = RewardWorker(settings, HighScores(), store, redis_client, recorder)  # type: ignore[arg-type]
    deliveries = [Delivery(topics.ROLLOUTS_GENERATED, e, None, 0, i, 1, 0) for i, e in enumerate(level1 + level2)]
    worker.handle_batch(deliveries)

    requested = {m.response_hash for t, m in recorder.published if t == topics.ANNOTATIONS_REQUESTED.name
                 and m.tier == common_pb2.TIER_LEVEL_1}  # type: ignore[attr-defined]
    assert 5 < len(requested) < 35  # about half, drawn by response hash
    kept = read_signals(redis_client, [e.response_hash for e in level1 + level2])
    assert set(kept) == requested  # the drawn Level-1 answers, no Level-2 answer, nothing else
    for event in level1:
        if event.response_hash in kept:
            assert kept[event.response_hash] == StoredSignals.of(event)
            assert 0 < redis_client.ttl(SIGNALS_PREFIX + event.response_hash) <= infra.content_ttl_s

    # A refit reads the features the worker decided on: the rule's probability is the same either way.
    from svc_reward.worker import rule_verdict

    with_record = next(e for e in level1 if e.HasField("level1_record") and e.response_hash in kept)
    values = features(kept[with_record.response_hash].signals(3.1, 0.2, "an answer"))
    assert values["logprob_mean"] == pytest.approx(with_record.response_logprob_mean)
    assert values["record_bad"] == pytest.approx((2.0 + 1.0) / (6.0 + 5.0))
    rule = EscalationRule(("light", "logprob_mean", "record_bad"), (3.0, -0.5, 0.2), (1.0, 0.2, 0.1),
                          (-1.0, -0.5, 2.0), -1.0, 0.5, 0.9)
    verdict = rule_verdict(rule, with_record, 3.1, 0.2, "an answer")
    assert verdict is not None and verdict.probability == pytest.approx(rule.probability(values))


def test_stored_signals_round_trip_and_refuse_what_is_not_theirs(redis_client) -> None:
    bare = events_pb2.RolloutGenerated(tier=common_pb2.TIER_LEVEL_1, response_tokens=12)
    stored = StoredSignals.of(bare)
    assert (stored.logprob_mean, stored.record_labelled, stored.max_new_tokens) == (None, None, 0)
    assert StoredSignals.from_json(stored.to_json()) == stored
    with pytest.raises(ValueError, match="not stored escalation signals"):
        StoredSignals.from_json('{"logprob_mean": 1}')
    junk = f"junk-{uuid.uuid4().hex}"
    redis_client.set(SIGNALS_PREFIX + junk, b"not json", ex=60)
    assert read_signals(redis_client, [junk, f"absent-{uuid.uuid4().hex}"]) == {}
    assert read_signals(redis_client, []) == {}
