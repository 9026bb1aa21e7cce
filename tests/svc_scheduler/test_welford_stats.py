"""Welford's online statistics against numpy, and how rewards fold in (expiry, versions, unsafe)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from svc_scheduler.stats import (
    RewardObservation,
    RewardStats,
    apply_reward,
    marks_high_uncertainty,
    welford_update,
)

TTL, LAG = 100.0, 5


@pytest.mark.parametrize("seed", range(5))
def test_welford_matches_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    xs = rng.normal(rng.uniform(0, 5), rng.uniform(0.01, 2.0), size=int(rng.integers(2, 300)))
    count, mean, m2 = 0, 0.0, 0.0
    for x in xs:
        count, mean, m2 = welford_update(count, mean, m2, float(x))
    assert count == len(xs)
    assert mean == pytest.approx(np.mean(xs), rel=1e-12, abs=1e-12)
    assert m2 / (count - 1) == pytest.approx(np.var(xs, ddof=1), rel=1e-9)


def test_welford_is_stable_for_large_offsets() -> None:
    xs = 1e9 + np.array([4.0, 7.0, 13.0, 16.0])  # the textbook case where the naive formula fails
    count, mean, m2 = 0, 0.0, 0.0
    for x in xs:
        count, mean, m2 = welford_update(count, mean, m2, float(x))
    assert m2 / (count - 1) == pytest.approx(30.0)


def obs(reward: float, at: float, rm: str = "rm-1", policy: int = 1, unsafe: bool = False) -> RewardObservation:
    return RewardObservation(reward, policy, rm, at, unsafe)


def fold(*observations: RewardObservation) -> RewardStats:
    stats = None
    for o in observations:
        stats = apply_reward(stats, o, TTL, LAG)
    assert stats is not None
    return stats


def test_apply_reward_accumulates_and_tracks_the_oldest_policy() -> None:
    stats = fold(obs(1.0, 10, policy=3), obs(3.0, 11, policy=2), obs(5.0, 12, policy=4))
    assert (stats.count, stats.mean, stats.variance) == (3, 3.0, 4.0)
    assert stats.policy_version == 2 and stats.updated_at == 12


def test_variance_is_unknown_below_two_samples() -> None:
    assert math.isinf(fold(obs(2.0, 1)).variance)


def test_expired_stats_restart() -> None:
    stats = fold(obs(1.0, 0), obs(5.0, 1), obs(3.0, 1 + TTL + 1))
    assert (stats.count, stats.mean) == (1, 3.0)


def test_newer_reward_model_restarts_older_reward_is_dropped() -> None:
    stats = fold(obs(1.0, 10), obs(2.0, 11), obs(4.0, 12, rm="rm-2"))
    assert (stats.count, stats.mean, stats.rm_version) == (1, 4.0, "rm-2")
    late = apply_reward(stats, obs(0.0, 11.5, rm="rm-1"), TTL, LAG)
    assert late == stats


def test_policy_far_ahead_restarts() -> None:
    stats = fold(obs(1.0, 10, policy=1), obs(2.0, 11, policy=1 + LAG))
    assert stats.count == 2
    stats = apply_reward(stats, obs(4.0, 12, policy=2 + LAG), TTL, LAG)
    assert (stats.count, stats.mean, stats.policy_version) == (1, 4.0, 2 + LAG)


def test_unsafe_is_sticky_across_restarts() -> None:
    stats = fold(obs(4.0, 10, unsafe=True), obs(4.0, 11))
    assert stats.unsafe
    assert fold(obs(4.0, 10, unsafe=True), obs(4.0, 10 + TTL + 1)).unsafe
    assert apply_reward(fold(obs(1.0, 10, rm="rm-2")), obs(1.0, 5, rm="rm-1", unsafe=True), TTL, LAG).unsafe


def test_marking_needs_samples_and_a_variance_over_the_threshold() -> None:
    high = RewardStats(3, 2.5, 0.81 * 2, 1, "rm-1", 0.0)
    assert marks_high_uncertainty(high, 3, 0.8)
    assert not marks_high_uncertainty(high, 4, 0.8)
    assert not marks_high_uncertainty(RewardStats(3, 2.5, 0.8 * 2, 1, "rm-1", 0.0), 3, 0.8)


def test_flag_unsafe_records_the_flag_without_the_reward() -> None:
    from svc_scheduler.stats import flag_unsafe

    stats = fold(obs(4.0, 10), obs(4.2, 11))
    flagged = flag_unsafe(stats, obs(0.0, 12, unsafe=True))
    assert flagged.unsafe and (flagged.count, flagged.mean) == (stats.count, stats.mean)
    fresh = flag_unsafe(None, obs(0.0, 12, unsafe=True))
    assert fresh.unsafe and fresh.count == 0
