"""The checks' pure parts on hand-computed cases: measurements, decision rules, rendering."""

from __future__ import annotations

import math

import pytest
import torch
from diagutil import TinyModels

from strata_tools.diagnose import memory, repetition, rm_noise, rm_overfit, runner, shift
from strata_tools.diagnose.items import load_pairs, suite_pairs
from strata_tools.diagnose.verdict import CheckResult, Verdict, error_result
from strata_tools.rm.refresh import ranks


def test_repeat_spread_is_the_mean_and_max_of_per_item_population_stds() -> None:
    assert rm_noise.repeat_spread([[1.0, 2.0], [3.0, 2.0]]) == (0.5, 1.0)
    with pytest.raises(ValueError):
        rm_noise.repeat_spread([[1.0, 2.0]])


@pytest.mark.parametrize(("version", "members"), [("light-abc", 1), ("light-a+light-b+light-c", 3), ("", 1)])
def test_ensemble_size_comes_from_the_served_version(version: str, members: int) -> None:
    assert rm_noise.members_of(version) == members


def test_rm_noise_alarms_strictly_above_the_bound() -> None:
    config = rm_noise.RmNoiseConfig(max_spread=0.1)

    def measured(spread: float) -> rm_noise.NoiseMeasurement:
        return rm_noise.NoiseMeasurement(spread, spread, 10, 5, "light-x", 1, 0.0)

    assert rm_noise.evaluate(measured(0.1), config).verdict is Verdict.PASS
    assert rm_noise.evaluate(measured(0.1001), config).verdict is Verdict.ALARM


def test_ranks_share_ties_and_spearman_matches_a_hand_computation() -> None:
    assert ranks([1, 2, 2, 3]) == [1.0, 2.5, 2.5, 4.0]  # the recipe's, which the check ranks with
    assert rm_overfit.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))
    assert rm_overfit.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert rm_overfit.spearman([1, 2, 3], [2, 2, 2]) == 0.0


def test_rm_overfit_alarms_strictly_under_the_bound() -> None:
    config = rm_overfit.RmOverfitConfig(min_spearman=0.7)
    assert rm_overfit.evaluate(rm_overfit.OverfitMeasurement(0.7, 10, "oracle", "v"), config).verdict is Verdict.PASS
    assert rm_overfit.evaluate(rm_overfit.OverfitMeasurement(0.69, 10, "oracle", "v"), config).verdict is Verdict.ALARM


def test_slope_is_growth_per_round_and_a_one_off_jump_barely_moves_it() -> None:
    assert memory.slope([0, 1, 2, 3]) == pytest.approx(1.0)
    assert memory.slope([0, 64, 64, 64, 64]) == pytest.approx(12.8)
    config = memory.MemoryConfig(max_growth_per_round_bytes=16 * memory.MIB)
    jump = memory.MemoryMeasurement([x * memory.MIB for x in (100, 164, 164, 164, 164)], "process RSS", 8)
    leak = memory.MemoryMeasurement([x * memory.MIB for x in (100, 120, 140, 160, 180)], "process RSS", 8)
    assert memory.evaluate(jump, config).verdict is Verdict.PASS
    assert memory.evaluate(leak, config).verdict is Verdict.ALARM


def test_memory_reading_prefers_cuda_over_rss() -> None:
    rss = "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1.5e+09\n"
    cuda = ('# TYPE strata_device_memory_allocated_bytes gauge\n'
            'strata_device_memory_allocated_bytes{device="cuda:0"} 100.0\n'
            'strata_device_memory_allocated_bytes{device="cuda:1"} 20.0\n')
    assert memory.reading_from_metrics(rss) == memory.MemoryReading(1.5e9, "process RSS")
    assert memory.reading_from_metrics(rss + cuda) == memory.MemoryReading(120.0, "CUDA allocated")
    with pytest.raises(ValueError):
        memory.reading_from_metrics("# nothing here\n")


def test_duplicate_share_and_the_r16_sampling_bounds() -> None:
    assert repetition.duplicate_share(["a", "a", "b", "c"]) == 0.25
    assert repetition.duplicate_share(["a"] * 5) == 0.8
    config = repetition.RepetitionConfig()
    assert repetition.sampling_problems(0.31, 0.94, config) == []
    assert repetition.sampling_problems(0.3, 0.95, config) == ["temperature 0.3 <= 0.3", "top_p 0.95 >= 0.95"]


def test_shift_alarms_strictly_under_the_bound_and_reports_per_token() -> None:
    config = shift.ShiftConfig(min_mean_logprob=-150.0)
    at_bound = shift.ShiftMeasurement([-100.0, -200.0], [10, 40], [3, 4], "v4")
    assert at_bound.per_token == pytest.approx(-6.0)
    assert shift.evaluate(at_bound, config).verdict is Verdict.PASS
    below = shift.ShiftMeasurement([-150.5], [50], [4], "v4")
    assert shift.evaluate(below, config).verdict is Verdict.ALARM


def test_batched_sequence_logprobs_match_one_at_a_time_sums(tiny_models: TinyModels) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_models.lm).eval()
    rollouts = [shift.Rollout((5, 6, 7), (8, 9), 0), shift.Rollout((5,), (10, 11, 12, 13), 0)]
    batched = shift.sequence_logprobs(model, rollouts, pad_token_id=1, batch_size=2)
    for rollout, value in zip(rollouts, batched, strict=True):
        ids = torch.tensor([[*rollout.prompt_ids, *rollout.response_ids]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
        expected = sum(float(logp[i - 1, ids[0, i]]) for i in range(len(rollout.prompt_ids), ids.shape[1]))
        assert value == pytest.approx(expected, abs=1e-4)


def test_suite_pairs_are_fresh_prompts_with_oracle_scores_of_mixed_quality() -> None:
    from strata_tools.task.suite import load_suite

    pairs = suite_pairs(50)
    fresh = {r.text for r in load_suite("fresh")}
    assert len(pairs) == 50 and all(p.prompt in fresh for p in pairs)
    scores = [p.reference for p in pairs]
    assert all(s is not None and 0 <= s <= 5 for s in scores)
    assert max(scores) - min(scores) > 2  # type: ignore[operator]


def test_pairs_file_errors_name_the_line(tmp_path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "p", "response": "r", "score": 4}\n\n{"prompt": "q", "response": "s"}\n')
    assert [(p.prompt, p.reference) for p in load_pairs(good)] == [("p", 4.0), ("q", None)]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "response": "r"}\n{"prompt": "p"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        load_pairs(bad)


def _result(check: str, verdict: Verdict) -> CheckResult:
    return CheckResult(check, verdict, 1.0, 0.5, "x > 0.5 alarms", f"{check} finding", f"cure of {check}")


def test_exit_code_and_table() -> None:
    passing = [_result("rm-noise", Verdict.PASS), _result("memory", Verdict.PASS)]
    assert runner.exit_code(passing) == 0
    with_error = [*passing, error_result("shift", "cure of shift", "learner unreachable")]
    assert runner.exit_code(with_error) == 2
    with_alarm = [*with_error, _result("repetition", Verdict.ALARM)]
    assert runner.exit_code(with_alarm) == 1
    table = runner.format_table(with_alarm)
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["check", "verdict", "value", "rule"]
    assert any(line.startswith("shift") and "ERROR" in line and "learner unreachable" in line for line in lines)
    assert "cure for repetition: cure of repetition" in table
    assert "cure for rm-noise" not in table
