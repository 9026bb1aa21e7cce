"""The reward worker's live audit against real Redis: audited Level-1 answers are scored by the strong RM,
tallied per policy version once (a redelivery adds nothing), and their strong scoring is booked at tier 1."""

from __future__ import annotations

import random
import uuid

import pytest
from recording import RecordingPublisher

from strata import ledger
from strata.audit import (
    HUMAN_AUDIT,
    MIXED_RMS,
    STRONG_AUDIT,
    AuditJudge,
    AuditLabel,
    AuditTally,
    add_labels,
    add_to,
    defence_kl_scale,
    estimates,
    read_labels,
    read_versions,
)
from strata.bus import Delivery, topics
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from strata_tools.stack.control import live_audit_lines
from svc_reward import audit_store
from svc_reward.config import RewardSettings
from svc_reward.models import Scores
from svc_reward.worker import RewardWorker

pytestmark = pytest.mark.integration

LIGHT, STRONG = 3.5, 1.0  # the light RM passes every answer the strong one calls bad


class TwoJudges:
    has_strong = True

    def __init__(self) -> None:
        self.strong_calls = 0

    def score(self, prompts, responses, strong=False) -> Scores:
        if strong:
            self.strong_calls += len(responses)
            return Scores([STRONG] * len(responses), [0.0] * len(responses), "strong-test",
                          [ledger.Charge("rm_strong", 2, 10, 0.01, 100.0)] * len(responses))
        return Scores([LIGHT] * len(responses), [0.0] * len(responses), "light-test",
                      [ledger.Charge("rm_light", 1, 10, 0.001, 10.0)] * len(responses))


def rollouts(store: ContentStore, n: int, version: int) -> list[events_pb2.RolloutGenerated]:
    prompt = store.put(f"How do tides work? {uuid.uuid4()}")
    request = f"req-{uuid.uuid4().hex[:8]}"
    return [events_pb2.RolloutGenerated(prompt_hash=prompt, response_hash=store.put(f"Moon {i} {uuid.uuid4()}"),
                                        tier=common_pb2.TIER_LEVEL_1, request_id=request, sample_index=i,
                                        policy_version=version)
            for i in range(n)]


def strong_items_at_tier_1(client) -> float:
    return sum(c.items for c in ledger.read_stages(client) if (c.stage, c.tier) == ("rm_strong", 1))


def test_audited_answers_are_tallied_once_per_version_and_booked_at_tier_1(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    version = random.randrange(10**6, 10**9)  # a version no other test writes
    settings = RewardSettings(**infra.model_dump(), audit_level1_share=1.0, escalation_threshold=2.0,
                              escalate_on_caution=False, annotate_level1_share=0.0)
    models = TwoJudges()
    worker = RewardWorker(settings, models, store, redis_client, RecordingPublisher())  # type: ignore[arg-type]
    events = rollouts(store, 4, version)
    deliveries = [Delivery(topics.ROLLOUTS_GENERATED, e, None, 0, i, 1, 0) for i, e in enumerate(events)]
    strong_tier1_before = strong_items_at_tier_1(redis_client)

    worker.handle_batch(deliveries)
    worker.handle_batch(deliveries)  # redelivered: done keys skip it, the tally does not move

    stored = AuditTally.from_fields(redis_client.hgetall(STRONG_AUDIT.tally_key(version)))
    assert stored.n == 4 and models.strong_calls == 4
    assert stored.gap_sum == pytest.approx(4 * (LIGHT - STRONG))
    assert (stored.bad, stored.passed, stored.passed_bad, stored.bad_escalated) == (4, 4, 4, 0)
    assert stored.rms == "light-test|strong-test"  # the RMs behind the gap: a swap starts the baseline again
    assert version in [v for v, _ in read_versions(redis_client, STRONG_AUDIT)]
    assert strong_items_at_tier_1(redis_client) == strong_tier1_before + 4


def test_a_version_scored_across_a_swap_reads_as_mixed(redis_client) -> None:
    judge = AuditJudge("test", f"strata:test:audit:{uuid.uuid4().hex[:8]}", "test audit", "a test", "test", "-")
    try:
        # Replicas swap at slightly different times and people's scores close in any order: B, A, B is mixed too.
        for rms in ("light-b|strong-x", "light-a|strong-x", "light-b|strong-x"):
            with redis_client.pipeline(transaction=True) as pipe:
                add_to(pipe, judge, {5: AuditTally.of(3.0, 2.0, False, False, rms),
                                     6: AuditTally.of(3.0, 2.0, False, False, "light-b|strong-x")}, 60)
                pipe.execute()
        assert [(v, t.n, t.rms) for v, t in read_versions(redis_client, judge)] == [
            (5, 3, MIXED_RMS), (6, 3, "light-b|strong-x")]
    finally:
        redis_client.delete(judge.versions_key, judge.tally_key(5), judge.tally_key(6))


def test_no_audit_without_a_share_or_a_strong_rm(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    version = random.randrange(10**6, 10**9)
    models = TwoJudges()
    worker = RewardWorker(RewardSettings(**infra.model_dump(), audit_level1_share=0.0), models, store,
                          redis_client, RecordingPublisher())  # type: ignore[arg-type]
    events = rollouts(store, 3, version)
    worker.handle_batch([Delivery(topics.ROLLOUTS_GENERATED, e, None, 0, i, 1, 0) for i, e in enumerate(events)])
    assert models.strong_calls == 0 and not redis_client.exists(STRONG_AUDIT.tally_key(version))


class DriftingJudges:
    """A scripted hacking stream: the light RM rates the answers of each newer policy version 0.2 higher,
    the strong RM rates them all alike."""

    has_strong = True
    strong_reward = 2.5

    def score(self, prompts, responses, strong=False) -> Scores:
        if strong:
            return Scores([self.strong_reward] * len(responses), [0.0] * len(responses), "strong-test",
                          [ledger.Charge("rm_strong", 2, 10, 0.01, 100.0)] * len(responses))
        light = [2.5 + 0.2 * int(r.split()[0].lstrip("v")) for r in responses]
        return Scores(light, [0.0] * len(responses), "light-test",
                      [ledger.Charge("rm_light", 1, 10, 0.001, 10.0)] * len(responses))


def defence_worker(infra, redis_client, judges, defence: bool) -> tuple[RewardWorker, ContentStore, RecordingPublisher,
                                                                          RewardSettings]:
    """A reward worker auditing every Level-1 answer, alarming on 4 audits a window and defending in steps of 0.5;
    the audits' and the defence's keys cleared first (they are the stack's, not a test's)."""
    for key in (STRONG_AUDIT.versions_key, HUMAN_AUDIT.versions_key, audit_store.DEFENCE_KEY,
                audit_store.DECISIONS_KEY, audit_store.REDISTIL_KEY, STRONG_AUDIT.labels_key):
        redis_client.delete(key)
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    settings = RewardSettings(**infra.model_dump(), audit_level1_share=1.0, hacking_min_audits=4, audit_refresh_s=0,
                              escalation_threshold=1.0, escalate_on_caution=False, annotate_level1_share=0.0,
                              hacking_defence=defence, defence_share_step=0.5, defence_max_share=0.5)
    publisher = RecordingPublisher()
    return RewardWorker(settings, judges, store, redis_client, publisher), store, publisher, settings


def policy_batch(store: ContentStore, step: int, version: int) -> list[Delivery]:
    """Four Level-1 answers of one prompt by policy ``version``, their texts opening ``v<step>`` (the scripted
    judges read it)."""
    prompt = store.put(f"How do tides work? {uuid.uuid4()}")
    events = [events_pb2.RolloutGenerated(
        prompt_hash=prompt, response_hash=store.put(f"v{step} the Moon pulls {i} {uuid.uuid4()}"),
        tier=common_pb2.TIER_LEVEL_1, request_id=f"req-{uuid.uuid4().hex[:8]}", sample_index=i,
        policy_version=version) for i in range(4)]
    return [Delivery(topics.ROLLOUTS_GENERATED, e, None, 0, i, 1, 0) for i, e in enumerate(events)]


@pytest.mark.parametrize("defence", [True, False])
def test_the_defence_answers_a_hacking_stream_with_the_strong_rms_reward(infra, redis_client, defence) -> None:
    worker, store, publisher, settings = defence_worker(infra, redis_client, DriftingJudges(), defence)
    base = random.randrange(10**6, 10**9)  # versions no other test audits (their tallies would join these)
    scorers = []
    for step in range(6):
        publisher.published.clear()
        worker.handle_batch(policy_batch(store, step, base + step + 1))
        rewards = [m for t, m in publisher.published if t == topics.REWARDS_SCORED.name]
        scorers.append({(m.scorer, round(m.reward, 3)) for m in rewards})

    labels = read_labels(redis_client, STRONG_AUDIT)
    assert len(labels) == 24  # every audited answer, labelled by the strong RM
    # Each label keeps the route and the strong RM's call as tallied (a tool checks the catch against them).
    tallies = [t for v, t in read_versions(redis_client, STRONG_AUDIT) if base < v <= base + 6]
    assert sum(bool(label.bad) for label in labels) == sum(t.bad for t in tallies)
    assert sum(label.escalated is False for label in labels) == sum(t.passed for t in tallies)
    light_only = {(common_pb2.SCORER_LIGHT, round(2.5 + 0.2 * s, 3)) for s in range(6)}
    if not defence:
        assert all(found <= light_only for found in scorers) and not redis_client.exists(audit_store.REDISTIL_KEY)
        return
    # v1 is the baseline; the gap has grown 0.4 > 0.25 by v3: from the next batch on PPO gets the strong reward.
    assert scorers[0] == {(common_pb2.SCORER_LIGHT, 2.5)}
    assert scorers[-1] == {(common_pb2.SCORER_STRONG, 2.5)}
    state = audit_store.read_defence(redis_client)
    assert state.share == 0.5 and state.redistil_requested
    decisions = audit_store.read_decisions(redis_client)
    # The first step (oldest) raised the share and asked for the re-distillation; each newer version the alarm
    # still fires on brakes the learner's KL coefficient once more.
    assert "re-distillation" in decisions[-1]["decision"] and "0.00 -> 0.50" in decisions[-1]["decision"]
    braked = [d["decision"].split("KL coefficient ")[1][:8] for d in decisions[::-1]]
    assert braked == ["x1 -> x2", "x2 -> x4", "x4 -> x8"]
    assert state.kl_scale == 8.0 and defence_kl_scale(redis_client) == 8.0  # what the learner reads
    request = audit_store.redistil_request(redis_client)
    assert request is not None and request["policy_version"] == base + 3

    # `strata status` reads the alarm's thresholds the service wrote, not its own environment's (30 audits).
    assert audit_store.read_thresholds(redis_client) == audit_store.ServedThresholds(4, settings.hacking_gap_bound,
                                                                                     True)
    status = "\n".join(live_audit_lines(infra))
    assert "hacking alarm" in status and "no estimate yet" not in status, status


class CopiedJudges:
    """The strong RM is the light RM's copy: both rate each newer policy version's answers 0.2 higher."""

    has_strong = True

    def score(self, prompts, responses, strong=False) -> Scores:
        rewards = [2.5 + 0.2 * int(r.split()[0].lstrip("v")) + (0.1 if i % 2 else -0.1)
                   for i, r in enumerate(responses)]
        name, charge = ("strong-test", ledger.Charge("rm_strong", 2, 10, 0.01, 100.0)) if strong else \
            ("light-test", ledger.Charge("rm_light", 1, 10, 0.001, 10.0))
        return Scores(rewards, [0.0] * len(responses), name, [charge] * len(responses))


def test_people_raise_the_alarm_that_a_copy_of_the_judge_cannot(infra, redis_client) -> None:
    worker, store, _, _ = defence_worker(infra, redis_client, CopiedJudges(), defence=True)
    base = random.randrange(10**6, 10**9)
    for step in range(6):
        version = base + step + 1
        # The desk's scores of this version's answers: people rate them alike while the light RM climbs.
        people = AuditTally()
        for i in range(4):
            people = people + AuditTally.of(2.5 + 0.2 * step + (0.1 if i % 2 else -0.1), 2.5, False, False)
        with redis_client.pipeline(transaction=True) as pipe:
            add_to(pipe, HUMAN_AUDIT, {version: people}, 3600)
            pipe.execute()
        worker.handle_batch(policy_batch(store, step, version))

    strong_gaps = [estimates(t).gap for _, t in read_versions(redis_client, STRONG_AUDIT)]
    assert len(strong_gaps) == 6 and all(abs(g) < 1e-9 for g in strong_gaps)  # the copy sees nothing
    # Its reward would not move PPO: the share holds, and the re-distillation learns from people's scores.
    state = audit_store.read_defence(redis_client)
    assert state.share == 0.0 and state.redistil_requested
    decisions = audit_store.read_decisions(redis_client)
    assert "than people" in decisions[-1]["decision"] and "share holds" in decisions[-1]["decision"]
    assert all("strong-RM share" not in d["decision"] for d in decisions)
    assert state.kl_scale > 1  # the brake needs no better judge
    request = audit_store.redistil_request(redis_client)
    assert request is not None and request["labels"] == "people"
    status = "\n".join(live_audit_lines(infra))
    assert "human audit" in status and "(human) FIRES" in status and "than people" in status, status
    redis_client.delete(HUMAN_AUDIT.versions_key)  # the stack's keys: leave no judge behind for other tests


def test_audit_labels_written_before_the_route_was_kept_read_back_without_it(redis_client) -> None:
    key = STRONG_AUDIT.labels_key
    redis_client.delete(key)
    redis_client.xadd(key, {"prompt_hash": "p", "response_hash": "r", "strong": "2.5", "light": "3.0",
                            "policy_version": "4"})
    with redis_client.pipeline(transaction=True) as pipe:
        add_labels(pipe, STRONG_AUDIT, [AuditLabel("p", "r2", 1.0, 3.5, 5, True, False)], max_kept=10)
        pipe.execute()
    try:
        old, new = read_labels(redis_client, STRONG_AUDIT)
    finally:
        redis_client.delete(key)
    assert (old.judge, old.escalated, old.bad) == (2.5, None, None)
    assert new == AuditLabel("p", "r2", 1.0, 3.5, 5, True, False)
