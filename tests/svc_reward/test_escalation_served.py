"""Which escalation the reward service serves, said once per light RM version: in its log, in Redis for
`strata status` and the demo's report (issue 61: a rule is stored and hot-swapped with its light RM, and an
operator must see whether the rule or the threshold decides)."""

from __future__ import annotations

import uuid

import pytest
from recording import RecordingPublisher

from strata import ledger
from strata.bus import Delivery, topics
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from strata_tools.stack.control import live_audit_lines
from svc_reward import audit_store
from svc_reward.config import RewardSettings
from svc_reward.decide import describe_escalation, describe_threshold
from svc_reward.escalation_rule import EscalationRule
from svc_reward.models import Scores
from svc_reward.worker import RewardWorker

RULE = EscalationRule(("light", "record_bad"), (3.0, 0.2), (1.0, 0.1), (-1.0, 2.0), -1.0, 0.31, 0.9, "sum",
                      {"source": "strata rm refresh", "answers": 120, "combined_auc": 0.871})


def test_the_line_names_the_rule_and_what_decides_without_it() -> None:
    threshold = describe_threshold(2.5, False, None)
    assert describe_escalation(None, threshold) == threshold
    line = describe_escalation(RULE, threshold)
    assert line.startswith("escalating Level-1 answers by the learned rule on light, record_bad at P(bad) >= 0.310 "
                           "(fitted by strata rm refresh on 120 answers, out-of-fold AUC 0.871)")
    assert line.endswith(f"an answer missing one of its signals: {threshold}")
    bare = EscalationRule(("light",), (3.0,), (1.0,), (-1.0,), 0.0, 0.5, 0.9, fitted={"split": "fresh", "answers": 262})
    assert "(fitted by strata calibrate rule on the fresh split on 262 answers)" in describe_escalation(bare, threshold)


class Versioned:
    """Scores every answer 4.0 with the light RM ``version`` and its ``rule``; swapped by the test."""

    has_strong = False

    def __init__(self, version: str, rule: EscalationRule | None) -> None:
        self.version, self.rule = version, rule

    def score(self, prompts, responses, strong=False) -> Scores:
        return Scores([4.0] * len(responses), [0.0] * len(responses), self.version,
                      [ledger.Charge("rm_light", 1)] * len(responses), rule=self.rule)


@pytest.mark.integration
def test_the_worker_says_what_escalates_once_per_light_rm_and_status_shows_it(infra, redis_client) -> None:
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    prompt = store.put(f"How do tides work? {uuid.uuid4()}")

    def batch() -> list[Delivery]:
        event = events_pb2.RolloutGenerated(prompt_hash=prompt, response_hash=store.put(f"Moon {uuid.uuid4()}"),
                                            tier=common_pb2.TIER_LEVEL_1, request_id=uuid.uuid4().hex)
        return [Delivery(topics.ROLLOUTS_GENERATED, event, None, 0, 0, 1, 0)]

    models = Versioned(f"light-{uuid.uuid4().hex[:8]}", RULE)
    worker = RewardWorker(RewardSettings(**infra.model_dump()), models, store, redis_client,  # type: ignore[arg-type]
                          RecordingPublisher())  # type: ignore[arg-type]
    worker.handle_batch(batch())
    said = audit_store.read_escalation(redis_client)
    assert said is not None and said["rm_version"] == models.version
    assert "by the learned rule on light, record_bad at P(bad) >= 0.310" in said["line"]
    assert "raw light-RM reward is under 3.2, the brief's" in said["line"]  # for answers the rule cannot judge

    redis_client.delete(audit_store.ESCALATION_KEY)
    worker.handle_batch(batch())
    assert audit_store.read_escalation(redis_client) is None  # same version: said once, not per batch

    models.version, models.rule = f"light-{uuid.uuid4().hex[:8]}", None  # a swap to a version without a rule
    worker.handle_batch(batch())
    status = live_audit_lines(infra)
    assert status[0] == (f"escalation ({models.version}, the light RM in service): escalating Level-1 answers whose "
                         "raw light-RM reward is under 3.2, the brief's: the light RM has no calibrated threshold "
                         "(`strata calibrate escalation --write` stores one with it)")
