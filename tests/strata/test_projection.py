"""Seconds per update at a deployment's sizes (issue 63, item 5): the measured work priced on paper."""

from __future__ import annotations

import argparse
from dataclasses import asdict

import pytest

from strata.errors import CliError
from strata.ledger import StageCost
from strata_tools.bench import peers
from strata_tools.bench.peers_trl import ArmResult
from strata_tools.pricing import parse_price_as
from strata_tools.projection import (
    GPUS,
    NEGLIGIBLE_SHARE,
    Assumptions,
    BatchScale,
    Gpu,
    UpdateWork,
    deployment_batch,
    negligible_from,
    project,
    projection_lines,
    scaled,
    trained_samples,
    trained_tokens,
)

# Round numbers: 1e12 FLOP/s at full use; a 1e9 model decodes 100 tokens/s.
GPU = Gpu("test", 1e12, 100.0, 1e9, "made up")
FULL = Assumptions(GPU, forward_mfu=1.0, train_mfu=1.0, update_epochs=1, sync_bytes_per_s=1e9)
# Two updates' ledger: per update Level-1 writes 100 tokens after 50 of prompt; its light RM reads 150;
# Level-2 writes 20 after 10; the strong RM reads 30; the encoder reads 40.
STAGES = [
    StageCost("encoder", 0, items=8, tokens=80, param_tokens=2e7 * 80, params=2e7),
    StageCost("generate", 1, items=8, tokens=200, param_tokens=5e6 * 300, params=5e6),
    StageCost("rm_light", 1, items=8, tokens=300, param_tokens=2e7 * 300, params=2e7),
    StageCost("generate", 2, items=2, tokens=40, param_tokens=3e7 * 60, params=3e7),
    StageCost("rm_strong", 2, items=2, tokens=60, param_tokens=6e7 * 60, params=6e7),
    StageCost("human_review", 2, items=2, human_seconds=120.0),
]
PLUMBING = {"driver": 0.5, "scheduler+probe": 0.25, "batching": 0.25, "training": 9.0, "generation": 3.0}
SIZES = parse_price_as("encoder=2e7,level1=1e9,level2=4e9,rm_light=1e9,rm_strong=4e9")


def work(trained: set[int] | None = None, plumbing: dict[str, float] | None = None) -> UpdateWork:
    return UpdateWork(STAGES, 2, frozenset({1, 2} if trained is None else trained),
                      PLUMBING if plumbing is None else plumbing)


def test_each_device_is_priced_from_the_tokens_it_handled_per_update() -> None:
    p = project(work(), SIZES, FULL)
    # Level-1: 100 output tokens at 100 tokens/s, plus 2 x 1e9 x 50 prompt tokens of prefill.
    assert p.device_seconds["level1"] == pytest.approx(1.0 + 2 * 1e9 * 50 / 1e12)
    # Level-2 (4e9) decodes at a quarter of the rate: 20 tokens at 25 tokens/s, plus 10 prompt tokens.
    assert p.device_seconds["level2"] == pytest.approx(0.8 + 2 * 4e9 * 10 / 1e12)
    # One reward device serves both RMs: 2 x params x tokens read, added up.
    assert p.device_seconds["rm"] == pytest.approx((2 * 1e9 * 150 + 2 * 4e9 * 30) / 1e12)
    assert p.device_seconds["encoder"] == pytest.approx(2 * 2e7 * 40 / 1e12)
    # The learner: (6 x 1 epoch + 4) x the policy's size x the trained tiers' tokens (150 + 30), and
    # Level-2's forward over its 30 (the behaviour log-probs of its rows).
    assert p.device_seconds["learner"] == pytest.approx((10 * 1e9 * 180 + 2 * 4e9 * 30) / 1e12)
    assert p.sync == pytest.approx(2 * 1e9 / 1e9)  # bf16 weights through 1 GB/s
    assert p.plumbing == pytest.approx(1.0)  # driver, scheduler+probe and batching; not training or generation
    assert "human_review" not in p.device_seconds and p.devices == 5  # no probe booked


def test_overlap_takes_the_slower_side_and_sequential_their_sum() -> None:
    p = project(work(), SIZES, FULL)
    rollout = max(p.device_seconds[d] for d in ("encoder", "level1", "level2", "rm")) + 0.75  # driver, routing
    learn = 0.25 + p.device_seconds["learner"] + p.sync  # the learner fills its batch, trains, syncs
    assert p.rollout == pytest.approx(rollout) and p.learn == pytest.approx(learn)
    assert p.sequential == pytest.approx(rollout + learn)
    assert p.overlapped == pytest.approx(max(rollout, learn))
    assert 1.0 <= p.sequential / p.overlapped <= 2.0
    assert learn > rollout and p.bound == "the learner"
    # A learner with nothing to train: Level-1's generation sets the pace.
    assert project(work(trained=set()), SIZES, FULL).bound == "level1"
    assert 0 < p.busy_share < 1
    # The plumbing costs the overlapped update only what the other side does not hide.
    assert p.plumbing_share() == pytest.approx((p.overlapped - max(rollout - 0.75, learn - 0.25)) / p.overlapped)
    assert p.plumbing_share(overlapped=False) == pytest.approx(1.0 / p.sequential)


def test_a_larger_batch_scales_the_work_by_tokens_and_the_scheduler_by_samples() -> None:
    base = UpdateWork(STAGES, 2, frozenset({1, 2}), PLUMBING, {"scheduler": 0.5})
    one, many = project(base, SIZES, FULL), project(base, SIZES, FULL, BatchScale(samples=5, length=2))
    for device, seconds in one.device_seconds.items():
        factor = 5 if device == "scheduler" else 10  # the scheduler decides per prompt, whatever its length
        assert many.device_seconds[device] == pytest.approx(factor * seconds), device
    assert one.device_seconds["scheduler"] == 0.5 and many.plumbing == one.plumbing and many.sync == one.sync
    assert many.plumbing_share() < one.plumbing_share()
    # Per update the learner trains on 5 samples (4 of Level-1, 1 of Level-2) of 180 tokens in all: the
    # deployment's 1024 samples of 2048 tokens are 204.8 times as many, each 56.9 times as long.
    assert trained_tokens(base) == pytest.approx(180) and trained_samples(base) == pytest.approx(5)
    deployment = deployment_batch(base)
    assert deployment == BatchScale(1024 / 5, 2048 / 36)
    assert deployment_batch(UpdateWork(STAGES, 2, frozenset(), PLUMBING)) is None
    with pytest.raises(ValueError, match="factors"):
        BatchScale(samples=0)


def test_untrained_tiers_cost_the_learner_nothing() -> None:
    only_level1 = project(work(trained={1}), SIZES, FULL)
    assert only_level1.device_seconds["learner"] == pytest.approx(10 * 1e9 * 150 / 1e12)
    nothing = project(work(trained=set()), SIZES, FULL)
    assert nothing.device_seconds["learner"] == 0.0 and nothing.sync == 0.0


def test_the_plumbing_share_falls_as_the_models_grow_and_the_encoder_stays() -> None:
    bigger = scaled(SIZES, 8)
    assert bigger.sizes["encoder"] == 2e7 and bigger.sizes["level1"] == 8e9
    shares = [project(work(), scaled(SIZES, f), FULL).plumbing_share() for f in (1 / 8, 1, 8)]
    assert shares == sorted(shares, reverse=True)
    factor = negligible_from(work(), SIZES, FULL)
    assert factor is not None
    assert project(work(), scaled(SIZES, factor), FULL).plumbing_share() < NEGLIGIBLE_SHARE
    assert project(work(), scaled(SIZES, factor / 2), FULL).plumbing_share() >= NEGLIGIBLE_SHARE
    # Plumbing no size can outgrow within the factors tried.
    assert negligible_from(work(plumbing={"batching": 1e6}), SIZES, FULL) is None
    # Rollout plumbing that the learner's longer side hides costs nothing.
    hidden = project(work(plumbing={"driver": 0.1}), scaled(SIZES, 8), FULL)
    assert hidden.learn > hidden.rollout and hidden.plumbing_share() == 0.0


def test_a_role_not_sized_keeps_what_it_ran_at_and_an_unknown_size_is_named() -> None:
    measured = project(work(), parse_price_as("level1=1e9"), FULL)
    assert measured.device_seconds["rm"] == pytest.approx((2 * 2e7 * 150 + 2 * 6e7 * 30) / 1e12)
    unsized = [StageCost("rm_light", 1, items=8, tokens=300, param_tokens=6e9)]
    with pytest.raises(ValueError, match="rm_light/1"):
        project(UpdateWork(unsized, 1, frozenset({1}), {}), parse_price_as("level1=1e9"), FULL)
    with pytest.raises(ValueError, match="updates"):
        UpdateWork(STAGES, 0, frozenset({1}), {})
    with pytest.raises(ValueError, match="train_mfu"):
        Assumptions(GPU, train_mfu=0.0)


def test_peers_projects_each_strata_arm_from_its_saved_result(tmp_path) -> None:
    arm = ArmResult("Strata tiered", update_seconds=[2.0, 2.0], updates_done=2, critical_path=PLUMBING,
                    ledger_stages=[asdict(s) for s in STAGES], trained_tiers=[1, 2],
                    cpu_seconds={"scheduler": 0.8, "learner": 20.0, "driver": 1.0})
    arm.write(tmp_path / "arm.json")
    trl = ArmResult("TRL", update_seconds=[1.0, 1.0])  # no ledger: not projected
    lines = peers.projected({"tiered": ArmResult.read(tmp_path / "arm.json"), "trl": trl},
                            parse_price_as("deployment"), Assumptions(GPUS["h100"]))
    assert lines[0].startswith("projection at deployment sizes") and "H100" in lines[0]
    # The scheduler's CPU per update is a device of its own; the learner's and the driver's are not.
    with_control = UpdateWork(STAGES, 2, frozenset({1, 2}), PLUMBING, {"scheduler": 0.4})
    assert lines[1:] == projection_lines("tiered", with_control, parse_price_as("deployment"),
                                         Assumptions(GPUS["h100"]))
    assert lines[1] == "  tiered: 5 samples, 180 tokens trained per update"
    assert "the bench's batch (x1 tokens)" in lines[2] and "1024 samples of 2048 tokens (x1.17e+04 tokens)" in lines[4]
    assert "bound by" in lines[2] and not any("trl" in line for line in lines)


def test_peers_refuses_a_bad_projection_before_anything_runs() -> None:
    parser = argparse.ArgumentParser()
    peers.add_arguments(parser)
    args = parser.parse_args(["--arms", "tiered", "--project-as", "level9=1e9"])
    with pytest.raises(CliError, match="--project-as"):
        peers.check_arguments(args)
    with pytest.raises(SystemExit):
        parser.parse_args(["--project-gpu", "tpu"])
