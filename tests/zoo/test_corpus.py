"""Reference responses are good under the oracle; each degradation makes them worse."""

from __future__ import annotations

import random
import statistics
from collections import defaultdict

import pytest

from strata_tools.task.corpus import (
    DEGRADATIONS,
    degrade,
    lm_texts,
    probe_texts,
    prompt_swaps,
    reference_response,
    rm_groups,
    rm_pairs,
)
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import load_suite


def test_reference_responses_score_high() -> None:
    rng = random.Random(0)
    records = load_suite("eval")
    scores = [oracle_score(r, reference_response(r, rng)) for r in records]
    assert statistics.mean(scores) > 4.6
    assert min(scores) > 3.8


def test_every_degradation_lowers_the_mean_score() -> None:
    rng = random.Random(0)
    records = load_suite("eval")
    drops: dict[str, list[float]] = defaultdict(list)
    for record in records:
        reference = reference_response(record, rng)
        for kind in DEGRADATIONS:
            if kind in ("unsafe", "no_caution") and not record.risk:
                continue
            worse = degrade(record, reference, kind, rng)
            drops[kind].append(oracle_score(record, reference) - oracle_score(record, worse))
    for kind, values in drops.items():
        assert statistics.mean(values) > 0.5, kind


def test_corpora_are_deterministic() -> None:
    records = load_suite("train")[:50]
    assert lm_texts(records, 2, seed=3) == lm_texts(records, 2, seed=3)
    assert lm_texts(records, 2, seed=3) != lm_texts(records, 2, seed=4)
    assert probe_texts(records, seed=1) == probe_texts(records, seed=1)
    assert rm_pairs(records, 2, seed=5) == rm_pairs(records, 2, seed=5)
    assert all(text.startswith("Q: ") and "\nA: " in text for text in lm_texts(records, 1, seed=0))


def test_rm_pairs_have_a_wide_spread_of_scores() -> None:
    pairs = rm_pairs(load_suite("train")[:400], 2, seed=0)
    scores = [oracle_score(p.record, p.response) for p in pairs]
    assert statistics.pstdev(scores) > 1.0
    assert min(scores) < 1.5 and max(scores) > 4.5


def test_rm_groups_contrast_a_reference_with_its_own_degradations() -> None:
    records = load_suite("train")[:200]
    groups = rm_groups(records, 4, seed=0)
    assert groups == rm_groups(records, 4, seed=0)
    assert len(groups) == len(records) and all(len(g) == 4 for g in groups)
    better = 0
    for record, group in zip(records, groups, strict=True):
        assert {p.record for p in group} == {record}
        assert group[0].kind == "reference" and all(p.kind != "reference" for p in group[1:])
        scores = [oracle_score(p.record, p.response) for p in group]
        better += sum(scores[0] > s for s in scores[1:])
    assert better / (3 * len(groups)) > 0.9  # a degradation almost always costs score
    with pytest.raises(ValueError, match="at least 2"):
        rm_groups(records, 1, seed=0)


def test_prompt_swaps_pair_a_reference_with_a_prompt_it_answers_worse() -> None:
    records, pool = load_suite("eval")[:120], load_suite("eval")
    swaps = prompt_swaps(records, seed=0, others=pool)
    assert swaps == prompt_swaps(records, seed=0, others=pool)
    assert len(swaps) == len(records) and {s.kind for s in swaps} == {"swap_intent", "swap_subject"}
    for swap in swaps:
        record, other = swap.record, swap.other
        if swap.kind == "swap_intent":
            assert other.subject == record.subject and other.intent != record.intent
        else:
            assert other.intent == record.intent and other.subject != record.subject
        # The oracle compares answer and prompt: the answer is always worth less under the other one.
        assert oracle_score(record, swap.response) > oracle_score(other, swap.response)


def test_pairwise_loss_prefers_the_better_answer_and_ignores_ties() -> None:
    import torch

    from strata_tools.rm.train import pairwise_loss

    scores = torch.tensor([4.8, 2.0, 2.1])  # 2.0 and 2.1 are within the margin: no pair between them
    right = pairwise_loss(torch.tensor([4.0, 1.0, 1.0]), scores, margin=0.25)
    wrong = pairwise_loss(torch.tensor([1.0, 4.0, 4.0]), scores, margin=0.25)
    assert right < 0.1 < 2.0 < wrong
    # two qualifying pairs, each -log sigmoid(3) when ranked right
    assert right.item() == pytest.approx(torch.nn.functional.softplus(torch.tensor(-3.0)).item())
    assert pairwise_loss(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 3.1]), margin=0.25).item() == 0.0
