import uuid

import pytest
import redis

from strata import ledger
from strata.ledger import Charge, StageCost, summarise


def _demo_like_stages() -> list[StageCost]:
    # 3 prompts, 1 sample each. Prompt A stays at Level-1; prompt B is escalated (its Level-1 sample and
    # its Level-2 regeneration both ran); prompt C went straight to Level-2.
    return [
        StageCost("probe", 0, 3, 30, 0.03, 3e4),
        StageCost("generate", 1, 2, 200, 0.2, 2e5),
        StageCost("rm_light", 1, 2, 300, 0.02, 3e4),
        StageCost("generate", 2, 2, 200, 2.0, 2e6),
        StageCost("rm_strong", 2, 2, 300, 0.6, 6e5),
        StageCost("human_review", 2, 2, human_seconds=120.0),
    ]


def test_an_escalated_prompt_is_counted_once_in_the_estimated_baseline() -> None:
    # Finals: A's Level-1 sample, B's and C's Level-2 samples -> 3 (B's Level-1 sample is not final).
    summary = summarise(_demo_like_stages(), {"final_tier1": 1, "final_tier2": 2, "escalations": 1})
    per_level2_sample = (2.0 + 0.6) / 2  # generation + strong RM, over the 2 Level-2 samples
    assert summary.baseline is not None and not summary.baseline.measured
    assert summary.all_level2_device_seconds == pytest.approx(3 * per_level2_sample)
    assert summary.total_device_seconds == pytest.approx(0.03 + 0.2 + 0.02 + 2.0 + 0.6)
    assert summary.saving == pytest.approx(1 - 2.85 / 3.9)
    assert summary.baseline.param_tokens == pytest.approx(3 * (2e6 + 6e5) / 2)
    assert summary.human_seconds == 120.0  # reported apart: never in the device-seconds
    assert "3 final samples" in summary.baseline.label


def test_the_old_double_count_would_have_overstated_the_saving() -> None:
    # The first release priced *every generated token* at Level-2: 400 tokens x 10 ms = 4.0 s of
    # generation alone, counting B twice. The estimate prices 3 samples, not 4.
    summary = summarise(_demo_like_stages(), {"final_tier1": 1, "final_tier2": 2})
    assert summary.all_level2_device_seconds < 4.0 + 0.6 * 4 / 2


def test_no_level2_sample_or_no_final_means_no_baseline() -> None:
    level1_only = [StageCost("generate", 1, 2, 200, 0.2), StageCost("generate", 2)]
    assert summarise(level1_only, {"final_tier1": 2}).saving is None
    assert summarise(_demo_like_stages(), {}).baseline is None


def test_a_measured_baseline_wins_over_the_estimate() -> None:
    measured = ledger.Baseline(10.0, 1e7, "all-Level-2 arm of strata bench tiers", measured=True)
    summary = summarise(_demo_like_stages(), {"final_tier1": 1, "final_tier2": 2}, measured)
    assert summary.baseline is measured
    assert summary.saving == pytest.approx(1 - 2.85 / 10.0)


def test_split_by_tokens_shares_a_batch_in_proportion() -> None:
    assert ledger.split_by_tokens(1.0, [10, 30]) == pytest.approx([0.25, 0.75])
    assert ledger.split_by_tokens(1.0, [0, 0]) == pytest.approx([0.5, 0.5])
    assert ledger.split_by_tokens(1.0, []) == []


def test_unknown_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown ledger stage"):
        Charge("decoder", 1)


def test_book_cuts_per_stage_per_tier_and_per_prompt(redis_client: redis.Redis) -> None:
    prompt, other = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2  # fresh prompts: the Redis is shared
    start = ledger.read_stages(redis_client)
    ledger.book(redis_client, prompt, "req-1", [Charge("probe", 0, 12, 0.01, 1.2e4),
                                                ledger.charge_generation(1, 1000, 12, 40, 0.5)], ttl_s=60)
    ledger.book(redis_client, prompt, "req-2", [ledger.charge_generation(1, 1000, 12, 20, 0.25)], ttl_s=60)
    ledger.book(redis_client, other, "req-3", [Charge("rm_strong", 2, 50, 0.3, 5e5)], ttl_s=60)
    middle = ledger.read_stages(redis_client)
    stages = {(s.stage, s.tier): s for s in ledger.subtract(middle, start)}
    assert stages[("generate", 1)].items == 2 and stages[("generate", 1)].tokens == 60
    assert stages[("generate", 1)].param_tokens == pytest.approx(1000 * (52 + 32))
    assert stages[("rm_strong", 2)].device_seconds == pytest.approx(0.3)
    per_request = ledger.read_prompt(redis_client, prompt)
    assert set(per_request) == {"req-1", "req-2"}
    in_pipeline_order = [("probe", 0, 1), ("generate", 1, 1)]
    assert [(s.stage, s.tier, s.items) for s in per_request["req-1"]] == in_pipeline_order
    assert 0 < redis_client.ttl(f"strata:ledger:request:{prompt}:req-1") <= 60
    ledger.book(redis_client, prompt, "req-4", [ledger.charge_generation(2, 5000, 12, 30, 2.0)], ttl_s=60)
    arm = {(s.stage, s.tier): s for s in ledger.subtract(ledger.read_stages(redis_client), middle)}
    assert arm[("generate", 2)].device_seconds == pytest.approx(2.0)
    assert arm[("generate", 1)].items == 0
