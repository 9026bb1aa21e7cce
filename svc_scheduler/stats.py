"""Per-prompt reward statistics, updated online with Welford's algorithm (R10-R12). Pure, no I/O.

A prompt's statistics summarise the *final* rewards of its rollouts made by one reward-model
version and a window of policy versions:

- ``count``, ``mean``, ``m2``: Welford's running sums (Welford 1962; Knuth TAOCP vol. 2, 4.2.2), so
  the variance is exact without keeping the samples;
- ``policy_version``: the *oldest* policy version among the samples: staleness is judged by it;
- ``rm_version``: the one reward model that produced every sample (rewards of two RMs are not
  comparable, R7);
- ``updated_at``: when the latest sample was scored; statistics expire ``stats_ttl_s`` after it;
- ``unsafe``: some response to this prompt was flagged unsafe; sticky: such a prompt's reward is
  never reused (R12), even after its statistics restart.

How a new reward is folded in (:func:`apply_reward`):

1. no statistics yet, or they expired  -> restart from this reward;
2. another RM version, reward newer    -> restart (the new RM takes over, R7);
   another RM version, reward older    -> dropped (a late event of the RM being replaced);
3. policy moved more than ``max_policy_lag`` versions past the oldest sample -> restart;
4. otherwise                           -> Welford update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RewardStats:
    count: int  # final rewards folded in
    mean: float  # running mean of those rewards (0-5 scale)
    m2: float  # Welford's sum of squared deviations from the mean
    policy_version: int  # oldest policy version among the samples
    rm_version: str  # reward-model version of every sample
    updated_at: float  # unix seconds when the latest sample was scored
    unsafe: bool = False  # a response was flagged unsafe: never reuse (sticky)

    @property
    def variance(self) -> float:
        """Unbiased sample variance (M2 / (n - 1)); infinite below two samples (unknown, never 'low')."""
        return self.m2 / (self.count - 1) if self.count >= 2 else math.inf


@dataclass(frozen=True)
class RewardObservation:
    """One final reward of one rollout, as the statistics need it."""

    reward: float
    policy_version: int
    rm_version: str
    scored_at: float  # unix seconds
    unsafe: bool = False


def welford_update(count: int, mean: float, m2: float, x: float) -> tuple[int, float, float]:
    """One step of Welford's online mean/variance: returns the new (count, mean, m2)."""
    count += 1
    delta = x - mean
    mean += delta / count
    m2 += delta * (x - mean)  # uses the *updated* mean: numerically stable
    return count, mean, m2


def start_stats(obs: RewardObservation, unsafe: bool = False) -> RewardStats:
    return RewardStats(1, obs.reward, 0.0, obs.policy_version, obs.rm_version, obs.scored_at, unsafe or obs.unsafe)


def apply_reward(
    stats: RewardStats | None, obs: RewardObservation, ttl_s: float, max_policy_lag: int
) -> RewardStats:
    """Statistics after folding ``obs`` in (see the module docstring for the rules)."""
    if stats is None:
        return start_stats(obs)
    unsafe = stats.unsafe or obs.unsafe
    if obs.scored_at - stats.updated_at > ttl_s:
        return start_stats(obs, unsafe)
    if obs.rm_version != stats.rm_version:
        if obs.scored_at >= stats.updated_at:
            return start_stats(obs, unsafe)
        return replace(stats, unsafe=unsafe)
    if obs.policy_version - stats.policy_version > max_policy_lag:
        return start_stats(obs, unsafe)
    count, mean, m2 = welford_update(stats.count, stats.mean, stats.m2, obs.reward)
    return RewardStats(
        count=count,
        mean=mean,
        m2=m2,
        policy_version=min(stats.policy_version, obs.policy_version),
        rm_version=stats.rm_version,
        updated_at=max(stats.updated_at, obs.scored_at),
        unsafe=unsafe,
    )


def flag_unsafe(stats: RewardStats | None, obs: RewardObservation) -> RewardStats:
    """Record an unsafe response without folding its reward in (e.g. a non-final reward, R3/R12)."""
    if stats is None:
        return RewardStats(0, 0.0, 0.0, obs.policy_version, obs.rm_version, obs.scored_at, unsafe=True)
    return replace(stats, unsafe=True)


def marks_high_uncertainty(stats: RewardStats, min_samples: int, high_variance_threshold: float) -> bool:
    """R11: enough samples and a variance over the threshold mark the prompt's neighbourhood."""
    return stats.count >= min_samples and stats.variance > high_variance_threshold
