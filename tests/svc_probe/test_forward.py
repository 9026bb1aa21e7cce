from strata.v1 import common_pb2, events_pb2
from svc_probe.config import ProbeSettings
from svc_probe.core import ProbeResult
from svc_probe.worker import forward


def routed() -> events_pb2.PromptRouted:
    event = events_pb2.PromptRouted(prompt_hash="a" * 64, tier=common_pb2.TIER_LEVEL_0, n_samples=2,
                                    request_id="r1", decision=common_pb2.DECISION_LEVEL_1)
    event.sampling.temperature = 0.9
    return event


def test_confident_prompt_goes_to_level1_with_its_best_direction() -> None:
    result = ProbeResult((("give_code", 0.7), ("give_steps", 0.2), ("give_example", 0.05)), 0.7, 0.1, False, "")
    out = forward(routed(), result, ProbeSettings().forward_directions)
    assert out.tier == common_pb2.TIER_LEVEL_1
    assert [(d.name, round(d.score, 2)) for d in out.directions] == [("give_code", 0.7)]  # the default: one
    three = forward(routed(), result, 3)
    assert [(d.name, round(d.score, 2)) for d in three.directions] == [
        ("give_code", 0.7), ("give_steps", 0.2), ("give_example", 0.05)]
    assert not forward(routed(), result, 0).directions  # a bare prompt
    assert not out.caution
    assert (out.n_samples, out.request_id, out.sampling.temperature) == (2, "r1", routed().sampling.temperature)


def test_cautious_prompt_goes_to_level2_marked_as_escalated() -> None:
    result = ProbeResult((("explain_principle", 0.5),), 0.5, 0.9, True, "risk topic (p=0.90)")
    out = forward(routed(), result, 1)
    assert out.tier == common_pb2.TIER_LEVEL_2
    assert out.decision == common_pb2.DECISION_LEVEL_2
    assert out.escalated_from == common_pb2.TIER_LEVEL_0
    assert out.caution and "risk topic" in out.reason


def test_a_cautious_prompt_of_a_plain_rollout_stays_at_level1_still_flagged() -> None:
    result = ProbeResult((("explain_principle", 0.5),), 0.5, 0.9, True, "risk topic (p=0.90)")
    plain = routed()
    plain.level1_only = True  # the scheduler's tiering is off
    out = forward(plain, result, 1)
    assert out.tier == common_pb2.TIER_LEVEL_1 and out.decision == common_pb2.DECISION_LEVEL_1
    assert out.escalated_from == common_pb2.TIER_UNSPECIFIED
    assert out.caution and "risk topic" in out.reason and out.level1_only
