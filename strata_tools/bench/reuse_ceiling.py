"""The most any skip rule could skip within a reuse-error budget (pure; `strata bench scheduler`).

A rule that reuses rewards is limited by what it knows (the history of the prompt and of its
neighbours) and by how well that history predicts a fresh rollout. The ceiling gives a rule the
best of both: the history of *every* earlier submission, as if none had been skipped, and a perfect
choice of which submissions to skip (those whose reused mean is nearest the truth, smallest
first, for as long as the mean error stays within the budget). No rule with the same history can
skip more at that error; a target above the ceiling is out of reach on that stream.

The rules themselves narrow it further. R11 sends a prompt whose rewards vary by more than
``high_variance_threshold`` (0.8) to a full rollout: its samples disagree, which is exactly what PPO
learns from, and no rule should skip it. R10 reuses only where they vary by less than
``low_variance_threshold`` (0.3). :meth:`CeilingResult.reduction` therefore also answers with the
candidates limited to prompts whose *true* per-rollout variance (under the policy of the moment,
known to the simulation, never to a rule) is under a bound: the most a rule that honours R10 or R11
could skip, whatever its predictor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field


def ceiling_skips(errors: Sequence[float], budget: float) -> tuple[int, float]:
    """How many of ``errors`` fit under a mean of ``budget`` (smallest first), and their mean error."""
    total, count = 0.0, 0
    for error in sorted(errors):
        if (total + error) / (count + 1) > budget:
            break  # sorted: every later error would raise the mean further
        total += error
        count += 1
    return count, (total / count if count else float("nan"))


@dataclass
class ReuseHistory:
    """Rewards of every submission, by prompt and by paraphrase family, with the policy version that
    made them. ``mean`` answers what a rule could reuse at a given version: the mean of the rewards
    no more than ``max_policy_lag`` versions old, or None when there are none."""

    max_policy_lag: int
    by_prompt: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: defaultdict(list))
    by_family: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: defaultdict(list))

    def add(self, prompt: str, family: str, rewards: Sequence[float], version: int) -> None:
        self.by_prompt[prompt].extend((r, version) for r in rewards)
        self.by_family[family].extend((r, version) for r in rewards)

    def mean(self, key: str, version: int, of_family: bool) -> float | None:
        rewards = [r for r, v in (self.by_family if of_family else self.by_prompt).get(key, ())
                   if version - v <= self.max_policy_lag]
        return sum(rewards) / len(rewards) if rewards else None


@dataclass
class CeilingResult:
    """Reuse errors of the submissions a rule could have skipped (those with a history), per kind of
    history: the prompt's own (what GRESO knows) and its paraphrase family (a neighbourhood), each
    with the true per-rollout reward variance of that submission's prompt (``*_variances``, parallel;
    empty when the caller does not know it)."""

    submitted: int = 0
    own_errors: list[float] = field(default_factory=list)
    family_errors: list[float] = field(default_factory=list)
    own_variances: list[float] = field(default_factory=list)
    family_variances: list[float] = field(default_factory=list)

    def add(self, of_family: bool, error: float, variance: float) -> None:
        (self.family_errors if of_family else self.own_errors).append(error)
        (self.family_variances if of_family else self.own_variances).append(variance)

    def reduction(self, of_family: bool, budget: float, max_variance: float | None = None) -> tuple[float, float]:
        """The ceiling's trigger reduction (skips per submission) and its reuse MAE; with
        ``max_variance``, only over submissions whose prompt's rollouts vary by less than it."""
        errors = self.family_errors if of_family else self.own_errors
        if max_variance is not None:
            variances = self.family_variances if of_family else self.own_variances
            if len(variances) != len(errors):
                raise ValueError("the ceiling was not given the true variance of every candidate")
            errors = [e for e, v in zip(errors, variances, strict=True) if v < max_variance]
        skips, mae = ceiling_skips(errors, budget)
        return (skips / self.submitted if self.submitted else 0.0), mae
