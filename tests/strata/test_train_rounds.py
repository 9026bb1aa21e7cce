from strata.train import request_done
from strata.v1 import common_pb2, events_pb2

L1, L2 = common_pb2.TIER_LEVEL_1, common_pb2.TIER_LEVEL_2


def ev(tier: int, final: bool, escalated: bool = False, scorer: int = common_pb2.SCORER_LIGHT):
    return events_pb2.RewardScored(tier=tier, final=final, escalated=escalated, scorer=scorer)


def test_skip_is_done_with_its_reused_reward() -> None:
    assert request_done([ev(L1, True, scorer=common_pb2.SCORER_REUSED)], 4)


def test_level1_samples_all_final() -> None:
    assert not request_done([ev(L1, True)], 2)
    assert request_done([ev(L1, True), ev(L1, True)], 2)


def test_escalated_request_waits_for_its_level2_final() -> None:
    both_low = [ev(L1, False, True), ev(L1, False, True)]
    assert not request_done(both_low, 2)
    assert request_done([*both_low, ev(L2, True)], 2)  # one escalation per request
    assert not request_done([ev(L1, True), ev(L1, False, True)], 2)


def test_level2_route_needs_every_sample() -> None:
    assert not request_done([ev(L2, True)], 2)
    assert request_done([ev(L2, True), ev(L2, True)], 2)
