"""Per-prompt reward statistics, updated online and aged by version (R10-R12). Pure, no I/O.

What a prompt's statistics are (docs/scheduler.md, *Reward statistics*): the rewards of **every**
scored rollout of the prompt, Level-1 and Level-2, final or escalated, on the one 0-5 scale of the
reward models (the light RM is distilled from the strong one). A Level-1 answer that the light RM
scored under the escalation threshold counts as much as the Level-2 answer that replaced it: leaving
it out would bias the reused mean upward and hide exactly the variance R11 is about.

Each reward carries a weight, and versions *age* the statistics instead of wiping them:

- a newer policy multiplies the weight of every earlier sample by ``policy_decay`` per version;
- a newer version of a reward model that already scored this prompt (a promotion, R7) multiplies the
  weight of every earlier sample by ``rm_decay``; a late reward of the replaced version is dropped.
  The light and the strong RM are two *scorers* on one scale, so an escalation (light, then strong)
  folds both in and ages nothing.

Fields:

- ``count``: rewards folded in; ``weight`` / ``weight_sq``: the sum of their weights and of the
  squared weights; ``mean`` / ``m2``: the weighted running mean and sum of squared deviations
  (West 1979, the weighted form of Welford's algorithm: exact without keeping the samples);
- ``policy_version`` / ``newest_policy_version``: the oldest and newest policy among the samples;
- ``rm_versions``: per scorer ("light", "strong", ...), the version of its newest reward;
- ``updated_at``: when the latest sample was scored; statistics expire ``stats_ttl_s`` after it;
- ``unsafe``: some response to this prompt was flagged unsafe; sticky: such a prompt's reward is
  never reused (R12), even after its statistics restart;
- ``level1_scored`` / ``level1_escalated``: the weights of the Level-1 answers the light RM judged, and of
  those it escalated (aged like the rewards): the neighbourhood's record that lets the scheduler send a
  prompt straight to Level-2 before any Level-1 cost (issue 61, cascade routing's estimate before
  generation).
- ``level1_labelled`` / ``level1_bad``: the weights of the Level-1 answers people labelled (the desk's scores,
  one per annotator) and of those labelled bad (aged like the rewards): the neighbourhood's record that the
  reward service weighs with the light RM's score when it decides an escalation (issue 61). A label is no
  reward: it changes no mean, count or version (:func:`apply_label`).

How a new reward is folded in (:func:`apply_reward`):

1. no statistics yet, or they expired                        -> restart from this reward;
2. its scorer's version differs: reward newer                 -> age the samples by ``rm_decay``, fold in;
                                 reward older                 -> dropped (a late event of a replaced RM);
3. policy moved more than ``max_policy_lag`` past the newest sample -> restart;
4. otherwise                                                  -> age by ``policy_decay`` per policy
                                                                 version it moved, fold in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

LIGHT = "light"


@dataclass(frozen=True)
class Aging:
    """How much an earlier sample's weight is kept when the policy or a reward model moves on."""

    policy_decay: float = 0.95  # per policy version
    rm_decay: float = 0.5  # per promotion of a reward model that scored the prompt

    def __post_init__(self) -> None:
        for name in ("policy_decay", "rm_decay"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")


DEFAULT_AGING = Aging()


@dataclass(frozen=True)
class RewardStats:
    count: int  # rewards folded in
    mean: float  # weighted running mean of those rewards (0-5 scale)
    m2: float  # weighted sum of squared deviations from the mean
    weight: float  # sum of the samples' weights
    weight_sq: float  # sum of their squares (for the unbiased weighted variance)
    policy_version: int  # oldest policy version among the samples
    newest_policy_version: int  # newest policy version among the samples
    rm_versions: Mapping[str, str]  # scorer ("light", "strong", ...) -> version of its newest reward
    updated_at: float  # unix seconds when the latest sample was scored
    unsafe: bool = False  # a response was flagged unsafe: never reuse (sticky)
    level1_scored: float = 0.0  # weight of the Level-1 answers the light RM judged
    level1_escalated: float = 0.0  # weight of those it escalated
    level1_labelled: float = 0.0  # weight of the Level-1 answers people labelled
    level1_bad: float = 0.0  # weight of those labelled bad

    @property
    def variance(self) -> float:
        """Unbiased weighted variance (reliability weights: M2 / (W - sum w^2 / W)); infinite below two samples."""
        if self.count < 2 or self.weight <= 0.0:
            return math.inf
        denominator = self.weight - self.weight_sq / self.weight
        return self.m2 / denominator if denominator > 0.0 else math.inf

    @property
    def rm_version(self) -> str:
        """The version reuse is checked against: the light RM's (the promoted one, R7), else any scorer's."""
        return self.rm_versions.get(LIGHT) or next(iter(sorted(self.rm_versions.values())), "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count, "mean": self.mean, "m2": self.m2, "weight": self.weight,
            "weight_sq": self.weight_sq, "policy_version": self.policy_version,
            "newest_policy_version": self.newest_policy_version, "rm_versions": dict(self.rm_versions),
            "updated_at": self.updated_at, "unsafe": self.unsafe,
            "level1_scored": self.level1_scored, "level1_escalated": self.level1_escalated,
            "level1_labelled": self.level1_labelled, "level1_bad": self.level1_bad,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RewardStats:
        if "rm_versions" not in data:  # written before statistics were weighted: unit weights, one RM
            count = int(data["count"])
            return cls(count, data["mean"], data["m2"], float(count), float(count), data["policy_version"],
                       data["policy_version"], _frozen({LIGHT: data["rm_version"]}), data["updated_at"],
                       bool(data.get("unsafe", False)))
        return cls(int(data["count"]), data["mean"], data["m2"], data["weight"], data["weight_sq"],
                   data["policy_version"], data["newest_policy_version"], _frozen(data["rm_versions"]),
                   data["updated_at"], bool(data.get("unsafe", False)), float(data.get("level1_scored", 0.0)),
                   float(data.get("level1_escalated", 0.0)), float(data.get("level1_labelled", 0.0)),
                   float(data.get("level1_bad", 0.0)))


@dataclass(frozen=True)
class RewardObservation:
    """One reward of one rollout, as the statistics need it."""

    reward: float
    policy_version: int
    rm_version: str
    scored_at: float  # unix seconds
    unsafe: bool = False
    scorer: str = LIGHT  # which reward model produced it ("light", "strong", "human")
    level1_outcome: bool | None = None  # a Level-1 answer judged by the light RM: escalated; None: not one


def _frozen(versions: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(versions))


def weighted_update(weight: float, weight_sq: float, mean: float, m2: float, x: float, w: float
                    ) -> tuple[float, float, float, float]:
    """One step of West's weighted online mean/variance: returns the new (weight, weight_sq, mean, m2)."""
    weight += w
    delta = x - mean
    mean += (w / weight) * delta
    m2 += w * delta * (x - mean)  # uses the *updated* mean: numerically stable
    return weight, weight_sq + w * w, mean, m2


def _aged(stats: RewardStats, factor: float) -> RewardStats:
    if factor == 1.0:
        return stats
    return replace(stats, weight=stats.weight * factor, weight_sq=stats.weight_sq * factor * factor,
                   m2=stats.m2 * factor, level1_scored=stats.level1_scored * factor,
                   level1_escalated=stats.level1_escalated * factor, level1_labelled=stats.level1_labelled * factor,
                   level1_bad=stats.level1_bad * factor)


def _at_version(stats: RewardStats, policy_version: int, aging: Aging) -> tuple[RewardStats, float]:
    """The statistics aged to a sample of ``policy_version``, and that sample's weight: a newer policy ages
    every earlier sample by ``policy_decay`` per version it moved (the new one weighs 1); an older one's
    sample weighs ``policy_decay`` per version it is behind."""
    lag = policy_version - stats.newest_policy_version
    if lag > 0:
        return _aged(stats, aging.policy_decay ** lag), 1.0
    return stats, aging.policy_decay ** -lag


def _level1(obs: RewardObservation, w: float) -> tuple[float, float]:
    """The weight ``obs`` adds to (level1_scored, level1_escalated)."""
    if obs.level1_outcome is None:
        return 0.0, 0.0
    return w, w if obs.level1_outcome else 0.0


def start_stats(obs: RewardObservation, unsafe: bool = False) -> RewardStats:
    return RewardStats(1, obs.reward, 0.0, 1.0, 1.0, obs.policy_version, obs.policy_version,
                       _frozen({obs.scorer: obs.rm_version}), obs.scored_at, unsafe or obs.unsafe,
                       *_level1(obs, 1.0))


def apply_reward(stats: RewardStats | None, obs: RewardObservation, ttl_s: float, max_policy_lag: int,
                 aging: Aging = DEFAULT_AGING) -> RewardStats:
    """Statistics after folding ``obs`` in (see the module docstring for the rules)."""
    if stats is None:
        return start_stats(obs)
    unsafe = stats.unsafe or obs.unsafe
    if obs.scored_at - stats.updated_at > ttl_s:
        return start_stats(obs, unsafe)
    versions = dict(stats.rm_versions)
    known = versions.get(obs.scorer)
    if known is not None and known != obs.rm_version:
        if obs.scored_at < stats.updated_at:
            return replace(stats, unsafe=unsafe)
        stats = _aged(stats, aging.rm_decay)
    versions[obs.scorer] = obs.rm_version
    if obs.policy_version - stats.newest_policy_version > max_policy_lag:
        return start_stats(obs, unsafe)
    stats, w = _at_version(stats, obs.policy_version, aging)
    weight, weight_sq, mean, m2 = weighted_update(stats.weight, stats.weight_sq, stats.mean, stats.m2,
                                                  obs.reward, w)
    scored, escalated = _level1(obs, w)
    return RewardStats(
        count=stats.count + 1,
        mean=mean,
        m2=m2,
        weight=weight,
        weight_sq=weight_sq,
        policy_version=min(stats.policy_version, obs.policy_version),
        newest_policy_version=max(stats.newest_policy_version, obs.policy_version),
        rm_versions=_frozen(versions),
        updated_at=max(stats.updated_at, obs.scored_at),
        unsafe=unsafe,
        level1_scored=stats.level1_scored + scored,
        level1_escalated=stats.level1_escalated + escalated,
        level1_labelled=stats.level1_labelled,
        level1_bad=stats.level1_bad,
    )


@dataclass(frozen=True)
class LabelObservation:
    """One person's label of one Level-1 answer, as the record needs it."""

    bad: bool  # the score is under the record's bad line (``record_bad_below``)
    policy_version: int  # of the policy that wrote the answer
    labelled_at: float  # unix seconds


def apply_label(stats: RewardStats | None, obs: LabelObservation, ttl_s: float, aging: Aging = DEFAULT_AGING
                ) -> RewardStats | None:
    """Statistics after adding one label to the Level-1 record; None (dropped) where the prompt has no live
    statistics: its answer's reward came first, so they expired or restarted since, and the label belongs to
    what was forgotten. A newer policy ages the statistics as a reward would; an older one's label counts less."""
    if stats is None or obs.labelled_at - stats.updated_at > ttl_s:
        return None
    stats, w = _at_version(stats, obs.policy_version, aging)
    return replace(stats, newest_policy_version=max(stats.newest_policy_version, obs.policy_version),
                   level1_labelled=stats.level1_labelled + w, level1_bad=stats.level1_bad + (w if obs.bad else 0.0))


def marks_high_uncertainty(stats: RewardStats, min_samples: int, high_variance_threshold: float) -> bool:
    """R11: enough samples and a variance over the threshold mark the prompt's neighbourhood."""
    return stats.count >= min_samples and stats.variance > high_variance_threshold
