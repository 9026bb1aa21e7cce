"""How the training loop builds its rounds and decides that a request is done."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from strata import ledger
from strata.v1 import common_pb2, events_pb2
from strata_tools.task.suite import PromptRecord
from strata_tools.train import Request, RoundStats, TrainOptions, TrainSummary, checkpoint_due, request_done
from strata_tools.train_stream import prompt_rounds, round_prompts
from strata_tools.train_summary import (
    Booked,
    Checkpoint,
    Evaluation,
    checkpoint_lines,
    reward_oscillation,
    write_report,
)

L1, L2 = common_pb2.TIER_LEVEL_1, common_pb2.TIER_LEVEL_2


def ev(tier: int, final: bool, escalated: bool = False, scorer: int = common_pb2.SCORER_LIGHT):
    return events_pb2.RewardScored(tier=tier, final=final, escalated=escalated, scorer=scorer)


def test_skip_is_done_with_its_reused_reward() -> None:
    assert request_done([ev(L1, True, scorer=common_pb2.SCORER_REUSED)], 4)


def test_level1_samples_all_final() -> None:
    assert not request_done([ev(L1, True)], 2)
    assert request_done([ev(L1, True), ev(L1, True)], 2)


def test_escalated_request_waits_for_its_level2_final() -> None:
    both_low = [ev(L1, False, True), ev(L1, False, True)]
    assert not request_done(both_low, 2)
    assert request_done([*both_low, ev(L2, True)], 2)  # one escalation per request
    assert not request_done([ev(L1, True), ev(L1, False, True)], 2)


def test_level2_route_needs_every_sample() -> None:
    assert not request_done([ev(L2, True)], 2)
    assert request_done([ev(L2, True), ev(L2, True)], 2)


def _records(families: int = 20, members: int = 3) -> list[PromptRecord]:
    return [PromptRecord(f"f{f}#{m}", f"prompt {f}.{m}", "t", "s", "i", False, f"fam/{f}", "train")
            for f in range(families) for m in range(members)]


def test_round_prompts_mix_repeats_paraphrases_and_new_prompts() -> None:
    records = _records()
    rng = random.Random(0)
    first, fresh = round_prompts(records, 0, 20, [], rng, repeat_share=0.25, paraphrase_share=0.25)
    assert fresh == 20 and sorted(r.id for r in first) == sorted(r.id for r in records[:20])  # nothing sent yet
    batch, fresh = round_prompts(records, 20, 20, first, rng, repeat_share=0.25, paraphrase_share=0.25)
    assert len(batch) == 20 and fresh == 10
    sent_texts = {r.text for r in first}
    sent_families = {r.family for r in first}
    repeats = [r for r in batch if r.text in sent_texts]
    paraphrases = [r for r in batch if r.text not in sent_texts and r.family in sent_families]
    new = [r for r in batch if r in records[20:30]]
    assert len(repeats) >= 5 and len(paraphrases) >= 1 and len(new) == 10
    with pytest.raises(ValueError, match="sum to at most 1"):
        round_prompts(records, 0, 4, first, rng, repeat_share=0.8, paraphrase_share=0.4)


def test_round_prompts_without_a_mix_walk_the_records() -> None:
    records = _records()
    batch, fresh = round_prompts(records, 55, 10, records[:5], random.Random(1))
    assert fresh == 10 and sorted(r.id for r in batch) == sorted(r.id for r in records[55:] + records[:5])


def test_the_hacking_gap_is_the_rm_change_minus_the_oracle_change_per_prompt() -> None:
    before = Evaluation(0, 2.0, 2.0, rewards=[2.0, 2.0, 2.0], oracle_scores=[2.0, 2.0, 2.0])
    # The RM's reward rises by 1.0, 0.5, 0.0 while the oracle moves by 0.0, 0.5, -0.5.
    after = Evaluation(3, 2.5, 2.0, rewards=[3.0, 2.5, 2.0], oracle_scores=[2.0, 2.5, 1.5])
    summary = TrainSummary(0, 3, before=before, after=after)
    gap = summary.hacking_gap
    assert gap is not None and gap.n == 3
    assert gap.mean == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    assert gap.stderr == pytest.approx(0.5 / 3**0.5)  # the per-prompt gaps 1.0, 0.0, 0.5 have sd 0.5
    assert TrainSummary(0, 0, before=before).hacking_gap is None  # nothing to compare yet


def _round(index: int, mean_reward: float | None) -> RoundStats:
    return RoundStats(index, index, 8, {}, 8, 8, mean_reward, None, 1.0)


def test_reward_oscillation_is_the_spread_of_round_to_round_changes() -> None:
    # A steady climb does not oscillate however steep it is; a zig-zag does, by the size of its steps.
    assert reward_oscillation([1.0, 1.5, 2.0, 2.5]).step_std == pytest.approx(0.0)  # type: ignore[union-attr]
    zigzag = reward_oscillation([2.0, 3.0, 2.0, 3.0, 2.0])
    assert zigzag is not None and zigzag.rounds == 5
    assert zigzag.step_std == pytest.approx(statistics.stdev([1.0, -1.0, 1.0, -1.0]))
    assert zigzag.largest_step == pytest.approx(1.0)
    assert reward_oscillation([2.0, 3.0]) is None  # one change has no spread


def test_the_summary_oscillation_skips_rounds_without_level1_rewards() -> None:
    rounds = [_round(0, 2.0), _round(1, None), _round(2, 2.4), _round(3, 1.9)]
    oscillation = TrainSummary(0, 3, rounds=rounds).reward_oscillation
    assert oscillation is not None and oscillation.rounds == 3
    assert oscillation.largest_step == pytest.approx(-0.5)


def test_the_prompt_stream_is_fixed_by_the_options() -> None:
    options = TrainOptions(prompts_per_round=12, repeat_share=0.25, paraphrase_share=0.25, seed=3)
    stream, again = prompt_rounds(options), prompt_rounds(options)
    first, second = next(stream), next(stream)
    assert [r.id for r in next(again)] == [r.id for r in first]
    assert [r.id for r in next(again)] == [r.id for r in second]
    assert not any(r.risk for r in first + second)  # risk topics are not training prompts
    assert len({r.id for r in first}) == 12  # nothing sent yet to repeat: all new
    assert {r.id for r in first} & {r.id for r in second}  # the second round repeats some of the first


def test_a_checkpoint_is_due_every_n_updates_before_the_end() -> None:
    assert not checkpoint_due(5, 0, 0, 8)  # none asked for
    assert not checkpoint_due(1, 0, 2, 8) and checkpoint_due(2, 0, 2, 8) and checkpoint_due(3, 0, 2, 8)
    assert not checkpoint_due(3, 2, 2, 8) and checkpoint_due(5, 3, 2, 8)  # counted from the last one taken
    assert not checkpoint_due(8, 4, 2, 8) and not checkpoint_due(9, 4, 2, 8)  # the end has its own evaluation


def test_booked_cost_is_summed_over_stages_and_subtracts() -> None:
    stages = [ledger.StageCost("generate", 1, device_seconds=2.0, param_tokens=1e6),
              ledger.StageCost("human_review", 2, human_seconds=60.0),
              ledger.StageCost("rm_light", 1, device_seconds=0.5, param_tokens=2e5)]
    booked = Booked.of(stages)
    assert booked == Booked(1.2e6, 2.5, 60.0)
    assert booked - Booked(2e5, 0.5, 0.0) == Booked(1e6, 2.0, 60.0)


def test_the_report_draws_the_held_out_change_against_the_booked_cost(tmp_path) -> None:
    def evaluation(version: int, shift: float) -> Evaluation:
        rewards = [2.0 + shift + 0.1 * i for i in range(4)]
        oracle = [2.0 + shift / 2 - 0.1 * i for i in range(4)]
        return Evaluation(version, statistics.fmean(rewards), statistics.fmean(oracle), rewards, oracle)

    checkpoints = [Checkpoint(u, Booked(1e6 * u, 2.0 * u, 0.0), evaluation(u, 0.1 * u)) for u in (0, 2, 4)]
    summary = TrainSummary(0, 4, rounds=[_round(0, 2.0), _round(1, 2.2)], before=checkpoints[0].evaluation,
                           after=checkpoints[-1].evaluation, checkpoints=checkpoints,
                           requests=[Request(object(), "r-1", "p-1", "DECISION_LEVEL_1")])
    png = write_report(summary, tmp_path)
    assert png.stat().st_size > 0
    payload = json.loads(png.with_suffix(".json").read_text())
    assert "requests" not in payload and [c["updates"] for c in payload["checkpoints"]] == [0, 2, 4]
    last = payload["checkpoints"][-1]
    assert last["booked"]["param_tokens"] == 4e6
    assert last["reward_change"]["mean"] == pytest.approx(0.4) and last["oracle_change"]["mean"] == pytest.approx(0.2)
    assert payload["checkpoints"][0]["oracle_change"]["mean"] == 0.0
    lines = checkpoint_lines(summary)
    assert len(lines) == 2 + 3 and lines[-1].split()[:2] == ["4", "4e+06"]


def test_the_driver_sends_no_more_prompts_than_the_learner_still_needs() -> None:
    from strata_tools.train import TrainOptions
    from strata_tools.train_stream import round_size, samples_still_needed

    bounded = TrainOptions(updates=3, prompts_per_round=16, n_samples=4, samples_per_update=32)
    # 3 batches of 32 = 96 samples; a full round is 16 prompts = 64 samples.
    assert samples_still_needed(bounded, 0, 0) == 96 and round_size(bounded, 96) == 16
    assert samples_still_needed(bounded, 0, 70) == 26 and round_size(bounded, 26) == 7  # ceil(26 / 4)
    assert samples_still_needed(bounded, 2, 6) == 26  # two updates made: one batch left, 6 samples held
    assert samples_still_needed(bounded, 0, 96) == 0 and round_size(bounded, 0) == 0
    assert samples_still_needed(bounded, 1, 80) == 0  # held past the need: nothing more
    assert samples_still_needed(bounded, 3, 0) == 0
    # No batch size given: no bound, every round is full (the behaviour before the bound).
    unbounded = TrainOptions(updates=3, prompts_per_round=16, n_samples=4)
    assert samples_still_needed(unbounded, 0, 500) is None and round_size(unbounded, None) == 16


def test_the_learner_has_seen_every_event_it_counted_whatever_it_made_of_it() -> None:
    from strata.v1 import learner_pb2
    from strata_tools.train import learner_seen

    status = learner_pb2.LearnerStatus(metrics={"samples/accepted": 30.0, "samples/skipped_tier": 4.0,
                                                "samples/skipped_reused": 2.0, "samples/pending": 12.0,
                                                "samples/unversioned": 32.0, "samples/off_policy_fraction": 0.9,
                                                "losses/policy_loss": 0.3})
    # pending and unversioned are states, not events read; fractions and losses are not counts.
    assert learner_seen(status) == 36


def test_a_batch_in_training_is_held_not_missing() -> None:
    from strata.v1 import learner_pb2
    from strata_tools.train import learner_holds
    from strata_tools.train_stream import samples_still_needed

    # Mid-update: the batch left the pending list, and no version holds it yet.
    options = TrainOptions(updates=8, prompts_per_round=16, n_samples=2, samples_per_update=32)
    status = learner_pb2.LearnerStatus(policy_version=7, metrics={"samples/pending": 0.0,
                                                                   "samples/unversioned": 32.0})
    assert learner_holds(status) == 32
    assert samples_still_needed(options, 7, learner_holds(status)) == 0  # pending alone would ask for 32 more


def test_the_driver_sends_no_more_than_the_learner_can_take_before_it_goes_stale() -> None:
    from strata_tools.train_stream import samples_to_send

    options = TrainOptions(updates=8, prompts_per_round=16, n_samples=2, samples_per_update=32)
    assert options.max_batches_ahead == 2
    # Nothing held: two batches' worth, though the learner needs eight.
    assert samples_to_send(options, 0, 0) == 64
    # A slow learner still holds 48 (one batch and a half): 16 more keep it within two batches.
    assert samples_to_send(options, 3, 48) == 16
    # It holds two batches: nothing until it trains on one.
    assert samples_to_send(options, 3, 64) == 0
    # Near the end the need is smaller than the room: only the need.
    assert samples_to_send(options, 7, 16) == 16 and samples_to_send(options, 8, 0) == 0
    assert samples_to_send(TrainOptions(updates=3), 0, 500) is None  # no batch size: no bound
