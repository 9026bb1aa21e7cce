import math

import pytest
import torch

from svc_reward.decide import decide, sampled_for_annotation
from svc_reward.scoring import aggregate, tempered_reward


def test_expected_score_over_bins() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0], [10.0, -10.0, -10.0]])  # bins 0, 2.5, 5
    rewards = tempered_reward(logits)
    assert rewards[0].item() == pytest.approx(2.5)
    assert rewards[1].item() == pytest.approx(0.0, abs=1e-6)


def test_low_temperature_moves_the_reward_toward_the_mode() -> None:
    # Mode at 5 with a fat tail at 0: T < 1 shrinks the tail's pull.
    logits = torch.log(torch.tensor([[0.3, 0.0001, 0.6999]]))
    plain = tempered_reward(logits, 1.0).item()
    sharp = tempered_reward(logits, 0.3).item()
    assert plain == pytest.approx(0.6999 * 5 + 0.0001 * 2.5, rel=1e-4)
    assert plain < sharp < 5.0


def test_regression_head_passes_through_clamped() -> None:
    assert tempered_reward(torch.tensor([[3.3], [7.0]]), 0.3).tolist() == pytest.approx([3.3, 5.0])


def test_temperature_must_be_positive() -> None:
    with pytest.raises(ValueError, match="temperature"):
        tempered_reward(torch.zeros(1, 3), 0.0)


def test_ensemble_mean_median_and_spread() -> None:
    members = [torch.tensor([1.0, 4.0]), torch.tensor([2.0, 4.0]), torch.tensor([6.0, 4.0])]
    mean, spread = aggregate(members, "mean")
    assert mean.tolist() == pytest.approx([3.0, 4.0])
    assert spread[0].item() == pytest.approx(math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 3))
    assert spread[1].item() == 0.0
    median, _ = aggregate(members, "median")
    assert median.tolist() == pytest.approx([2.0, 4.0])
    single, single_spread = aggregate(members[:1])
    assert single.tolist() == [1.0, 4.0]
    assert single_spread.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(members, "vote")


@pytest.mark.parametrize(
    ("tier", "reward", "caution", "final", "escalate", "annotate"),
    [
        (1, 3.5, False, True, False, False),
        (1, 3.2, False, True, False, False),   # at the threshold: not under it
        (1, 3.19, False, False, True, False),
        (1, 4.8, True, False, True, False),    # caution escalates whatever the score
        (2, 0.5, False, True, False, True),    # Level-2 is final and goes to annotation
    ],
)
def test_decide(tier: int, reward: float, caution: bool, final: bool, escalate: bool, annotate: bool) -> None:
    outcome = decide(tier, reward, caution, threshold=3.2)
    assert (outcome.final, outcome.escalate, outcome.annotate) == (final, escalate, annotate)


def test_caution_escalation_can_be_turned_off() -> None:
    assert decide(1, 4.8, True, 3.2, escalate_on_caution=False).final


def test_unsafe_advice_is_never_final_at_level1_and_always_reviewed_at_level2() -> None:
    level1 = decide(1, 4.9, False, 3.2, unsafe=True)
    assert (level1.final, level1.escalate, level1.reason) == (False, True, "unsafe advice in the response")
    level2 = decide(2, 4.9, False, 3.2, annotate_level2=False, unsafe=True)
    assert level2.final and level2.annotate and "unsafe" in level2.reason
    assert not decide(2, 4.9, False, 3.2, annotate_level2=False).annotate


def test_a_level2_reward_awaiting_a_human_is_not_final() -> None:
    awaiting = decide(2, 4.0, False, 3.2, annotate_level2=True, await_annotation=True)
    assert (awaiting.final, awaiting.annotate) == (False, True)
    assert "awaiting annotation" in awaiting.reason
    assert decide(2, 4.0, False, 3.2, annotate_level2=False, await_annotation=True).final  # no human asked
    assert not decide(2, 4.0, False, 3.2, annotate_level2=False, unsafe=True, await_annotation=True).final
    assert decide(2, 4.0, False, 3.2, annotate_level2=True).final  # the default: the strong RM's is final


def test_a_sampled_level1_answer_goes_to_a_human_without_changing_its_route() -> None:
    kept = decide(1, 4.0, False, 3.2, await_annotation=True, sampled=True)
    assert (kept.final, kept.escalate, kept.annotate, kept.awaits_annotation) == (True, False, True, False)
    assert kept.reason.endswith("sampled for annotation")
    escalated = decide(1, 1.0, False, 3.2, await_annotation=True, sampled=True)
    assert (escalated.final, escalated.escalate, escalated.annotate, escalated.awaits_annotation) == (
        False, True, True, False)  # the Level-2 answer is the prompt's; the human only labels this one
    assert not decide(1, 4.0, False, 3.2).annotate


def test_the_level1_annotation_draw_is_stable_and_near_its_share() -> None:
    hashes = [f"{i:064x}" for i in range(4000)]
    assert not any(sampled_for_annotation(h, 0.0) for h in hashes)
    assert all(sampled_for_annotation(h, 1.0) for h in hashes)
    drawn = [sampled_for_annotation(h, 0.2) for h in hashes]
    assert drawn == [sampled_for_annotation(h, 0.2) for h in hashes]  # a redelivery draws the same
    assert 0.17 < sum(drawn) / len(drawn) < 0.23
    assert all(sampled_for_annotation(h, 0.3) for h, d in zip(hashes, drawn, strict=True) if d)  # nested shares


def test_conservative_aggregations_lower_the_reward_where_members_disagree() -> None:
    members = [torch.tensor([1.0, 4.0]), torch.tensor([2.0, 4.0]), torch.tensor([6.0, 4.0])]
    low, _ = aggregate(members, "min")
    assert low.tolist() == [1.0, 4.0]
    mean, spread = aggregate(members, "mean")
    lcb, lcb_spread = aggregate(members, "lcb", spread_k=0.5)
    assert lcb[0].item() == pytest.approx(mean[0].item() - 0.5 * spread[0].item())
    assert lcb[1].item() == 4.0  # agreement costs nothing
    assert lcb_spread.tolist() == spread.tolist()
    assert aggregate([torch.tensor([5.0]), torch.tensor([0.0])], "lcb", spread_k=3.0)[0].item() == 0.0  # not < 0
    single, _ = aggregate(members[:1], "lcb", spread_k=2.0)
    assert single.tolist() == [1.0, 4.0]
