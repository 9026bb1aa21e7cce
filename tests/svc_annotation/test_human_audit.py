"""The human audit (issue 61): people's scores of Level-1 answers beside the light RM's reward of the same
answers, tallied per policy version once, where the reward service's alarm reads them."""

from __future__ import annotations

import random
import uuid

from test_service import Desk

from strata.audit import HUMAN_AUDIT, AuditTally, read_labels, read_versions
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from svc_annotation.core import Item, Score
from svc_annotation.store import Ready
from svc_annotation.worker import DeskLoop, HumanAudit, human_audit_of


def level1_request(content: ContentStore | None, version: int, light: float = 3.5, escalated: bool = False,
                   scorer: int = common_pb2.SCORER_LIGHT, tier: int = common_pb2.TIER_LEVEL_1
                   ) -> events_pb2.AnnotationRequested:
    """A Level-1 answer sent to the desk as the reward service sends its annotate_level1_share."""
    tag = uuid.uuid4().hex[:8]
    prompt = content.put(f"How do tides work? {tag}") if content else "a" * 64
    response = content.put(f"The Moon pulls the sea. {tag}") if content else "b" * 64
    provisional = events_pb2.RewardScored(
        prompt_hash=prompt, response_hash=response, tier=tier, policy_version=version, rm_version="light-test",
        reward=light, scorer=scorer, final=not escalated, escalated=escalated, request_id=f"req-{tag}")
    request = events_pb2.AnnotationRequested(prompt_hash=prompt, response_hash=response, tier=tier,
                                             policy_version=version, rm_version="light-test", model_reward=light,
                                             reason="level-1 answer, sampled for annotation")
    request.provisional.CopyFrom(provisional)
    return request


def closed(scores: tuple[float, ...], gold: bool = False) -> Ready:
    item = Item("i1", "a" * 64, "b" * 64, "req", 0, 1, 0.0, 10.0, False, "complete", 2.0 if gold else None)
    return Ready(item, tuple(Score(f"ann{i}", s, False, False, 1.0) for i, s in enumerate(scores)), frozenset(), 1.0)


def test_a_level1_answer_people_scored_is_one_audit_of_the_light_rm() -> None:
    found = human_audit_of(closed((1.0, 2.0)), level1_request(None, 7, light=3.5, escalated=True), bad_below=3.2)
    assert found is not None
    version, tally = found
    assert version == 7 and tally == AuditTally.of(3.5, 1.5, escalated=True, bad=True, rms="light-test")
    _, good = human_audit_of(closed((4.5,)), level1_request(None, 7), bad_below=3.2)  # type: ignore[misc]
    assert (good.bad, good.passed, good.strong_sum) == (0, 1, 4.5)
    # The defence published the strong RM's reward: the request still carries the light RM's, so it counts.
    defended = level1_request(None, 7, light=3.5, scorer=common_pb2.SCORER_STRONG)
    defended.provisional.reward, defended.provisional.rm_version = 2.0, "strong-test"
    assert human_audit_of(closed((1.0,)), defended, 3.2) == (7, AuditTally.of(3.5, 1.0, False, True, "light-test"))


def test_what_is_not_a_human_audit_of_the_light_rm() -> None:
    assert human_audit_of(closed(()), level1_request(None, 7), 3.2) is None  # expired unscored
    assert human_audit_of(closed((2.0,), gold=True), level1_request(None, 7), 3.2) is None
    assert human_audit_of(closed((2.0,)), level1_request(None, 7, tier=common_pb2.TIER_LEVEL_2), 3.2) is None
    assert human_audit_of(closed((2.0,)), None, 3.2) is None
    # A drifting annotator's scale is not the policy's quality: only the others' scores count.
    assert human_audit_of(closed((5.0, 1.0)), level1_request(None, 7), 3.2, frozenset({"ann0"})) == (
        7, AuditTally.of(3.5, 1.0, False, True, "light-test"))
    assert human_audit_of(closed((5.0,)), level1_request(None, 7), 3.2, frozenset({"ann0"})) is None


def test_the_desk_tallies_each_scored_level1_answer_once(infra, redis_client) -> None:
    content = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    desk = Desk(redis_client, content)
    desk.loop = DeskLoop(desk.store, desk.publisher, redis_client, "test", 0.05, 64, 30.0, [],
                         audit=HumanAudit(bad_below=3.2, ttl_s=3600, labels_kept=100))
    version = random.randrange(10**6, 10**9)  # a version no other test writes
    redis_client.delete(HUMAN_AUDIT.labels_key)
    requests = {}
    try:
        for score in (1.0, 4.0, 2.0):
            request = level1_request(content, version, light=3.5)
            requests[desk.queue(request)] = request
            offer = desk.next("ann")
            desk.score("ann", offer.item_id, score)
        desk.loop.step()
        tally = AuditTally.from_fields(redis_client.hgetall(HUMAN_AUDIT.tally_key(version)))
        assert tally.n == 3 and tally.light_sum == 3 * 3.5 and tally.strong_sum == 7.0
        assert (tally.bad, tally.passed, tally.passed_bad) == (2, 3, 2) and tally.rms == "light-test"
        assert version in [v for v, _ in read_versions(redis_client, HUMAN_AUDIT)]
        # One by one too: each answer's people's score, the light RM's, its route and the bad call.
        labels = read_labels(redis_client, HUMAN_AUDIT)
        assert sorted((label.judge, label.light, label.bad, label.escalated) for label in labels) == [
            (1.0, 3.5, True, False), (2.0, 3.5, True, False), (4.0, 3.5, False, False)]
        assert {label.response_hash for label in labels} == {r.response_hash for r in requests.values()}
        # A publishing pass that saw the items again (a second replica, a retry) claims each audit once.
        item_id, request = next(iter(requests.items()))
        item = desk.store.item(item_id)
        assert item is not None
        again = Ready(item, (Score("ann", 1.0, False, False, 1.0),), frozenset(), 1.0)
        desk.loop._feed_audit(again, request)
        assert AuditTally.from_fields(redis_client.hgetall(HUMAN_AUDIT.tally_key(version))) == tally
        assert len(read_labels(redis_client, HUMAN_AUDIT)) == 3
    finally:
        desk.close()
        redis_client.zrem(HUMAN_AUDIT.versions_key, str(version))  # the stack's key: leave it as found
        redis_client.delete(HUMAN_AUDIT.tally_key(version), HUMAN_AUDIT.labels_key)
