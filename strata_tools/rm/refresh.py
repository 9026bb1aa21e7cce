"""The rules of one turn of the reward models' loop (issue 37, part 4): which labels train, which
judge, and whether the new light RM is served. Pure: no models, Kafka or Redis (``strata_tools.rm.loop``
runs the turn).

Fresh on-policy labels (annotators' scores of the policy's own answers, Level-2's and a sampled
share of Level-1's) are split by prompt: a held-out slice that nothing trains on, and the rest, on
which the strong RM is fine-tuned (with replay of its own data) and from which the light RM is
re-distilled. The candidate light RM is promoted only when it ranks the held-out slice better than
the light RM in service: Llama 2's RM iteration on fresh samples of the latest policy, with a
promotion gate, built into the rollout system.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from strata.hashing import content_hash

PAIR_MARGIN = 0.5  # two answers to one prompt whose scores differ by at least this much form a pair


class RefreshOptions(BaseSettings):
    """``strata rm refresh``; every field is also ``STRATA_RM_REFRESH_<NAME>`` (flags win)."""

    model_config = SettingsConfigDict(env_prefix="STRATA_RM_REFRESH_", frozen=True, extra="ignore")

    annotations: bool = Field(True, description="read the annotators' scores from Kafka (AnnotationCompleted)")
    data: tuple[str, ...] = Field((), description="JSONL files of {prompt, response, score} labels, besides")
    audits: bool = Field(
        False, description="also the audited Level-1 answers, labelled by the strong RM (svc_reward's audit stream): "
        "the current policy's answers, to re-distil the light RM where the policy now writes; with every_s, on "
        "for the turn that answers the hacking defence's request"
    )
    hold_out: float = Field(0.3, gt=0, lt=1, description="share of the labelled prompts held out to judge on")
    min_held_out: int = Field(20, ge=3, description="fewest held-out labels a verdict is drawn from")
    min_train: int = Field(20, ge=1, description="fewest labels to fine-tune on")
    min_gain: float = Field(
        0.0, ge=0, description="Spearman gain on the held-out slice a candidate light RM needs to be promoted"
    )
    min_gain_se: float = Field(
        1.0, ge=0, description="...and the gain must exceed this many bootstrap standard errors (0: any gain)"
    )
    strong_epochs: float = Field(
        3.0, gt=0, description="passes over the labelled prompts (and the replay) the strong RM fine-tunes for"
    )
    strong_steps: int | None = Field(None, ge=1, description="fine-tuning steps; unset: from strong_epochs")
    strong_lr: float | None = Field(
        None, gt=0, description="peak learning rate; unset: 0.6 x the zoo recipe's (3e-5 on the default zoo)"
    )
    replay: float = Field(
        0.5, ge=0, description="groups of the zoo's RM data mixed in per labelled prompt (keeps what it knew)"
    )
    distill_steps: int | None = Field(None, ge=1, description="KL steps of the light RM; unset: the zoo recipe's")
    distill_pairs: int = Field(1000, ge=0, description="zoo RM pairs the new strong RM labels for the distillation")
    promote: bool = Field(True, description="promote (hot swap) a candidate that ranks the held-out slice better")
    every_s: float = Field(0.0, ge=0, description="run a turn every this many seconds (0: once)")
    min_new_labels: int = Field(50, ge=1, description="with every_s: fresh labels since the last turn to run one")
    fit_rule: bool = Field(
        False, description="with no escalation rule in service, fit a first one for the candidate on people's "
        "labels (the light score and the neighbourhood's record), served if it ranks them better than the score"
    )
    rule_min_answers: int = Field(
        80, ge=10, description="fewest held-out Level-1 answers people labelled (with their signals kept) to refit "
        "the escalation rule on, when the version in service has one"
    )
    rule_min_bad: int = Field(8, ge=2, description="...and fewest of them labelled bad")
    rule_target_catch: float | None = Field(
        None, gt=0, le=1, description="share of the labelled-bad answers the fitted rule's threshold escalates; "
        "unset: the rule in service's (a first rule: 0.9). People's noise near the bad line makes a 0.9 catch "
        "of their labels dearer than of the oracle's (docs/reward-models.md)"
    )
    rule_bad_below: float | None = Field(
        None, allow_inf_nan=False, description="a person's score under this marks a Level-1 answer bad for the "
        "rule; unset: the line the rule in service was fitted with (else 1.5)"
    )
    bootstrap_rounds: int = Field(1000, ge=100, description="resamples of the held-out slice for the gain's SE")
    seed: int = 0
    device: str = "auto"


def is_held_out(prompt: str, share: float) -> bool:
    """Whether a prompt is in the held-out slice: by its content hash, so stable across turns (a prompt
    judged on once is never trained on later) and across processes."""
    return int(content_hash(prompt)[:8], 16) / 0xFFFFFFFF < share


def split_by_prompt(rows: Sequence[dict[str, Any]], share: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Labelled rows split into (train, held out) by their prompt, each answer to a prompt on one side."""
    train: list[dict[str, Any]] = []
    held: list[dict[str, Any]] = []
    for row in rows:
        (held if is_held_out(row["prompt"], share) else train).append(row)
    return train, held


def grouped_by_prompt(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a ``group`` per prompt, so that the strong RM's ranking loss compares the answers
    to one prompt (a Level-1 and a Level-2 answer, say) with each other."""
    return [{**row, "group": f"label:{content_hash(row['prompt'])[:16]}"} for row in rows]


def replay_groups(rows: Sequence[dict[str, Any]], n_groups: int, seed: int) -> list[dict[str, Any]]:
    """``n_groups`` whole groups of the RM data (``groups_of``: rows without a group are groups of one),
    seeded."""
    from strata_tools.rm.recipe import groups_of  # the recipe's grouping rule (its module loads torch)

    groups = groups_of(list(rows))
    chosen = random.Random(seed).sample(range(len(groups)), min(n_groups, len(groups)))
    return [{**rows[i], "group": f"replay:{g}"} for g in chosen for i in groups[g]]


def fine_tune_steps(n_prompts: int, n_replay_groups: int, groups_per_step: int, options: RefreshOptions) -> int:
    """Steps of the strong RM's fine-tuning: ``strong_steps``, else ``strong_epochs`` passes over the
    labelled prompts and the replayed groups."""
    if options.strong_steps is not None:
        return options.strong_steps
    return max(1, math.ceil(options.strong_epochs * (n_prompts + n_replay_groups) / groups_per_step))


def shortfall(n_train: int, n_held: int, options: RefreshOptions) -> str | None:
    """Why a turn cannot be judged with these labels, or None."""
    if n_held < options.min_held_out or n_train < options.min_train:
        return (f"{n_train} labels to train on and {n_held} held out, of at least {options.min_train} and "
                f"{options.min_held_out} (min_train, min_held_out): label more answers first (the demo's desk, or "
                "annotate_level1_share on svc_reward)")
    return None


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(predicted: Sequence[float], reference: Sequence[float]) -> float:
    """Spearman's rho with mean ranks for ties; nan when either side is constant."""
    if len(predicted) != len(reference):
        raise ValueError(f"{len(predicted)} predictions for {len(reference)} references")
    a, b = ranks(predicted), ranks(reference)
    n = len(a)
    if n < 2:
        return float("nan")
    mean_a, mean_b = sum(a) / n, sum(b) / n
    cov = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    var_a, var_b = sum((x - mean_a) ** 2 for x in a), sum((y - mean_b) ** 2 for y in b)
    return cov / math.sqrt(var_a * var_b) if var_a > 0 and var_b > 0 else float("nan")


@dataclass(frozen=True)
class SliceFigures:
    """One RM on the held-out slice."""

    n: int
    spearman: float        # against the human labels
    pair_accuracy: float   # answers to one prompt whose labels differ by PAIR_MARGIN, ordered as labelled
    n_pairs: int


def pairwise_accuracy(pairs: Sequence[tuple[float, float, float, float]], margin: float) -> tuple[float, int]:
    """Share of ``(reward_a, reward_b, oracle_a, oracle_b)`` with ``|oracle_a - oracle_b| >= margin``
    that the RM orders as the oracle does (a tie counts half), and how many such pairs there were."""
    clear = [(ra, rb, oa, ob) for ra, rb, oa, ob in pairs if abs(oa - ob) >= margin]
    if not clear:
        return float("nan"), 0
    right = sum(1.0 if (ra - rb) * (oa - ob) > 0 else 0.5 if ra == rb else 0.0 for ra, rb, oa, ob in clear)
    return right / len(clear), len(clear)


def slice_figures(rewards: Sequence[float], labels: Sequence[float], prompts: Sequence[str],
                  margin: float = PAIR_MARGIN) -> SliceFigures:
    if not len(rewards) == len(labels) == len(prompts):
        raise ValueError(f"{len(rewards)} rewards, {len(labels)} labels and {len(prompts)} prompts")
    by_prompt: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        by_prompt.setdefault(prompt, []).append(i)
    pairs = [(rewards[i], rewards[j], labels[i], labels[j])
             for items in by_prompt.values() for x, i in enumerate(items) for j in items[x + 1:]]
    accuracy, n_pairs = pairwise_accuracy(pairs, margin)
    return SliceFigures(len(rewards), spearman(rewards, labels), accuracy, n_pairs)


def gain_se(candidate: Sequence[float], current: Sequence[float], labels: Sequence[float], rounds: int,
            seed: int) -> float:
    """Bootstrap standard error of ``spearman(candidate) - spearman(current)`` on the same items."""
    rng = random.Random(seed)
    n = len(labels)
    gains = []
    for _ in range(rounds):
        pick = [rng.randrange(n) for _ in range(n)]
        ref = [labels[i] for i in pick]
        gain = spearman([candidate[i] for i in pick], ref) - spearman([current[i] for i in pick], ref)
        if math.isfinite(gain):
            gains.append(gain)
    if len(gains) < 2:
        return float("nan")
    mean = sum(gains) / len(gains)
    return math.sqrt(sum((g - mean) ** 2 for g in gains) / (len(gains) - 1))


@dataclass(frozen=True)
class Verdict:
    promote: bool
    reason: str


def verdict(current: SliceFigures, candidate: SliceFigures, se: float, min_gain: float, current_name: str,
            candidate_name: str, min_gain_se: float = 0.0) -> Verdict:
    """Promote the candidate light RM only when it ranks the held-out slice better (Spearman against
    the labels) by more than ``min_gain`` and than ``min_gain_se`` bootstrap standard errors: a gain
    inside the noise of a small slice is not evidence. The reason carries the figures either way."""
    gain = candidate.spearman - current.spearman
    needed = max(min_gain, min_gain_se * se) if math.isfinite(se) else min_gain
    figures = (f"Spearman vs the labels on {candidate.n} held-out answers {current.spearman:.3f} ({current_name}, in "
               f"service) -> {candidate.spearman:.3f} ({candidate_name}), gain {gain:+.3f} ± {se:.3f} (bootstrap SE)")
    if not math.isfinite(candidate.spearman):
        return Verdict(False, f"not promoting: the candidate's ranking is undefined (constant rewards or labels); "
                              f"{figures}")
    if math.isfinite(current.spearman) and gain <= needed:
        return Verdict(False, f"not promoting {candidate_name}: {figures}, not above the {needed:.3f} needed")
    return Verdict(True, f"promoting {candidate_name}: {figures}")
