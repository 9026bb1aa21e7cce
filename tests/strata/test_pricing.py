"""``--price-as`` (issue 62): the measured work repriced at named model sizes, the ledger's sizes per stage."""

from __future__ import annotations

import uuid

import pytest

from strata import ledger
from strata.ledger import Baseline, StageCost
from strata_tools.pricing import PRESETS, parse_price_as, reprice, reprice_baseline

MEASURED = [
    StageCost("encoder", 0, items=10, tokens=100, param_tokens=2.2e7 * 100, params=2.2e7),
    StageCost("generate", 1, items=10, tokens=200, param_tokens=5e6 * 300, params=5e6),  # prompt + response read
    StageCost("rm_light", 1, items=10, tokens=300, param_tokens=2e7 * 300, params=2e7),
    StageCost("generate", 2, items=4, tokens=80, param_tokens=3e7 * 120, params=3e7),
    StageCost("rm_strong", 2, items=4, tokens=120, param_tokens=6e7 * 120, params=6e7),
    StageCost("human_review", 2, items=4, human_seconds=240.0),
]


def test_presets_and_pairs_parse_and_bad_input_names_what_to_fix() -> None:
    assert parse_price_as("article").sizes == PRESETS["article"]
    price = parse_price_as("level1=1.5e9, level2=8e9")
    assert price.sizes == {"level1": 1.5e9, "level2": 8e9} and "level1 1.5e+09" in price.describe()
    for bad, named in (("level3=1e9", "level3"), ("level1=big", "level1"), ("level1=-1", "level1"),
                       ("level1", "level1"), ("", "preset")):
        with pytest.raises(ValueError, match=named):
            parse_price_as(bad)


def test_each_stage_scales_by_its_new_size_over_the_one_it_ran_at() -> None:
    priced, unpriced = reprice(MEASURED, parse_price_as("level1=1e9,level2=8e9,rm_light=1e9,rm_strong=8e9"))
    by = {(s.stage, s.tier): s for s in priced}
    assert by[("generate", 1)].param_tokens == pytest.approx(1e9 * 300)  # the prompt tokens count too
    assert by[("rm_strong", 2)].param_tokens == pytest.approx(8e9 * 120)
    assert by[("encoder", 0)] == MEASURED[0]  # a role not named keeps its measured cost
    assert by[("human_review", 2)] == MEASURED[5]
    assert unpriced == [] and by[("generate", 1)].tokens == 200 and by[("generate", 1)].params == 1e9


def test_a_stage_booked_without_its_size_is_left_and_named() -> None:
    old = [StageCost("generate", 1, items=1, tokens=10, param_tokens=5e7)]
    priced, unpriced = reprice(old, parse_price_as("level1=1e9"))
    assert priced == old and unpriced == ["generate/1"]


def test_a_measured_baseline_is_repriced_from_its_arms_stages() -> None:
    level2 = [s for s in MEASURED if s.tier == 2 and s.stage != "human_review"]
    baseline = Baseline(0.0, 1e15, "measured", measured=True)
    priced = reprice_baseline(baseline, level2, parse_price_as("level2=8e9,rm_strong=8e9"))
    assert priced.param_tokens == pytest.approx(8e9 * 120 + 8e9 * 120) and "repriced" in priced.label
    assert priced.measured


def test_the_saving_moves_with_the_cost_structure() -> None:
    """Tiny models: the encoder and the RMs dominate and escalation looks dear; at deployment sizes
    generation dominates and the same decisions read differently."""
    counts = {"final_tier1": 6, "final_tier2": 4, "escalations": 4}
    measured = ledger.summarise(MEASURED, counts)
    projected = ledger.summarise(reprice(MEASURED, parse_price_as("deployment"))[0], counts)
    assert measured.param_token_saving is not None and projected.param_token_saving is not None
    assert projected.param_token_saving != pytest.approx(measured.param_token_saving)


def test_the_ledger_keeps_each_stages_size(redis_client) -> None:
    prompt = f"p-{uuid.uuid4().hex}"
    ledger.book(redis_client, prompt, "r1", [ledger.charge_generation(1, 5_000_000, 20, 10, 0.1)], ttl_s=60)
    after = {(s.stage, s.tier): s for s in ledger.read_stages(redis_client)}
    assert after[("generate", 1)].params == 5e6
    [request] = ledger.read_request(redis_client, prompt, "r1")
    assert request.params == 5e6 and request.param_tokens == pytest.approx(5e6 * 30)


def test_strata_report_prints_the_projection_beside_the_ledger(infra, redis_client, monkeypatch, capsys) -> None:
    from strata_tools.cli.main import main

    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    ledger.book(redis_client, f"p-{uuid.uuid4().hex}", "r", [ledger.charge_generation(1, 5_000_000, 20, 10, 0.1)],
                ttl_s=60)
    assert main(["report", "--price-as", "deployment"]) == 0
    out = capsys.readouterr().out
    assert "projection at deployment sizes" in out and "params x tokens: " in out
    assert out.index("total:") < out.index("projection at")  # the measured ledger comes first


def test_strata_report_refuses_a_bad_price_before_reading_anything(capsys) -> None:
    from strata_tools.cli.main import main

    assert main(["report", "--price-as", "level9=1e9"]) != 0
    assert "--price-as: 'level9=1e9' is not role=size" in capsys.readouterr().err
