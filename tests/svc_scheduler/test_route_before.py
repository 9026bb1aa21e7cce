"""Route before generating (issue 61): a neighbourhood whose Level-1 answers the light RM keeps escalating
sends a new prompt straight to Level-2. The record as the statistics keep it, and the rule on constructed
neighbourhoods (pure, no I/O)."""

from __future__ import annotations

import math

import pytest

from strata.bus import PoisonMessageError
from strata.v1 import common_pb2, events_pb2
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.routing import ROUTE_BEFORE_Z, Level1Record, Neighbour, Route, VersionState, decide
from svc_scheduler.stats import (
    DEFAULT_AGING,
    LabelObservation,
    RewardObservation,
    RewardStats,
    apply_label,
    apply_reward,
)
from svc_scheduler.worker import StatsUpdater, observation

NOW = 1_000_000.0
SETTINGS = SchedulerSettings(route_before_escalation_rate=0.8)  # off by default: on here
VERSIONS = VersionState(policy_version=10, rm_version="rm-1")


def record(verdicts: list[bool], rewards: list[float] | None = None, policy: int = 10) -> RewardStats:
    """A prompt's statistics after the light RM judged its Level-1 answers (True: escalated); by default
    rewards of variance 0.56 (an escalated answer low, Level-2's higher): neither low nor high."""
    stats = None
    for i, escalated in enumerate(verdicts):
        reward = (rewards or [1.0 + 1.3 * (j % 2) for j in range(len(verdicts))])[i]
        stats = apply_reward(stats, RewardObservation(reward, policy, "rm-1", NOW - 100 + i, level1_outcome=escalated),
                             ttl_s=3600, max_policy_lag=20)
    assert stats is not None
    return stats


def neighbourhood(verdicts: list[bool], n: int = 4, similarity: float = 0.9,
                  rewards: list[float] | None = None) -> list[Neighbour]:
    return [Neighbour(f"h{i}", similarity - 0.001 * i, record(verdicts, rewards)) for i in range(n)]


def route(ns: list[Neighbour], settings: SchedulerSettings = SETTINGS):
    return decide("self", ns, None, NOW, VERSIONS, settings)


def test_a_neighbourhood_whose_level1_answers_are_escalated_goes_straight_to_level_2() -> None:
    decision = route(neighbourhood([True] * 4))  # 16 verdicts, all escalated: lower bound 0.86
    assert decision.route is Route.LEVEL_2
    assert "before generating" in decision.reason and "16.0 of 16.0" in decision.reason
    assert decision.marked_neighbours == 0 and decision.low_variance_neighbours == 0  # no other rule spoke


def test_a_mixed_record_or_too_few_verdicts_keep_level_1() -> None:
    assert route(neighbourhood([True, True, True, False])).route is Route.LEVEL_1  # 75 % escalated
    assert route(neighbourhood([True] * 3, n=2)).route is Route.LEVEL_1  # 6 verdicts < route_before_min_outcomes
    few = route(neighbourhood([True] * 3, n=2), SETTINGS.model_copy(update={"route_before_min_outcomes": 4}))
    assert few.route is Route.LEVEL_1  # enough weight, but 6 of 6 bounds the rate only at 0.69


def test_dissimilar_or_stale_neighbours_say_nothing() -> None:
    assert route(neighbourhood([True] * 4, similarity=0.7)).route is Route.LEVEL_1  # under min_similarity
    old = [Neighbour(f"h{i}", 0.9, record([True] * 4, policy=-15)) for i in range(4)]  # 25 versions behind
    assert route(old).route is Route.LEVEL_1


def test_a_known_reward_still_wins_and_the_rule_can_be_turned_off() -> None:
    stable = neighbourhood([True] * 4, rewards=[2.0, 2.1, 2.0, 2.1])  # close paraphrases that agree
    assert route(stable).route is Route.SKIP  # reusing a known reward costs nothing at all
    assert route(neighbourhood([True] * 4), SchedulerSettings()).route is Route.LEVEL_1  # the default: off


def test_the_lower_bound_is_wilsons() -> None:
    # All escalated: Wilson's bound is 1 / (1 + z^2 / n) in closed form.
    for n in (4.0, 12.0, 40.0):
        assert Level1Record(n, n, 1).low == pytest.approx(1 / (1 + ROUTE_BEFORE_Z ** 2 / n))
    assert Level1Record(0.0, 0.0, 0).low == 0.0 and math.isnan(Level1Record(0.0, 0.0, 0).rate)
    lows = [Level1Record(n, 0.8 * n, 1).low for n in (5.0, 20.0, 80.0, 320.0)]
    assert lows == sorted(lows) and lows[-1] < 0.8  # tightens towards the rate from below


def test_the_record_ages_and_restarts_with_the_rewards() -> None:
    stats = record([True, False, True])
    assert (stats.level1_scored, stats.level1_escalated) == (3.0, 2.0)
    later = apply_reward(stats, RewardObservation(2.0, 12, "rm-1", NOW, level1_outcome=None), 3600, 20)
    decay = DEFAULT_AGING.policy_decay ** 2
    assert later.level1_scored == pytest.approx(3.0 * decay) and later.level1_escalated == pytest.approx(2.0 * decay)
    expired = apply_reward(stats, RewardObservation(2.0, 10, "rm-1", NOW + 7200, level1_outcome=False), 3600, 20)
    assert (expired.level1_scored, expired.level1_escalated) == (1.0, 0.0)
    assert RewardStats.from_dict(stats.to_dict()) == stats
    older = {k: v for k, v in stats.to_dict().items() if not k.startswith("level1_")}  # stored by an older release
    assert RewardStats.from_dict(older).level1_scored == 0.0


@pytest.mark.parametrize("tier,scorer,escalated,expected", [
    (common_pb2.TIER_LEVEL_1, common_pb2.SCORER_LIGHT, True, True),
    (common_pb2.TIER_LEVEL_1, common_pb2.SCORER_LIGHT, False, False),
    (common_pb2.TIER_LEVEL_1, common_pb2.SCORER_STRONG, False, None),  # an audit or a human: not the light verdict
    (common_pb2.TIER_LEVEL_2, common_pb2.SCORER_STRONG, False, None),
])
def test_only_the_light_rms_verdict_on_a_level1_answer_is_a_record(tier: int, scorer: int, escalated: bool,
                                                                    expected: bool | None) -> None:
    message = events_pb2.RewardScored(prompt_hash="a" * 64, tier=tier, scorer=scorer, escalated=escalated, reward=1.0)
    assert observation(message).level1_outcome is expected


# -- people's labels: the record the reward service's escalation rule weighs -------------------------------

def labelled(stats: RewardStats, bad: list[bool], policy: int = 10, at: float = NOW) -> RewardStats:
    for is_bad in bad:
        found = apply_label(stats, LabelObservation(is_bad, policy, at), ttl_s=3600)
        assert found is not None
        stats = found
    return stats


def test_a_label_adds_to_the_record_and_changes_no_reward_figure() -> None:
    stats = record([True, False, True])
    after = labelled(stats, [True, False, True])
    assert (after.level1_labelled, after.level1_bad) == (3.0, 2.0)
    assert (after.count, after.mean, after.m2, after.weight) == (stats.count, stats.mean, stats.m2, stats.weight)
    assert (after.level1_scored, after.level1_escalated) == (stats.level1_scored, stats.level1_escalated)
    assert RewardStats.from_dict(after.to_dict()) == after
    # A later reward keeps the labels, aged as the rest by the versions it moved.
    later = apply_reward(after, RewardObservation(2.0, 11, "rm-1", NOW, level1_outcome=False), 3600, 20)
    decay = DEFAULT_AGING.policy_decay
    assert later.level1_labelled == pytest.approx(3.0 * decay) and later.level1_bad == pytest.approx(2.0 * decay)


def test_labels_age_with_the_policy_and_are_dropped_without_live_statistics() -> None:
    stats = labelled(record([False]), [True])
    newer = labelled(stats, [False], policy=12)  # a newer policy's answer: the earlier label ages two versions
    decay = DEFAULT_AGING.policy_decay
    assert newer.level1_labelled == pytest.approx(decay ** 2 + 1) and newer.level1_bad == pytest.approx(decay ** 2)
    assert newer.newest_policy_version == 12
    older = labelled(stats, [True], policy=9)  # an older policy's answer counts less
    assert older.level1_bad == pytest.approx(1 + decay)
    assert apply_label(None, LabelObservation(True, 10, NOW), ttl_s=3600) is None
    assert apply_label(stats, LabelObservation(True, 10, NOW + 7200), ttl_s=3600) is None  # statistics expired


def test_the_neighbourhoods_labels_ride_on_a_level1_decision() -> None:
    ns = [Neighbour(f"h{i}", 0.9, labelled(record([False, True]), [True, False, bad]))
          for i, bad in enumerate([True, False, True])]
    far = Neighbour("far", 0.5, labelled(record([False]), [True] * 5))  # under min_similarity: says nothing
    decision = route([*ns, far])
    assert decision.route is Route.LEVEL_1 and decision.level1_record is not None
    assert (decision.level1_record.labelled, decision.level1_record.bad) == (9.0, 5.0)
    assert decision.level1_record.neighbours == 3
    plain = route(ns, SchedulerSettings(tiering=False))  # a plain rollout escalates nothing: no record
    assert plain.route is Route.LEVEL_1 and plain.level1_record is None
    assert route([]).level1_record == Level1Record(0.0, 0.0, 0)  # no history yet: an empty record, still sent


@pytest.mark.parametrize("tier,gold,score,expected", [
    (common_pb2.TIER_LEVEL_1, False, 0.5, True),
    (common_pb2.TIER_LEVEL_1, False, 1.5, False),  # record_bad_below is strict
    (common_pb2.TIER_LEVEL_1, True, 0.5, None),  # a gold item checks the annotator, not Level-1
    (common_pb2.TIER_LEVEL_2, False, 0.5, None),  # Level-2's answer is not Level-1's record
])
def test_only_peoples_scores_of_level1_answers_are_labels(tier: int, gold: bool, score: float,
                                                          expected: bool | None) -> None:
    applied: list[LabelObservation] = []

    class Store:
        def apply_label(self, prompt_hash: str, response_hash: str, annotator: str, obs: LabelObservation) -> bool:
            applied.append(obs)
            return True

    message = events_pb2.AnnotationCompleted(prompt_hash="a" * 64, response_hash="b" * 64, annotator_id="ann",
                                             score=score, gold=gold, tier=tier, policy_version=3)
    StatsUpdater(Store(), SchedulerSettings()).apply_label(message)  # type: ignore[arg-type]
    assert [obs.bad for obs in applied] == ([] if expected is None else [expected])
    with pytest.raises(PoisonMessageError):
        StatsUpdater(Store(), SchedulerSettings()).apply_label(  # type: ignore[arg-type]
            events_pb2.AnnotationCompleted(prompt_hash="a" * 64, score=math.nan, tier=common_pb2.TIER_LEVEL_1))
