import math

import pytest

from strata_tools.bench.reuse_ceiling import CeilingResult, ReuseHistory, ceiling_skips


def test_the_ceiling_takes_the_smallest_errors_while_their_mean_fits() -> None:
    # 0.1, 0.2, 0.3, 0.5 -> means 0.1, 0.15, 0.2, 0.275; adding 0.9 would make 0.4.
    assert ceiling_skips([0.9, 0.3, 0.1, 0.5, 0.2], budget=0.3) == (4, pytest.approx(0.275))
    assert ceiling_skips([0.9, 0.3, 0.1, 0.5, 0.2], budget=1.0) == (5, pytest.approx(0.4))
    count, mae = ceiling_skips([0.5, 0.6], budget=0.3)
    assert count == 0 and math.isnan(mae)


def test_history_reuses_only_rewards_within_the_policy_lag() -> None:
    history = ReuseHistory(max_policy_lag=1)
    assert history.mean("p", 1, of_family=False) is None
    history.add("p", "f", [1.0, 3.0], version=1)
    history.add("q", "f", [5.0], version=2)
    assert history.mean("p", 2, of_family=False) == 2.0
    assert history.mean("f", 2, of_family=True) == 3.0
    assert history.mean("f", 3, of_family=True) == 5.0  # version 1 is two versions old at 3
    assert history.mean("p", 3, of_family=False) is None


def test_reduction_is_per_submission() -> None:
    result = CeilingResult(submitted=10, own_errors=[0.1, 0.2], family_errors=[0.1, 0.2, 0.3, 0.4, 2.0])
    assert result.reduction(of_family=False, budget=0.3) == (0.2, pytest.approx(0.15))
    assert result.reduction(of_family=True, budget=0.3) == (0.4, pytest.approx(0.25))


def test_reduction_within_a_variance_bound_counts_only_prompts_under_it() -> None:
    result = CeilingResult(submitted=10)
    for error, variance in ((0.1, 0.1), (0.2, 0.5), (0.3, 0.9), (0.05, 2.0)):
        result.add(of_family=True, error=error, variance=variance)
    assert result.reduction(of_family=True, budget=0.3) == (0.4, pytest.approx(0.1625))
    assert result.reduction(of_family=True, budget=0.3, max_variance=0.8) == (0.2, pytest.approx(0.15))
    assert result.reduction(of_family=True, budget=0.3, max_variance=0.3) == (0.1, pytest.approx(0.1))
    assert result.reduction(of_family=False, budget=0.3, max_variance=0.3)[0] == 0.0


def test_a_variance_bound_without_variances_is_refused() -> None:
    result = CeilingResult(submitted=2, family_errors=[0.1, 0.2])
    with pytest.raises(ValueError, match="true variance"):
        result.reduction(of_family=True, budget=0.3, max_variance=0.8)
