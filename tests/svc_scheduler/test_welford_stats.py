"""Weighted online statistics against numpy, and how rewards fold in (expiry, aging by version, unsafe)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from svc_scheduler.stats import (
    DEFAULT_AGING,
    Aging,
    RewardObservation,
    RewardStats,
    apply_reward,
    marks_high_uncertainty,
    weighted_update,
)

TTL, LAG = 100.0, 5


@pytest.mark.parametrize("seed", range(5))
def test_weighted_update_matches_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    xs = rng.normal(rng.uniform(0, 5), rng.uniform(0.01, 2.0), size=n)
    ws = rng.uniform(0.1, 1.0, size=n)
    weight, weight_sq, mean, m2 = 0.0, 0.0, 0.0, 0.0
    for x, w in zip(xs, ws, strict=True):
        weight, weight_sq, mean, m2 = weighted_update(weight, weight_sq, mean, m2, float(x), float(w))
    expected_mean = np.average(xs, weights=ws)
    assert mean == pytest.approx(expected_mean, rel=1e-12, abs=1e-12)
    assert m2 == pytest.approx(np.sum(ws * (xs - expected_mean) ** 2), rel=1e-9)
    assert weight_sq == pytest.approx(np.sum(ws**2))


def test_unit_weights_give_the_plain_unbiased_variance() -> None:
    xs = 1e9 + np.array([4.0, 7.0, 13.0, 16.0])  # the textbook case where the naive formula fails
    stats = fold(*(obs(float(x), i) for i, x in enumerate(xs)))
    assert stats.variance == pytest.approx(30.0)
    assert stats.variance == pytest.approx(np.var(xs, ddof=1))


def obs(reward: float, at: float, rm: str = "rm-1", policy: int = 1, unsafe: bool = False,
        scorer: str = "light") -> RewardObservation:
    return RewardObservation(reward, policy, rm, at, unsafe, scorer)


def fold(*observations: RewardObservation, aging: Aging = DEFAULT_AGING) -> RewardStats:
    stats = None
    for o in observations:
        stats = apply_reward(stats, o, TTL, LAG, aging)
    assert stats is not None
    return stats


def test_apply_reward_accumulates_and_tracks_the_policy_window() -> None:
    stats = fold(obs(1.0, 10, policy=3), obs(3.0, 11, policy=3), obs(5.0, 12, policy=3), aging=Aging(0.5, 0.5))
    assert (stats.count, stats.mean, stats.variance) == (3, 3.0, 4.0)
    assert (stats.policy_version, stats.newest_policy_version, stats.updated_at) == (3, 3, 12)


def test_variance_is_unknown_below_two_samples() -> None:
    assert math.isinf(fold(obs(2.0, 1)).variance)


def test_expired_stats_restart() -> None:
    stats = fold(obs(1.0, 0), obs(5.0, 1), obs(3.0, 1 + TTL + 1))
    assert (stats.count, stats.mean) == (1, 3.0)


def test_an_escalation_folds_light_and_strong_rewards_together() -> None:
    # Level-1 scored 1.0 by the light RM (escalated), Level-2 scored 4.0 by the strong RM: one history,
    # nothing aged (two scorers on one scale), and the spread R11 is about is visible.
    stats = fold(obs(1.0, 10, rm="light-a"), obs(1.4, 10, rm="light-a"), obs(4.0, 11, rm="strong-s", scorer="strong"))
    assert (stats.count, stats.weight) == (3, 3.0)
    assert stats.mean == pytest.approx(6.4 / 3)
    assert stats.variance == pytest.approx(np.var([1.0, 1.4, 4.0], ddof=1))
    assert marks_high_uncertainty(stats, 3, 0.8)
    assert dict(stats.rm_versions) == {"light": "light-a", "strong": "strong-s"}
    assert stats.rm_version == "light-a"


def test_a_promoted_rm_ages_the_history_and_a_late_reward_of_the_old_one_is_dropped() -> None:
    aging = Aging(policy_decay=1.0, rm_decay=0.5)
    before = fold(obs(1.0, 10), obs(2.0, 11), aging=aging)
    stats = apply_reward(before, obs(4.0, 12, rm="rm-2"), TTL, LAG, aging)
    # Weights 0.5, 0.5, 1: mean (0.5 + 1 + 4) / 2 = 2.75; nothing was wiped.
    assert (stats.count, stats.weight, stats.weight_sq) == (3, 2.0, 1.5)
    assert stats.mean == pytest.approx(2.75)
    expected_m2 = 0.5 * (1 - 2.75) ** 2 + 0.5 * (2 - 2.75) ** 2 + (4 - 2.75) ** 2
    assert stats.m2 == pytest.approx(expected_m2)
    assert stats.variance == pytest.approx(expected_m2 / (2.0 - 1.5 / 2.0))
    assert stats.rm_version == "rm-2"
    late = apply_reward(stats, obs(0.0, 11.5, rm="rm-1"), TTL, LAG, aging)
    assert late == stats


def test_a_newer_policy_ages_earlier_samples_and_an_older_one_counts_less() -> None:
    aging = Aging(policy_decay=0.5, rm_decay=1.0)
    stats = fold(obs(2.0, 10, policy=1), obs(4.0, 11, policy=3), aging=aging)
    # The first sample is two versions behind when the second arrives: weight 0.25.
    assert stats.weight == pytest.approx(1.25) and stats.mean == pytest.approx((0.5 + 4.0) / 1.25)
    assert (stats.policy_version, stats.newest_policy_version) == (1, 3)
    late = apply_reward(stats, obs(0.0, 12, policy=2), TTL, LAG, aging)  # one version behind the newest
    assert late.weight == pytest.approx(1.75) and late.newest_policy_version == 3


def test_policy_far_ahead_of_the_newest_sample_restarts() -> None:
    stats = fold(obs(1.0, 10, policy=1), obs(2.0, 11, policy=1 + LAG))
    assert stats.count == 2
    stats = apply_reward(stats, obs(4.0, 12, policy=2 + 2 * LAG), TTL, LAG)
    assert (stats.count, stats.mean, stats.policy_version) == (1, 4.0, 2 + 2 * LAG)


def test_unsafe_is_sticky_across_restarts() -> None:
    stats = fold(obs(4.0, 10, unsafe=True), obs(4.0, 11))
    assert stats.unsafe
    assert fold(obs(4.0, 10, unsafe=True), obs(4.0, 10 + TTL + 1)).unsafe
    assert apply_reward(fold(obs(1.0, 10, rm="rm-2")), obs(1.0, 5, rm="rm-1", unsafe=True), TTL, LAG).unsafe


def test_marking_needs_samples_and_a_variance_over_the_threshold() -> None:
    high = fold(obs(1.5, 1), obs(2.5, 2), obs(3.5 + 0.05, 3))
    assert high.variance > 0.8
    assert marks_high_uncertainty(high, 3, 0.8)
    assert not marks_high_uncertainty(high, 4, 0.8)
    assert not marks_high_uncertainty(fold(obs(1.7, 1), obs(2.5, 2), obs(3.3, 3)), 3, 0.8)


def test_json_round_trip_and_statistics_written_before_weighting() -> None:
    stats = fold(obs(1.0, 10), obs(4.0, 11, rm="s", scorer="strong"))
    assert RewardStats.from_dict(stats.to_dict()) == stats
    old = {"count": 3, "mean": 2.0, "m2": 2.0, "policy_version": 4, "rm_version": "rm-1", "updated_at": 5.0,
           "unsafe": False}
    migrated = RewardStats.from_dict(old)
    assert (migrated.weight, migrated.variance, migrated.rm_version) == (3.0, 1.0, "rm-1")


def test_aging_factors_are_checked() -> None:
    with pytest.raises(ValueError, match="rm_decay"):
        Aging(rm_decay=0.0)


def test_a_reward_that_is_not_a_number_is_poison_not_folded() -> None:
    from strata.bus import PoisonMessageError
    from strata.v1 import events_pb2
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.worker import StatsUpdater

    updater = StatsUpdater(None, SchedulerSettings())  # type: ignore[arg-type]  # refused before any store call
    for value in (float("nan"), float("inf")):
        with pytest.raises(PoisonMessageError, match="not a number"):
            updater.apply(events_pb2.RewardScored(prompt_hash="a" * 64, response_hash="b" * 64, reward=value))


def test_a_policy_update_ages_statistics_only_once_its_checkpoint_is_checked(tmp_path) -> None:
    import json

    from strata.bus import Delivery, PoisonMessageError, topics
    from strata.contract.checksums import POLICY_META_FILE, POLICY_WEIGHTS_FILE, policy_checksum
    from strata.v1 import events_pb2
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.worker import StatsUpdater

    class Versions:
        def __init__(self) -> None:
            self.policy: list[int] = []

        def update_versions(self, policy_version: int | None = None, **_: object) -> None:
            self.policy.append(policy_version)  # type: ignore[arg-type]

    root = tmp_path / "checkpoints"
    (root / "v3").mkdir(parents=True)
    (root / "v3" / POLICY_WEIGHTS_FILE).write_bytes(b"weights")
    (root / "v3" / POLICY_META_FILE).write_text(json.dumps({"version": 3}))
    store = Versions()
    updater = StatsUpdater(store, SchedulerSettings(policy_checkpoint_root=root))  # type: ignore[arg-type]

    def deliver(event: events_pb2.PolicyUpdated) -> None:
        updater.on_policy(Delivery(topics.POLICY_UPDATED, event, None, 0, 0, 1, 0))

    with pytest.raises(PoisonMessageError, match="outside"):
        deliver(events_pb2.PolicyUpdated(policy_version=2**62, checkpoint_path="/etc", checksum="0" * 64))
    with pytest.raises(PoisonMessageError, match="does not match"):
        deliver(events_pb2.PolicyUpdated(policy_version=2**62, checkpoint_path=str(root / "v3"),
                                         checksum=policy_checksum(root / "v3")))
    deliver(events_pb2.PolicyUpdated(policy_version=4, checkpoint_path=str(root / "v4"), checksum="a" * 64))
    assert store.policy == []  # a checkpoint not readable here is skipped, not dead-lettered
    deliver(events_pb2.PolicyUpdated(policy_version=3, checkpoint_path=str(root / "v3"),
                                     checksum=policy_checksum(root / "v3")))
    assert store.policy == [3]


def test_a_reward_awaiting_annotation_is_not_folded() -> None:
    from strata.v1 import events_pb2
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.worker import StatsUpdater

    updater = StatsUpdater(None, SchedulerSettings())  # type: ignore[arg-type]  # returns before any store call
    provisional = events_pb2.RewardScored(prompt_hash="a" * 64, response_hash="b" * 64, reward=4.0,
                                          awaiting_annotation=True)
    assert updater.apply(provisional) is False
