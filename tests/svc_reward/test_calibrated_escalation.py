"""Escalation on the light RM's calibrated score: ``decide`` compares what it is given and names both
scores; the worker compares the calibrated one (``use_calibration``) and still publishes the raw one."""

from __future__ import annotations

import uuid

import pytest
import redis

from strata import ledger
from strata.bus import Delivery, topics
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from svc_reward.config import RewardSettings
from svc_reward.decide import BRIEF_ESCALATION_THRESHOLD, decide, describe_threshold, escalation_threshold
from svc_reward.models import Scores
from svc_reward.worker import RewardWorker


def test_decide_names_the_calibrated_and_the_raw_reward() -> None:
    low = decide(1, 2.10, False, 3.2, raw=2.71)
    assert (low.final, low.escalate) == (False, True)
    assert low.reason == "light RM calibrated reward 2.10 (raw 2.71) < 3.2"
    high = decide(1, 3.5, False, 3.2, raw=2.9)  # the calibrated reward decides; raw is only named
    assert (high.final, high.escalate) == (True, False)
    assert high.reason == "light RM calibrated reward 3.50 (raw 2.90) >= 3.2"
    assert decide(1, 2.71, False, 3.2).reason == "light RM reward 2.71 < 3.2"


# Per answer: raw score, calibrated score. With the calibration the first escalates and the second is
# final; on raw scores (threshold 3.2) it is the other way round.
RAW_CALIBRATED = {"first": (3.5, 2.0), "second": (2.5, 4.0)}


class CalibratedScores:
    has_strong = False

    def __init__(self, stored_threshold: float | None = None) -> None:
        self.stored_threshold = stored_threshold  # the threshold stored with the calibration

    def score(self, prompts: list[str], responses: list[str], strong: bool = False) -> Scores:
        pairs = [RAW_CALIBRATED[r.split()[0]] for r in responses]
        return Scores([raw for raw, _ in pairs], [0.0] * len(pairs), "light-test",
                      [ledger.Charge("rm_light", 1)] * len(pairs), [cal for _, cal in pairs], self.stored_threshold)


class RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[tuple[str, object]] = []

    def publish(self, topic: object, message: object) -> None:
        self.published.append((topic.name, message))  # type: ignore[attr-defined]

    def wait(self, futures: object) -> None:
        pass

    def of(self, topic: object) -> list:
        return [m for t, m in self.published if t == topic.name]  # type: ignore[attr-defined]


def _run(infra: StrataSettings, client: redis.Redis, use_calibration: bool, stored_threshold: float | None = None,
         **settings_fields: object) -> RecordingPublisher:
    store = ContentStore(client, infra.content_ttl_s, infra.content_max_bytes)
    events = [events_pb2.RolloutGenerated(prompt_hash=store.put(f"Why is the sky blue? {uuid.uuid4()}"),
                                          response_hash=store.put(f"{name} answer {uuid.uuid4()}"),
                                          tier=common_pb2.TIER_LEVEL_1, request_id=f"r-{uuid.uuid4().hex[:8]}")
              for name in RAW_CALIBRATED]
    publisher = RecordingPublisher()
    # No answer drawn for annotation: a random response hash would be 5 % of the time, and the draw
    # adds ", sampled for annotation" to the reason these tests read.
    fields = {"annotate_level1_share": 0.0, **settings_fields}
    settings = RewardSettings(**{**infra.model_dump(), **fields}, use_calibration=use_calibration)
    worker = RewardWorker(settings, CalibratedScores(stored_threshold), store, client,  # type: ignore[arg-type]
                          publisher)
    worker.handle_batch([Delivery(topics.ROLLOUTS_GENERATED, e, None, 0, i, 1, 0) for i, e in enumerate(events)])
    return publisher


@pytest.mark.integration
def test_the_worker_escalates_on_the_calibrated_score_and_publishes_the_raw_one(
    infra: StrataSettings, redis_client: redis.Redis,
) -> None:
    calibrated = _run(infra, redis_client, use_calibration=True)
    assert [(m.reward, m.final, m.escalated) for m in calibrated.of(topics.REWARDS_SCORED)] == [
        (3.5, False, True), (2.5, True, False)]
    assert [m.reward for m in calibrated.of(topics.ROLLOUT_LOG)] == [2.5]  # raw, for the learner and skipping
    [escalation] = calibrated.of(topics.PROMPTS_LEVEL2)
    assert escalation.reason == "escalated: light RM calibrated reward 2.00 (raw 3.50) < 3.2"

    raw = _run(infra, redis_client, use_calibration=False)
    assert [(m.reward, m.final, m.escalated) for m in raw.of(topics.REWARDS_SCORED)] == [
        (3.5, True, False), (2.5, False, True)]
    assert [m.reason for m in raw.of(topics.PROMPTS_LEVEL2)] == ["escalated: light RM reward 2.50 < 3.2"]


@pytest.mark.integration
def test_the_threshold_stored_with_the_calibration_is_served_unless_one_is_set(
    infra: StrataSettings, redis_client: redis.Redis,
) -> None:
    def routed(publisher: RecordingPublisher) -> list[tuple[bool, bool]]:
        return [(m.final, m.escalated) for m in publisher.of(topics.REWARDS_SCORED)]

    # Calibrated scores 2.0 and 4.0: the stored 3.0 escalates the first; the brief's 3.2 would too, so
    # the stored 1.5 shows the stored one is what decides.
    assert routed(_run(infra, redis_client, True, stored_threshold=3.0)) == [(False, True), (True, False)]
    stored = _run(infra, redis_client, True, stored_threshold=1.5)
    assert routed(stored) == [(True, False), (True, False)]
    assert [m.reward for m in stored.of(topics.ROLLOUT_LOG)] == [3.5, 2.5]
    # A threshold set in the settings wins over the stored one.
    assert routed(_run(infra, redis_client, True, stored_threshold=1.5, escalation_threshold=2.5)) == [
        (False, True), (True, False)]
    # Raw scores compared: the stored threshold is on the calibrated scale, so the brief's applies.
    assert routed(_run(infra, redis_client, False, stored_threshold=1.5)) == [(True, False), (False, True)]


def test_the_threshold_served_is_the_set_one_then_the_stored_one_then_the_briefs() -> None:
    assert escalation_threshold(2.5, 1.5) == 2.5
    assert escalation_threshold(None, 1.5) == 1.5
    assert escalation_threshold(None, None) == BRIEF_ESCALATION_THRESHOLD == 3.2
    assert describe_threshold(None, True, 2.146) == (
        "escalating Level-1 answers whose calibrated light-RM reward is under 2.146, the threshold stored with the "
        "light RM's calibration")
    assert describe_threshold(2.5, False, 2.146).startswith(
        "escalating Level-1 answers whose raw light-RM reward is under 2.5, set")
    assert "under 3.2, the brief's" in describe_threshold(None, True, None)
    assert "raw light-RM reward is under 3.2, the brief's" in describe_threshold(None, False, 2.146)
