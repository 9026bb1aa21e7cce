"""Reward pairs and the figures that judge an encoder on them (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from strata_tools.encoder.pairs import (
    RewardPair,
    ScoredPrompt,
    agreement,
    at_floor,
    auc,
    floor_for_precision,
    held_out,
    neighbour_pairs,
    neighbourhood_groups,
    pair_similarities,
    split_pairs,
)


def unit(*rows: list[float]) -> np.ndarray:
    vectors = np.asarray(rows, dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_neighbour_pairs_are_the_nearest_above_the_floor_once_each_labelled_by_agreement() -> None:
    vectors = unit([1, 0, 0], [0.95, 0.05, 0], [0.9, 0.1, 0], [0, 1, 0])
    means = [4.0, 4.3, 2.0, 4.0]
    pairs = neighbour_pairs(vectors, means, k=2, min_similarity=0.5, tolerance=0.5)
    got = {(p.a, p.b): p.agree for p in pairs}
    # prompt 3 is orthogonal to the others: below the floor, never paired, whatever its reward
    assert got == {(0, 1): True, (0, 2): False, (1, 2): False}


def test_neighbour_pairs_work_in_blocks_like_all_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(50, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    means = rng.uniform(0, 5, size=50).tolist()
    whole = neighbour_pairs(vectors, means, 5, -1.0, 0.5)
    monkeypatch.setattr("strata_tools.encoder.pairs.ROWS_PER_BLOCK", 7)
    assert neighbour_pairs(vectors, means, 5, -1.0, 0.5) == whole


def test_neighbour_pairs_refuse_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="2 vectors but 1 means"):
        neighbour_pairs(unit([1, 0], [0, 1]), [1.0], 1, 0.0, 0.5)
    assert neighbour_pairs(unit([1, 0]), [1.0], 3, 0.0, 0.5) == []


def test_the_held_out_split_is_deterministic_keeps_groups_together_and_drops_mixed_pairs() -> None:
    keys = [f"prompt-{i}" for i in range(400)]
    share = sum(held_out(k, 0.25) for k in keys) / len(keys)
    assert 0.15 < share < 0.35
    assert [held_out(k, 0.25) for k in keys] == [held_out(k, 0.25) for k in keys]
    family = ScoredPrompt("ab" * 32, "text", 3.0, 4, group="family-7")
    alone = ScoredPrompt("ab" * 32, "text", 3.0, 4)
    assert family.split_key == "family-7" and alone.split_key == "ab" * 32
    out = [k for k in keys if held_out(k, 0.25)][:2]
    kept = [k for k in keys if not held_out(k, 0.25)][:2]
    order = [*out, *kept]
    pairs = [RewardPair(0, 1, True), RewardPair(2, 3, False), RewardPair(0, 2, True)]
    train, evaluation = split_pairs(pairs, order, 0.25)
    assert train == [RewardPair(2, 3, False)] and evaluation == [RewardPair(0, 1, True)]


def test_auc_counts_ties_half_and_is_nan_without_both_classes() -> None:
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), np.array([True, True, False, False])) == 1.0
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([True, True, False, False])) == 0.0
    assert auc(np.array([0.5, 0.5]), np.array([True, False])) == 0.5
    assert auc(np.array([0.9, 0.3, 0.5]), np.array([True, False, True])) == 1.0
    assert np.isnan(auc(np.array([0.3]), np.array([True])))


def test_floor_figures_and_the_lowest_floor_at_a_precision() -> None:
    sims = np.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.6])
    agree = np.array([True, True, True, False, True, False])
    figures = at_floor(sims, agree, 0.8)
    assert (figures.precision, figures.recall, figures.kept) == (0.75, 0.75, 4)
    # precision >= 0.8 holds down to 0.7 (4 of 5 agree), not to 0.6 (4 of 6)
    chosen = floor_for_precision(sims, agree, 0.8, min_kept=1)
    assert chosen is not None and chosen.floor == pytest.approx(0.7) and chosen.recall == 1.0
    assert floor_for_precision(sims, agree, 1.01, min_kept=1) is None
    assert floor_for_precision(sims, agree, 0.5, min_kept=10) is None  # too few pairs to measure


def test_pair_similarities_are_the_cosines_of_the_pairs() -> None:
    vectors = unit([1, 0], [0, 1], [1, 1])
    sims = pair_similarities(vectors, [RewardPair(0, 1, True), RewardPair(0, 2, False)])
    assert sims == pytest.approx([0.0, 2 ** -0.5], abs=1e-6)
    assert pair_similarities(vectors, []).shape == (0,)


def test_noisy_means_are_labelled_only_where_the_noise_lets_one_tell() -> None:
    assert agreement(0.1, 0.1, 0.5, 1.0) is True
    assert agreement(0.9, 0.1, 0.5, 1.0) is False
    assert agreement(0.45, 0.3, 0.5, 1.0) is None  # as likely to agree as not: dropped
    assert agreement(0.45, float("inf"), 0.5, 0.0) is True  # z = 0: the difference alone
    vectors = unit([1, 0], [0.99, 0.1], [0.98, 0.2])
    pairs = neighbour_pairs(vectors, [4.0, 3.6, 1.0], 2, 0.5, 0.5, standard_errors=[0.05, 0.3, 0.05], z=1.0)
    assert {(p.a, p.b): p.agree for p in pairs} == {(0, 2): False, (1, 2): False}  # 0-1 undecided


def test_ties_at_a_floor_are_kept_together() -> None:
    sims = np.array([0.9, 0.8, 0.8, 0.7])
    agree = np.array([True, True, False, False])
    # a floor at 0.8 keeps both pairs tied there (2 of 3 agree); it cannot keep the agreeing one alone
    chosen = floor_for_precision(sims, agree, 0.7, min_kept=1)
    assert chosen is not None and chosen.floor == pytest.approx(0.9)
    lower = floor_for_precision(sims, agree, 0.6, min_kept=1)
    assert lower is not None and lower.floor == pytest.approx(0.8) and lower.kept == 3


def test_neighbourhoods_group_what_the_floor_links_even_along_a_chain() -> None:
    vectors = unit([1, 0, 0], [0.9, 0.3, 0], [0.7, 0.7, 0], [0, 0, 1], [0, 0.1, 1])
    assert neighbourhood_groups(vectors, 2, 0.85) == [0, 0, 0, 3, 3]  # 0 and 2 at 0.71, joined through 1
    assert neighbourhood_groups(vectors, 2, 0.999) == [0, 1, 2, 3, 4]


def test_aged_rewards_count_for_less_in_the_standard_error() -> None:
    fresh = ScoredPrompt("a" * 64, "text", 3.0, 8, variance=2.0)
    aged = ScoredPrompt("a" * 64, "text", 3.0, 8, variance=2.0, effective_count=2.0)
    assert fresh.standard_error == pytest.approx(0.5) and aged.standard_error == pytest.approx(1.0)
    assert ScoredPrompt("a" * 64, "text", 3.0, 0).standard_error == float("inf")
