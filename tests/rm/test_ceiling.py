"""The escalation ceiling's bounds: least share for a catch, the binormal AUC needed, APGR of an order."""

from __future__ import annotations

import random
from statistics import NormalDist

import pytest

from strata_tools.rm.ceiling import binormal_auc_needed, escalation_apgr, least_share_for_catch


def test_least_share_escalates_the_most_suspicious_until_the_catch_is_met() -> None:
    suspicion = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0]
    bad = [True, False, True, False, False, True, False, False, False, False]
    assert least_share_for_catch(suspicion, bad, 1.0) == pytest.approx(0.6)   # the third bad sits sixth
    assert least_share_for_catch(suspicion, bad, 0.6) == pytest.approx(0.3)   # two of three: down to 0.7
    assert least_share_for_catch(suspicion, bad, 0.3) == pytest.approx(0.1)


def test_least_share_takes_a_whole_tie_with_the_last_bad_answer() -> None:
    assert least_share_for_catch([1.0, 0.5, 0.5, 0.5, 0.0], [True, False, True, False, False], 1.0) == \
        pytest.approx(0.8)


def test_least_share_refuses_answers_without_a_bad_one() -> None:
    with pytest.raises(ValueError, match="no bad answer"):
        least_share_for_catch([0.1, 0.2], [False, False], 0.9)
    with pytest.raises(ValueError, match="target catch"):
        least_share_for_catch([0.1, 0.2], [True, False], 0.0)


def test_binormal_auc_needed_matches_a_simulated_detector() -> None:
    """Draw a binormal detector at the AUC the function names and read its share at a 90 % catch."""
    needed = binormal_auc_needed(0.9, 0.30, 0.135)
    separation = NormalDist().inv_cdf(needed) * 2 ** 0.5
    rng = random.Random(3)
    bad = [rng.random() < 0.135 for _ in range(200_000)]
    suspicion = [rng.gauss(separation if b else 0.0, 1.0) for b in bad]
    assert least_share_for_catch(suspicion, bad, 0.9) == pytest.approx(0.30, abs=0.01)
    assert 0.92 < needed < 0.94


def test_binormal_auc_needed_rises_as_the_share_falls_and_refuses_an_impossible_share() -> None:
    assert binormal_auc_needed(0.9, 0.25, 0.135) > binormal_auc_needed(0.9, 0.35, 0.135)
    with pytest.raises(ValueError, match="cannot hold"):
        binormal_auc_needed(0.9, 0.10, 0.135)


def test_apgr_ranks_the_gain_order_first_a_random_order_between_and_ties_as_one_step() -> None:
    level1 = [1.0, 2.0, 3.0, 4.0]
    level2 = [3.0, 3.0, 3.0, 3.0]        # Level-2 helps the first two, hurts the last
    gain = [b - a for a, b in zip(level1, level2, strict=True)]
    best = escalation_apgr(gain, level1, level2)
    worst = escalation_apgr([-g for g in gain], level1, level2)
    assert best == pytest.approx(1.125)  # PGR 1, 1.5, 1.5, 1 at 1-4 escalated: past all-Level-2 on the way
    assert worst == pytest.approx(-0.125)
    rng = random.Random(3)
    orders = [escalation_apgr([rng.random() for _ in level1], level1, level2) for _ in range(400)]
    assert worst < sum(orders) / len(orders) < best
    assert escalation_apgr([0.0] * 4, level1, level2) == pytest.approx(0.5)  # one step from none to all


def test_apgr_refuses_a_level2_no_better_than_level1() -> None:
    with pytest.raises(ValueError, match="no gap"):
        escalation_apgr([1.0, 0.0], [3.0, 3.0], [2.0, 3.0])
