"""Reward models judged on the policy's own answers (R24): the answers, and the figures on them.

An RM's rank agreement on reference-and-degradation pairs (``strata_tools.rm.lifecycle.eval_sets``) says
little about how it ranks what the policy writes: the zoo's RMs rank those pairs at Spearman 0.82
and Level-1's answers at 0.20 (docs/reward-models.md). This module builds the set the RMs meet live
and scores an RM on it:

- **The answers** (:func:`policy_answers`): for every prompt of a held-out split that live Level-1
  would answer (the probe is not cautious), Level-1 and Level-2 each write one answer prompted and
  sampled exactly as the running stack does (``strata_tools.level1``); the oracle judges each.
  Cached on disk by the three models' weights, the split, the seed and the live prompting, so a
  bench run pays the generation once per zoo.
- **The figures** (:func:`onpolicy_figures`, pure): Spearman against the oracle on Level-1 answers
  and on Level-2 answers; the bad-case AUC (how well a low reward finds a Level-1 answer the oracle
  scores under ``bad_threshold``: what escalation needs); and the pairwise accuracy on the two
  answers to one prompt whose oracle scores differ by at least ``pair_margin`` (Llama 2's
  held-out pairwise accuracy, the figure that PPO's advantages need).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from strata.contract.checksums import weights_checksum
from strata_tools.level1 import LivePrompting, generate_answers, probe_prompts
from strata_tools.rm.models import ZooModels
from strata_tools.rm.refresh import PAIR_MARGIN, pairwise_accuracy, spearman
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import load_suite, stratified_sample

log = logging.getLogger(__name__)

TIERS: tuple[str, ...] = ("level1", "level2")
BAD_THRESHOLD = 1.5  # an oracle score under this is a bad case (as `strata bench tiers` counts them)
ANSWERS_SEED = 11
TIER_NUMBERS: dict[str, Literal[1, 2]] = {"level1": 1, "level2": 2}
ANSWERS_FORMAT = "2"  # bump when what an answer set holds changes (part of the cache key)


@dataclass(frozen=True)
class PolicyAnswer:
    """One answer of one tier to one held-out prompt, with the oracle's score of it."""

    prompt_id: str
    prompt: str
    tier: str  # level1 | level2
    response: str
    directions: tuple[str, ...]  # the probe's, best first, as the generator was given them
    oracle: float


@dataclass(frozen=True)
class OnPolicyFigures:
    """An RM on the policy's answers; ``nan`` where a figure has too few answers to exist."""

    spearman_level1: float
    spearman_level2: float
    bad_auc: float  # on Level-1 answers: P(reward of a bad answer < reward of a good one), ties 1/2
    pair_accuracy: float  # share of clear (Level-1, Level-2) pairs the RM orders as the oracle does
    n_level1: int
    n_level2: int
    n_bad: int
    n_pairs: int


def detection_auc(rewards: Sequence[float], bad: Sequence[bool]) -> float:
    """Area under the ROC curve of ``-reward`` as a detector of ``bad``: the probability that a bad
    answer gets a lower reward than a good one, ties counted half (Mann-Whitney). ``nan`` without
    both kinds."""
    if len(rewards) != len(bad):
        raise ValueError("one bad flag per reward")
    bad_rewards = [r for r, b in zip(rewards, bad, strict=True) if b]
    good_rewards = sorted(r for r, b in zip(rewards, bad, strict=True) if not b)
    if not bad_rewards or not good_rewards:
        return float("nan")

    wins = 0.0
    for reward in bad_rewards:
        lower = bisect.bisect_left(good_rewards, reward)  # good answers rewarded below this bad one
        upper = bisect.bisect_right(good_rewards, reward)
        wins += (len(good_rewards) - upper) + 0.5 * (upper - lower)
    return wins / (len(bad_rewards) * len(good_rewards))


def onpolicy_figures(answers: Sequence[PolicyAnswer], rewards: Sequence[float],
                     bad_threshold: float = BAD_THRESHOLD, pair_margin: float = PAIR_MARGIN) -> OnPolicyFigures:
    """The figures of one RM whose rewards of ``answers`` (same order) are ``rewards``."""
    if len(answers) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards for {len(answers)} answers")
    by_tier: dict[str, list[tuple[PolicyAnswer, float]]] = {tier: [] for tier in TIERS}
    for answer, reward in zip(answers, rewards, strict=True):
        by_tier.setdefault(answer.tier, []).append((answer, reward))
    level1, level2 = by_tier["level1"], by_tier["level2"]
    bad = [a.oracle < bad_threshold for a, _ in level1]
    first = {a.prompt_id: (a, r) for a, r in level1}
    pairs = [(first[a.prompt_id][1], r, first[a.prompt_id][0].oracle, a.oracle)
             for a, r in level2 if a.prompt_id in first]
    accuracy, n_pairs = pairwise_accuracy(pairs, pair_margin)
    return OnPolicyFigures(
        spearman_level1=spearman([r for _, r in level1], [a.oracle for a, _ in level1]),
        spearman_level2=spearman([r for _, r in level2], [a.oracle for a, _ in level2]),
        bad_auc=detection_auc([r for _, r in level1], bad),
        pair_accuracy=accuracy,
        n_level1=len(level1), n_level2=len(level2), n_bad=sum(bad), n_pairs=n_pairs,
    )


# --- the answers (loads the zoo's models) ---------------------------------------------------------


def answers_key(model_dirs: Sequence[Path], split: str, seed: int, sampling: Mapping[str, Any]) -> str:
    """Cache key of an answer set: the probe's and generators' weights, the split, seed and sampling."""
    payload = {"format": ANSWERS_FORMAT, "models": [weights_checksum([d]) for d in model_dirs], "split": split,
               "seed": seed, "sampling": dict(sampling)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def sample_policy_answers(probe_dir: Path, generator_dirs: Mapping[str, Path], records: Sequence[Any], seed: int,
                          progress: bool = True) -> list[PolicyAnswer]:
    """One answer per tier in ``generator_dirs`` to each record (a ``PromptRecord``) that live Level-1 would
    answer (the probe is not cautious about it), prompted and sampled as each tier is live
    (``strata_tools.level1``), judged by the oracle."""
    from svc_generator.backends.hf import HfBackend

    results = probe_prompts(probe_dir, [record.text for record in records])
    level1 = [(record, result) for record, result in zip(records, results, strict=True) if not result.caution]
    texts = [record.text for record, _ in level1]
    answers: list[PolicyAnswer] = []
    for offset, (tier, model_dir) in enumerate(tqdm(list(generator_dirs.items()), desc="policy answers", unit="tier",
                                                    leave=False, disable=not progress)):
        prompting = LivePrompting.live(TIER_NUMBERS[tier])
        directions = [prompting.directions(result) for _, result in level1]
        generations = generate_answers(HfBackend(str(model_dir), "cpu"), prompting, texts, directions, seed + offset)
        answers += [PolicyAnswer(record.id, record.text, tier, generation.text, forwarded,
                                 oracle_score(record, generation.text))
                    for (record, _), forwarded, generation in zip(level1, directions, generations, strict=True)]
    return answers


def policy_answers(zoo: ZooModels, split: str = "fresh", seed: int = ANSWERS_SEED, cache_dir: Path | None = None,
                   limit: int | None = None, progress: bool = True) -> list[PolicyAnswer]:
    """Level-1 and Level-2 answers to every prompt of ``split`` that live Level-1 would answer (``limit``: a
    seeded sample of that many, spread over topics and families), from the zoo ``zoo`` (``ZooModels``), cached as
    JSONL under ``cache_dir`` when given."""
    records = load_suite(split)
    if limit is not None:
        records = stratified_sample(records, limit, seed)
    if not records:
        raise ValueError(f"the suite has no prompts in split {split!r}")
    generators = {"level1": Path(zoo.level1), "level2": Path(zoo.level2)}
    # How sample_policy_answers prompts each tier (the live definition), so a key names the answers.
    prompting = {tier: LivePrompting.live(TIER_NUMBERS[tier]).key() for tier in generators}
    key = answers_key([Path(zoo.probe), *generators.values()], split, seed,
                      {"prompting": prompting, "n_prompts": len(records)})
    cache_file = Path(cache_dir) / f"{split}-{key}.jsonl" if cache_dir is not None else None
    if cache_file is not None and cache_file.is_file():
        rows = [json.loads(line) for line in cache_file.read_text(encoding="utf-8").splitlines() if line]
        return [PolicyAnswer(**{**row, "directions": tuple(row["directions"])}) for row in rows]
    answers = sample_policy_answers(Path(zoo.probe), generators, records, seed, progress)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        partial = cache_file.with_suffix(".partial")
        partial.write_text("".join(json.dumps(asdict(a)) + "\n" for a in answers), encoding="utf-8")
        partial.replace(cache_file)  # a reader never sees half a set
    log.info("%d policy answers to %d %s prompts (%s)", len(answers), len(records), split, key)
    return answers
