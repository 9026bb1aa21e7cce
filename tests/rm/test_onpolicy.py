"""The on-policy figures of an RM (R24), on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from strata_tools.rm.onpolicy import PolicyAnswer, detection_auc, onpolicy_figures
from strata_tools.rm.refresh import pairwise_accuracy


def answer(prompt_id: str, tier: str, oracle: float) -> PolicyAnswer:
    return PolicyAnswer(prompt_id, f"prompt {prompt_id}", tier, f"{tier} answer", ("explain_principle",), oracle)


@pytest.mark.parametrize(("rewards", "bad", "auc"), [
    ([1.0, 2.0, 3.0, 4.0], [True, True, False, False], 1.0),  # every bad answer under every good one
    ([4.0, 3.0, 2.0, 1.0], [True, True, False, False], 0.0),  # upside down
    ([2.0, 2.0, 2.0, 2.0], [True, False, True, False], 0.5),  # all tied: chance
    ([1.0, 3.0, 2.0, 4.0], [True, True, False, False], 0.75),  # 3 of the 4 (bad, good) pairs in order
    ([1.0, 2.0, 2.0], [True, True, False], 0.75),  # (1 < 2) counts 1, the tie (2, 2) counts half
])
def test_detection_auc_is_the_share_of_bad_good_pairs_in_order(rewards: list[float], bad: list[bool],
                                                               auc: float) -> None:
    assert detection_auc(rewards, bad) == pytest.approx(auc)


def test_detection_auc_needs_both_kinds_and_one_flag_per_reward() -> None:
    assert math.isnan(detection_auc([1.0, 2.0], [False, False]))
    with pytest.raises(ValueError, match="one bad flag per reward"):
        detection_auc([1.0, 2.0], [True])


def test_pairwise_accuracy_counts_only_clear_pairs_and_ties_half() -> None:
    pairs = [
        (1.0, 2.0, 1.0, 3.0),  # right order
        (2.0, 1.0, 1.0, 3.0),  # wrong order
        (2.0, 2.0, 4.0, 1.0),  # tied rewards: half
        (1.0, 5.0, 3.0, 3.2),  # oracle scores 0.2 apart: not a clear pair, left out
    ]
    accuracy, n = pairwise_accuracy(pairs, margin=0.5)
    assert n == 3 and accuracy == pytest.approx(1.5 / 3)
    assert math.isnan(pairwise_accuracy(pairs[3:], margin=0.5)[0])


def test_onpolicy_figures_split_by_tier_and_pair_by_prompt() -> None:
    answers = [answer("a", "level1", 1.0), answer("b", "level1", 2.0), answer("c", "level1", 4.0),
               answer("a", "level2", 3.0), answer("b", "level2", 2.1), answer("c", "level2", 4.5)]
    rewards = [1.5, 2.5, 3.5, 3.0, 1.0, 4.0]  # each tier in its oracle order
    figures = onpolicy_figures(answers, rewards, bad_threshold=1.5, pair_margin=0.5)
    assert (figures.n_level1, figures.n_level2, figures.n_bad) == (3, 3, 1)
    assert figures.spearman_level1 == pytest.approx(1.0)
    assert figures.spearman_level2 == pytest.approx(1.0)  # 3.0 > 1.0 < 4.0 ranks as 3.0 > 2.1 < 4.5
    assert figures.bad_auc == pytest.approx(1.0)  # the one bad answer (a) has the lowest Level-1 reward
    # Clear pairs: a (1.0 vs 3.0; rewards 1.5 < 3.0: right) and c (4.0 vs 4.5 is 0.5 apart; 3.5 < 4.0: right);
    # b (2.0 vs 2.1) is not clear.
    assert figures.n_pairs == 2 and figures.pair_accuracy == pytest.approx(1.0)


def test_onpolicy_figures_refuse_a_reward_count_that_does_not_match() -> None:
    with pytest.raises(ValueError, match="2 rewards for 1 answers"):
        onpolicy_figures([answer("a", "level1", 1.0)], [1.0, 2.0])
