import pytest

from strata.ledger import TierCost, summarise


def test_saving_against_all_level2() -> None:
    # Level-1: 900 tokens at 1 ms; Level-2: 100 tokens at 10 ms.
    summary = summarise([TierCost(1, 9, 900, 0.9), TierCost(2, 1, 100, 1.0)], {"escalations": 1})
    assert summary.total_device_seconds == pytest.approx(1.9)
    assert summary.all_level2_device_seconds == pytest.approx(10.0)
    assert summary.saving == pytest.approx(1 - 1.9 / 10.0)


def test_without_level2_rollouts_a_given_cost_is_used_or_none() -> None:
    tiers = [TierCost(1, 1, 100, 0.1), TierCost(2, 0, 0, 0.0)]
    assert summarise(tiers, {}).saving is None
    assert summarise(tiers, {}, level2_seconds_per_token=0.01).saving == pytest.approx(0.9)
