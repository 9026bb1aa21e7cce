"""The PPO math on hand-computed cases, and one real update loop that must improve a tiny policy."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from svc_learner.policy import PolicyWithValueHead
from svc_learner.ppo import (
    PPOConfig,
    adaptive_clip_epsilon,
    approx_kl_k3,
    clip_epsilon,
    clipped_policy_loss,
    clipped_value_loss,
    collate_rollouts,
    compute_gae,
    kl_coef_at,
    last_token_index,
    log_ratio,
    logprobs_from_logits,
    masked_mean,
    masked_whiten,
    ppo_update,
    token_rewards,
    truncated_importance_weights,
)

# -- GAE -------------------------------------------------------------------------------------------------


def test_gae_three_steps_by_hand() -> None:
    # Row layout: [prompt, r0, r1, r2, pad]; the values at non-response positions must be ignored.
    rewards = torch.tensor([[5.0, 0.0, 0.0, 1.0, 7.0]])
    values = torch.tensor([[9.0, 0.5, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[False, True, True, True, False]])
    gamma, lam = 0.9, 0.8
    # δ2 = 1 + 0.9·0 - 0.7 = 0.3           A2 = 0.3
    # δ1 = 0 + 0.9·0.7 - 0.6 = 0.03        A1 = 0.03 + 0.72·0.3 = 0.246
    # δ0 = 0 + 0.9·0.6 - 0.5 = 0.04        A0 = 0.04 + 0.72·0.246 = 0.21712
    advantages, returns = compute_gae(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(advantages, torch.tensor([[0.0, 0.21712, 0.246, 0.3, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.0, 0.71712, 0.846, 1.0, 0.0]]))


def naive_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """A second implementation: per row, the steps as a list, A_t = Σ_l (γλ)^l δ_{t+l} written out."""
    out = torch.zeros_like(rewards, dtype=torch.float64)
    for row in range(rewards.shape[0]):
        steps = [t for t in range(rewards.shape[1]) if mask[row, t]]
        r = [float(rewards[row, t]) for t in steps]
        v = [float(values[row, t]) for t in steps] + [0.0]  # terminal value 0
        deltas = [r[i] + gamma * v[i + 1] - v[i] for i in range(len(steps))]
        for i, t in enumerate(steps):
            out[row, t] = sum((gamma * lam) ** k * deltas[i + k] for k in range(len(steps) - i))
    return out


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.99, 0.9), (0.5, 0.0), (1.0, 1.0)])
def test_gae_matches_naive_implementation(gamma: float, lam: float) -> None:
    generator = torch.Generator().manual_seed(1)
    rewards = torch.randn(6, 11, generator=generator)
    values = torch.randn(6, 11, generator=generator)
    mask = torch.rand(6, 11, generator=generator) > 0.4  # gaps anywhere, not only prompt/padding
    mask[0] = False  # a row with no response at all
    mask[1, 3:8] = True
    advantages, returns = compute_gae(rewards, values, mask, gamma, lam)
    expected = naive_gae(rewards, values, mask, gamma, lam).float()
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, torch.where(mask, expected + values, 0.0))


def test_gae_with_gamma_and_lambda_one_is_monte_carlo() -> None:
    rewards = torch.tensor([[0.5, -1.0, 2.0]])
    values = torch.tensor([[0.3, 0.2, 0.1]])
    advantages, returns = compute_gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), 1.0, 1.0)
    torch.testing.assert_close(returns, torch.tensor([[1.5, 1.0, 2.0]]))  # rewards-to-go
    torch.testing.assert_close(advantages, torch.tensor([[1.2, 0.8, 1.9]]))


def test_token_rewards_put_the_score_on_the_last_response_token() -> None:
    kl = torch.tensor([[9.0, 0.1, 0.2, 0.3, 9.0], [9.0, 9.0, 0.5, 9.0, 9.0]])
    mask = torch.tensor([[False, True, True, True, False], [False, False, True, False, False]])
    rewards = token_rewards(torch.tensor([2.0, -1.0]), kl, mask, kl_coef=0.5)
    expected = torch.tensor([[0.0, -0.05, -0.1, 2.0 - 0.15, 0.0], [0.0, 0.0, -1.0 - 0.25, 0.0, 0.0]])
    torch.testing.assert_close(rewards, expected)
    assert last_token_index(torch.zeros(1, 4, dtype=torch.bool)).item() == -1


# -- clipped objective and value loss ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ratio", "advantage", "loss", "has_gradient"),
    [
        (1.1, 1.0, -1.1, True),  # inside the range: plain surrogate
        (1.5, 1.0, -1.2, False),  # A > 0, above 1+ε: clipped, no push further up
        (0.5, 1.0, -0.5, True),  # A > 0, below 1-ε: the pessimistic (unclipped) term wins
        (0.9, -1.0, 0.9, True),  # inside the range, negative advantage
        (0.5, -1.0, 0.8, False),  # A < 0, below 1-ε: clipped, no push further down
        (1.5, -1.0, 1.5, True),  # A < 0, above 1+ε: unclipped, the policy is pulled back
    ],
)
def test_clipped_policy_loss(ratio: float, advantage: float, loss: float, has_gradient: bool) -> None:
    r = torch.tensor([ratio], requires_grad=True)
    value = clipped_policy_loss(r, torch.tensor([advantage]), clip_eps=0.2)
    assert value.item() == pytest.approx(loss)
    value.sum().backward()
    assert (r.grad.abs().item() > 0) == has_gradient


def test_clipped_value_loss() -> None:
    old, returns = torch.tensor([1.0, 1.0]), torch.tensor([2.0, 0.0])
    new = torch.tensor([1.5, 1.1])
    # Row 0: V moved 0.5 toward R=2; clipped V = 1.2 -> max(0.25, 0.64) / 2 = 0.32.
    # Row 1: V moved 0.1 away from R=0, inside the range -> 1.21 / 2.
    torch.testing.assert_close(clipped_value_loss(new, old, returns, clip=0.2), torch.tensor([0.32, 0.605]))
    torch.testing.assert_close(clipped_value_loss(new, old, returns, clip=None), torch.tensor([0.125, 0.605]))


# -- log space -------------------------------------------------------------------------------------------


def test_log_space_ratio_of_tiny_probabilities() -> None:
    # Token 1 has probability ~e^-1000 under both policies: far below float32's smallest number.
    old_logits = torch.tensor([[[0.0, -1000.0, 0.0]]])
    new_logits = torch.tensor([[[0.0, -999.5, 0.0]]])
    token = torch.tensor([[1]])
    old_lp, new_lp = logprobs_from_logits(old_logits, token), logprobs_from_logits(new_logits, token)
    assert old_lp.item() == pytest.approx(-1000.0 - math.log(2), abs=1e-3)
    logratio, ratio = log_ratio(new_lp, old_lp)
    assert torch.isfinite(ratio).all()
    assert ratio.item() == pytest.approx(math.exp(0.5), rel=1e-3)
    assert logratio.item() == pytest.approx(0.5, abs=1e-3)
    # The same ratio taken in probability space is 0/0 (the seed's collapse, §5.2): the premise holds.
    assert torch.isnan(torch.exp(new_lp) / torch.exp(old_lp)).all()


def test_log_ratio_is_finite_for_huge_differences() -> None:
    logratio, ratio = log_ratio(torch.tensor([0.0, -2000.0]), torch.tensor([-2000.0, 0.0]))
    assert torch.isfinite(ratio).all()
    assert ratio[1].item() == pytest.approx(0.0, abs=1e-8)
    assert torch.isfinite(approx_kl_k3(logratio)).all()


def test_approx_kl_k3() -> None:
    assert approx_kl_k3(torch.tensor([0.0])).item() == 0.0
    logratio = torch.tensor([-1.0, -0.1, 0.1, 2.0])
    expected = torch.exp(logratio) - 1 - logratio
    torch.testing.assert_close(approx_kl_k3(logratio), expected)
    assert (approx_kl_k3(logratio) > 0).all()


def test_truncated_importance_weights_per_token_in_log_space() -> None:
    behaviour = torch.full((4, 4), -1000.0)  # (B, T) log-probs far below float32's range as probabilities
    diffs = torch.tensor([
        [-0.5, -0.25, 0.1, 0.0],  # each token's own ratio; the 0.1 one is truncated to 1
        [1.0, 1.0, 0.0, 0.0],  # e^1 > 1: truncated to 1
        [-50.0, -50.0, -50.0, -50.0],  # e^-50: a token the target policy all but rules out weighs ~0, not NaN
        [0.3, 0.0, float("nan"), float("inf")],  # NaN/inf on masked positions are ignored (weight 1)
    ])  # fmt: skip
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    weights = truncated_importance_weights(behaviour + diffs, behaviour, mask, truncation=1.0)
    # float32 resolves log-probs near -1000 to ~6e-5, hence the tolerance.
    expected = torch.tensor([
        [math.exp(-0.5), math.exp(-0.25), 1.0, 1.0],
        [1.0, 1.0, 1.0, 1.0],
        [math.exp(-50.0)] * 4,
        [1.0, 1.0, 1.0, 1.0],
    ])  # fmt: skip
    torch.testing.assert_close(weights, expected, rtol=1e-3, atol=1e-6)
    assert torch.isfinite(weights).all()
    # A long response is not punished for its length: 40 tokens at a log-ratio of -0.1 each keep
    # weight e^-0.1 per token (the product over the response would be e^-4 = 0.018).
    long_weights = truncated_importance_weights(torch.full((1, 40), -2.1), torch.full((1, 40), -2.0),
                                                torch.ones(1, 40, dtype=torch.bool))
    torch.testing.assert_close(long_weights, torch.full((1, 40), math.exp(-0.1)))
    wider = truncated_importance_weights(behaviour + diffs, behaviour, mask, truncation=2.0)
    assert wider[1, 0].item() == pytest.approx(2.0)
    assert wider[0, 2].item() == pytest.approx(math.exp(0.1), rel=1e-3)


def test_masked_mean_and_whiten_ignore_padding() -> None:
    x = torch.tensor([[1.0, 3.0, float("nan")], [5.0, float("inf"), 7.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert masked_mean(x, mask).item() == pytest.approx(3.0)
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([2.0, 5.0]))
    white = masked_whiten(x, mask)
    assert torch.isfinite(white).all()
    assert masked_mean(white, mask).item() == pytest.approx(0.0, abs=1e-6)
    assert white[~mask].eq(0).all()


# -- the two rules of R17 --------------------------------------------------------------------------------


@pytest.mark.parametrize(("update", "coef"), [(0, 0.0), (50, 0.025), (100, 0.05), (150, 0.05)])
def test_kl_warmup_schedule(update: int, coef: float) -> None:
    assert kl_coef_at(update, target=0.05, warmup_updates=100) == pytest.approx(coef)


def test_kl_warmup_disabled() -> None:
    assert kl_coef_at(0, target=0.05, warmup_updates=0) == 0.05


@pytest.mark.parametrize(
    ("batch_kl", "eps"),
    [(0.0, 0.02), (0.019, 0.02), (0.02, 0.02), (0.05, 0.05), (0.06, 0.06), (0.1, 0.1), (0.11, 0.1), (3.0, 0.1)],
)
def test_adaptive_clip_epsilon_at_and_around_thresholds(batch_kl: float, eps: float) -> None:
    assert adaptive_clip_epsilon(batch_kl) == pytest.approx(eps)


def test_adaptive_clip_epsilon_interpolates_other_ranges() -> None:
    # Halfway between the KL thresholds -> halfway between the epsilons.
    assert adaptive_clip_epsilon(0.06, eps_low=0.05, eps_high=0.25) == pytest.approx(0.15)
    assert adaptive_clip_epsilon(float("nan")) == 0.02  # unknown KL: the tightest clip


def test_clip_epsilon_fixed_and_adaptive_modes() -> None:
    assert clip_epsilon(PPOConfig(clip_mode="fixed", clip_coef=0.2), batch_kl=5.0) == 0.2
    assert clip_epsilon(PPOConfig(clip_mode="fixed", clip_coef=0.2), batch_kl=0.0) == 0.2
    assert clip_epsilon(PPOConfig(clip_mode="adaptive"), batch_kl=0.05) == pytest.approx(0.05)


# -- batches and the update ------------------------------------------------------------------------------


def test_collate_rollouts_right_pads_and_masks_the_response() -> None:
    batch = collate_rollouts([[5, 6], [7]], [[8], [9, 10, 11]], [1.0, 0.5], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 8, 0], [7, 9, 10, 11]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 0], [0, 1, 1, 1]]
    assert batch.scores.tolist() == [1.0, 0.5]
    with pytest.raises(ValueError):
        collate_rollouts([[5]], [[]], [1.0], pad_token_id=0)


def test_first_minibatch_ratio_is_exactly_one(tiny_policy: PolicyWithValueHead) -> None:
    # With a zero learning rate nothing moves, so every ratio is 1: no KL, nothing clipped.
    batch = collate_rollouts([[1, 2]] * 4, [[3, 4], [5], [6, 7, 8], [9]], [1.0, 0.0, 0.5, 0.2], pad_token_id=0)
    optimizer = torch.optim.Adam(tiny_policy.parameters(), lr=0.0)
    metrics = ppo_update(tiny_policy, tiny_policy.reference_copy(), optimizer, batch, PPOConfig(), update_index=0)
    assert metrics["losses/approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["losses/clipfrac"] == 0.0
    assert metrics["charts/kl"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["charts/kl_coef"] == 0.0  # warm-up starts at 0
    assert metrics["charts/clip_epsilon"] == pytest.approx(0.02)  # adaptive, KL 0 -> eps_low
    assert metrics["charts/mean_reward"] == pytest.approx(0.425)
    assert all(math.isfinite(v) for v in metrics.values())


def test_stale_samples_are_weighted_in_log_space(tiny_policy: PolicyWithValueHead) -> None:
    batch = collate_rollouts([[1, 2]] * 4, [[3, 4, 5]] * 4, [1.0, 0.0, 1.0, 0.0], pad_token_id=0)
    with torch.no_grad():
        current = tiny_policy(batch.input_ids, batch.attention_mask).logprobs  # (B, T-1)
    # Rows 0-1: the behaviour policy gave the response far more probability (weight e^-3000 -> 0).
    # Rows 2-3: on-policy (off_policy False), weight 1 whatever behaviour_logprobs say.
    stale = replace(batch, behaviour_logprobs=current + 1000.0, off_policy=torch.tensor([True, True, False, False]))
    optimizer = torch.optim.Adam(tiny_policy.parameters(), lr=0.0)
    metrics = ppo_update(tiny_policy, tiny_policy.reference_copy(), optimizer, stale, PPOConfig(), update_index=0)
    assert metrics["charts/importance_weight"] == pytest.approx(0.5)
    assert metrics["charts/effective_sample_fraction"] == pytest.approx(0.5)
    assert all(math.isfinite(v) for v in metrics.values())


TARGET_TOKEN = 7
PROMPT = [1, 2]


def _sample(policy: PolicyWithValueHead, n: int, length: int, generator: torch.Generator) -> list[list[int]]:
    sequences = torch.tensor([PROMPT] * n)  # (n, t)
    with torch.no_grad():
        for _ in range(length):
            logits = policy.lm(sequences, attention_mask=torch.ones_like(sequences)).logits[:, -1]  # (n, V)
            next_token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)  # (n, 1)
            sequences = torch.cat([sequences, next_token], dim=1)
    return sequences[:, len(PROMPT) :].tolist()


def _target_probability(policy: PolicyWithValueHead) -> float:
    with torch.no_grad():
        return torch.softmax(policy.lm(torch.tensor([PROMPT])).logits[0, -1], -1)[TARGET_TOKEN].item()


@pytest.mark.parametrize("clip_mode", ["fixed", "adaptive"])
def test_ppo_update_raises_the_probability_of_the_rewarded_token(
    tiny_policy: PolicyWithValueHead, clip_mode: str
) -> None:
    """Behavioural: the reward is the share of a response's tokens equal to TARGET_TOKEN."""
    generator = torch.Generator().manual_seed(0)
    reference = tiny_policy.reference_copy()
    optimizer = torch.optim.Adam(tiny_policy.parameters(), lr=1e-3, eps=1e-5)
    config = PPOConfig(clip_mode=clip_mode, kl_coef=0.05, kl_warmup_updates=2, minibatch_size=16)  # type: ignore[arg-type]
    before = _target_probability(tiny_policy)
    assert before == pytest.approx(1 / tiny_policy.lm.config.vocab_size, rel=0.5)
    for update in range(5):
        responses = _sample(tiny_policy, 16, 3, generator)
        scores = [sum(t == TARGET_TOKEN for t in r) / len(r) for r in responses]
        batch = collate_rollouts([PROMPT] * 16, responses, scores, pad_token_id=0)
        metrics = ppo_update(tiny_policy, reference, optimizer, batch, config, update)
        assert all(math.isfinite(v) for v in metrics.values())
    after = _target_probability(tiny_policy)
    # Over seeds 0-3 the gain was 3.5x-5x in both modes; 2x leaves room for platform noise.
    assert after > 2 * before, (before, after)
    assert metrics["charts/kl"] > 0  # the policy moved away from the reference


def test_a_nan_score_skips_the_steps_and_leaves_the_weights_finite(tiny_policy: PolicyWithValueHead) -> None:
    # One NaN reward whitens every advantage to NaN: a step on that loss would poison every weight,
    # and the learner would publish (and a restart resume from) a NaN checkpoint.
    batch = collate_rollouts([[1, 2]] * 4, [[3, 4], [5], [6, 7, 8], [9]], [1.0, float("nan"), 0.5, 0.2],
                             pad_token_id=0)
    before = [p.detach().clone() for p in tiny_policy.parameters()]
    optimizer = torch.optim.Adam(tiny_policy.parameters(), lr=1e-2)
    metrics = ppo_update(tiny_policy, tiny_policy.reference_copy(), optimizer, batch, PPOConfig(), update_index=0)
    assert metrics["losses/nonfinite_steps_skipped"] > 0
    assert all(torch.equal(a, b) for a, b in zip(before, tiny_policy.parameters(), strict=True))


def test_centering_by_source_removes_the_offset_between_scorers_and_keeps_ranks() -> None:
    from svc_learner.ppo import center_scores_by_source

    scores = [3.4, 3.6, 2.0, 2.4]  # light RM reads high; the human scores of Level-2 read low
    centered = center_scores_by_source(scores, ["", "", "level2", "level2"])
    assert centered == pytest.approx([2.75, 2.95, 2.65, 3.05])  # each source's mean is the batch mean, 2.85
    assert center_scores_by_source(scores, [""] * 4) == scores  # one source: untouched
    with pytest.raises(ValueError):
        center_scores_by_source(scores, [""])
