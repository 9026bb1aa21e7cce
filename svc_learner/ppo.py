"""PPO for language models, readable top to bottom (CleanRL's ``ppo.py``, made importable).

Pure math on tensors: no files, no sockets, no transformers import. The policy is anything that
maps ``(input_ids, attention_mask)`` to a :class:`PolicyOutput` (``svc_learner.policy`` provides one
around a Hugging Face causal LM); the service feeds :func:`ppo_update` one :class:`RolloutBatch`
per update.

Shapes: ``B`` sequences, ``T`` tokens per padded sequence (prompt + response). Everything per token
is aligned with ``input_ids[:, 1:]`` and has ``T - 1`` columns: column ``j`` is the action "emit
token ``input_ids[:, j + 1]``", taken in the state "prefix ``input_ids[:, :j + 1]``". Only response
tokens are actions; ``mask`` selects them.

Where the tricks come from:
- PPO clipped objective, GAE: Schulman et al. 2017 (arXiv:1707.06347), 2016 (arXiv:1506.02438);
  implementation details as in CleanRL (Huang et al., "The 37 implementation details of PPO", 2022).
- Per-token KL penalty against a frozen reference, score at the last token: Ziegler et al. 2019
  (arXiv:1909.08593), Stiennon et al. 2020; the same layout as TRL's PPO trainer.
- k3 KL estimator ``(r - 1) - log r``: Schulman, "Approximating KL divergence" (joschu.net, 2020).
- Proximal vs behaviour policy for stale samples, truncated importance weights: Hilton, Cobbe and
  Schulman 2021, "Batch size-invariance for policy optimization" (decoupled PPO, arXiv:2110.00641);
  truncation as in V-trace (Espeholt et al. 2018, IMPALA).
- KL warm-up and KL-adaptive clip: the seed article, §5.1 and §5.2 (brief R17).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

# A log-ratio beyond ±20 (a ratio beyond ~5e8) only happens for a sample the policy has all but ruled
# out; clamping before exp keeps the ratio finite (float32 exp overflows at ~88) and the clip kills
# the gradient there anyway.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class PPOConfig:
    """The hyperparameters :func:`ppo_update` reads (``LearnerSettings.ppo_config()`` builds one)."""

    gamma: float = 1.0  # discount per token; 1.0 is usual in RLHF (one episode = one response)
    gae_lambda: float = 0.95
    clip_mode: Literal["fixed", "adaptive"] = "adaptive"  # adaptive: ε from the batch KL (R17)
    clip_coef: float = 0.2  # ε of the fixed mode
    clip_eps_low: float = 0.02  # adaptive ε when the batch KL <= clip_kl_low
    clip_eps_high: float = 0.1  # adaptive ε when the batch KL >= clip_kl_high
    clip_kl_low: float = 0.02
    clip_kl_high: float = 0.1
    kl_coef: float = 0.05  # target β of the per-token KL penalty against the reference model
    kl_warmup_updates: int = 100  # β rises linearly from 0 to kl_coef over this many updates (R17)
    ent_coef: float = 0.0
    vf_coef: float = 0.1
    clip_vloss: bool = True
    vf_clip_coef: float = 0.2  # value clip range, in reward units (not the policy ε: rewards are 0-5)
    max_grad_norm: float = 1.0
    update_epochs: int = 4
    minibatch_size: int = 8  # sequences per gradient step
    norm_adv: bool = True  # whiten advantages over the batch's response tokens
    target_kl: float | None = None  # stop the epochs early once approx_kl exceeds it (None: never)
    is_truncation: float = 1.0  # c̄: importance weights of stale samples are min(c̄, π_old/π_behaviour)
    seed: int = 0  # minibatch shuffling is seeded by (seed, update_index): updates are reproducible


class PolicyOutput(NamedTuple):
    """What a policy forward returns; every field is ``(B, T - 1)``, aligned with ``input_ids[:, 1:]``."""

    logprobs: torch.Tensor  # log π(input_ids[:, j + 1] | input_ids[:, :j + 1])
    entropy: torch.Tensor  # entropy of the next-token distribution at column j
    values: torch.Tensor  # V(prefix input_ids[:, :j + 1]), from the value head


@dataclass(frozen=True)
class RolloutBatch:
    """One update's worth of scored samples (token ids, never texts; log-probs are recomputed, R13)."""

    input_ids: torch.Tensor  # (B, T) long: prompt + response, padded (any side: see policy.py)
    attention_mask: torch.Tensor  # (B, T) 1 on real tokens, 0 on padding
    response_mask: torch.Tensor  # (B, T) 1 on response tokens (the actions), 0 on prompt and padding
    scores: torch.Tensor  # (B,) float: the reward of each whole response
    # Stale samples (made by an older policy version) carry that version's log-probs, recomputed by
    # the service from the old checkpoint (R13: never stored with the sample). (B, T - 1).
    behaviour_logprobs: torch.Tensor | None = None
    off_policy: torch.Tensor | None = None  # (B,) bool: rows whose behaviour_logprobs apply; None: all

    def to(self, device: torch.device | str) -> RolloutBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_mask=self.response_mask.to(device),
            scores=self.scores.to(device),
            behaviour_logprobs=move(self.behaviour_logprobs),
            off_policy=move(self.off_policy),
        )

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows]

        return RolloutBatch(
            self.input_ids[rows], self.attention_mask[rows], self.response_mask[rows], self.scores[rows],
            pick(self.behaviour_logprobs), pick(self.off_policy),
        )  # fmt: skip


def center_scores_by_source(scores: Sequence[float], sources: Sequence[str]) -> list[float]:
    """Shift each reward source's scores so that its mean is the batch's mean.

    Level-1 samples are scored by the light RM, Level-2 ones by the strong RM or a person; on a small
    zoo the light RM reads ~0.7 above the oracle that people stand in for (docs/learner.md). Whitened
    together, every Level-2 sample would get a negative advantage for its scorer's scale, not for its
    answer. Centering per source keeps the ranking within a source and the batch's overall level.
    """
    if len(scores) != len(sources):
        raise ValueError("one source per score")
    if len(set(sources)) < 2:
        return list(scores)
    overall = sum(scores) / len(scores)
    means = {src: sum(s for s, g in zip(scores, sources, strict=True) if g == src)
             / sum(1 for g in sources if g == src) for src in set(sources)}
    return [s - means[g] + overall for s, g in zip(scores, sources, strict=True)]


def collate_rollouts(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    scores: Sequence[float],
    pad_token_id: int,
) -> RolloutBatch:
    """Right-padded batch of ``prompt + response`` token ids (on-policy; add behaviour log-probs after)."""
    if not (len(prompts) == len(responses) == len(scores)) or not prompts:
        raise ValueError("prompts, responses and scores must be non-empty and of the same length")
    if any(len(p) == 0 for p in prompts) or any(len(r) == 0 for r in responses):
        raise ValueError("every sample needs at least one prompt token and one response token")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (B, T)
    response_mask = torch.zeros((len(prompts), width), dtype=torch.long)  # (B, T)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        n_prompt, n_all = len(prompt), len(prompt) + len(response)
        input_ids[row, :n_all] = torch.tensor([*prompt, *response], dtype=torch.long)
        attention_mask[row, :n_all] = 1
        response_mask[row, n_prompt:n_all] = 1
    return RolloutBatch(input_ids, attention_mask, response_mask, torch.tensor(scores, dtype=torch.float32))


# -- per-token quantities ------------------------------------------------------------------------------


def logprobs_from_logits(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log π(token) for each position: ``(B, T, V), (B, T) -> (B, T)``.

    log_softmax then gather, in float32: exact even for tokens with probability 1e-400 (log-prob
    -921), where softmax-then-log would give log(0) = -inf.
    """
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    return torch.gather(logp, -1, token_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each next-token distribution: ``(B, T, V) -> (B, T)``; H = logsumexp(z) - Σ p z."""
    logits = logits.float()
    probs = F.softmax(logits, dim=-1)  # (B, T, V)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the positions where ``mask`` is true (0 when there are none)."""
    # torch.where, not x * mask: a NaN or inf at a padded position must not leak (0 * inf = NaN).
    kept = torch.where(mask, x, 0.0)
    if dim is None:
        return kept.sum() / mask.sum().clamp(min=1)
    return kept.sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / std`` over the masked positions; 0 elsewhere (CleanRL's ``norm_adv``)."""
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return torch.where(mask, (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


def log_ratio(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logratio, ratio)`` with ratio = π_new / π_old = exp(log π_new - log π_old), computed in log space.

    The seed (§5.2, pit 1) lost a policy in 3 steps to ratios of probabilities like 1e-5 that
    underflowed: dividing probabilities fails, subtracting log-probs does not.
    """
    logratio = new_logprobs - old_logprobs
    return logratio, torch.exp(logratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def approx_kl_k3(logratio: torch.Tensor) -> torch.Tensor:
    """Per-sample k3 estimate of KL(π_old ‖ π_new) from ``logratio = log π_new - log π_old``.

    ``(r - 1) - log r``: unbiased, never negative, low variance (Schulman 2020; CleanRL's approx_kl).
    """
    logratio = logratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.expm1(logratio) - logratio


def truncated_importance_weights(
    target_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    truncation: float = 1.0,
) -> torch.Tensor:
    """Per-token weights ``min(c̄, π_target(y_t|s_t) / π_behaviour(y_t|s_t))``: ``(B, T) x 3 -> (B, T)``.

    Per token, as in decoupled PPO and V-trace (each action's term of the objective is corrected by
    that action's ratio): the product over a whole response would collapse with its length (40 tokens
    at a per-token log-ratio of -0.1 already give e^-4), so a learner one version behind would keep
    a few short responses and drop the rest. The log-ratio is truncated before it is exponentiated,
    so the weight can neither overflow nor underflow to NaN (R13); masked positions weigh 1.
    """
    if truncation <= 0:
        raise ValueError("truncation must be > 0")
    log_rho = torch.where(mask, target_logprobs - behaviour_logprobs, 0.0)  # (B, T)
    return torch.exp(log_rho.clamp(max=math.log(truncation)))


# -- rewards and advantages ----------------------------------------------------------------------------


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last true position of each row, -1 for a row with none: ``(B, T) -> (B,)``."""
    width = mask.shape[-1]
    positions = torch.arange(width, device=mask.device).expand_as(mask)  # (B, T)
    return torch.where(mask, positions, -1).max(-1).values


def token_rewards(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Per-token rewards of the usual RLHF formulation: ``(B,), (B, T), (B, T) -> (B, T)``.

    r_t = -β · KL_t on every response token, plus the response's score on its last token
    (Ziegler et al. 2019). KL_t = log π_old(y_t) - log π_ref(y_t) is the k1 estimate: summed over a
    response it is an unbiased estimate of KL(π_old ‖ π_ref) for that prompt.
    """
    rewards = torch.where(mask, -kl_coef * kl, 0.0)  # (B, T)
    last = last_token_index(mask)  # (B,)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    rewards[rows, last[rows]] += scores[rows].to(rewards.dtype)
    return rewards


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, gae_lambda: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over token sequences: ``(B, T) x 3 -> (advantages, returns)``.

    Only masked positions are steps of the episode; unmasked ones (prompt, padding) are skipped, so
    the recursion links each response token to the next *response* token. The episode ends after the
    last response token (next value 0). Backwards, as in CleanRL:

        δ_t = r_t + γ V_{t+1} - V_t,    A_t = δ_t + γ λ A_{t+1},    R_t = A_t + V_t.
    """
    mask = mask.bool()
    advantages = torch.zeros_like(rewards)  # (B, T)
    next_value = torch.zeros_like(rewards[:, 0])  # (B,) V of the next step; 0 after the episode ends
    next_advantage = torch.zeros_like(rewards[:, 0])  # (B,)
    for t in reversed(range(rewards.shape[1])):
        step = mask[:, t]  # (B,)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * gae_lambda * next_advantage
        advantages[:, t] = torch.where(step, advantage, 0.0)
        # Carry the recursion across non-steps unchanged.
        next_advantage = torch.where(step, advantage, next_advantage)
        next_value = torch.where(step, values[:, t], next_value)
    returns = torch.where(mask, advantages + values, 0.0)
    return advantages, returns


# -- losses --------------------------------------------------------------------------------------------


def clipped_policy_loss(ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float) -> torch.Tensor:
    """Per-token PPO loss max(-A·r, -A·clip(r, 1-ε, 1+ε)) (the negated clipped surrogate)."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return torch.max(unclipped, clipped)


def clipped_value_loss(
    new_values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """Per-token ½·max((V - R)², (V_clipped - R)²), V_clipped = V_old + clip(V - V_old, ±clip); None: ½(V - R)²."""
    unclipped = (new_values - returns) ** 2
    if clip is None:
        return 0.5 * unclipped
    v_clipped = old_values + torch.clamp(new_values - old_values, -clip, clip)
    return 0.5 * torch.max(unclipped, (v_clipped - returns) ** 2)


# -- the two rules of R17 ------------------------------------------------------------------------------


def kl_coef_at(update: int, target: float, warmup_updates: int = 100) -> float:
    """KL-penalty warm-up (seed §5.1): β rises linearly from 0 at update 0 to ``target`` at ``warmup_updates``."""
    if warmup_updates <= 0:
        return target
    return target * min(1.0, max(update, 0) / warmup_updates)


def adaptive_clip_epsilon(
    batch_kl: float,
    eps_low: float = 0.02,
    eps_high: float = 0.1,
    kl_low: float = 0.02,
    kl_high: float = 0.1,
) -> float:
    """The seed's adaptive clip (§5.2): ε = eps_high when batch KL >= kl_high, eps_low when <= kl_low,
    linear in between.

    Direction as the seed states it: a *larger* KL gives a *larger* ε (with the defaults, ε is the
    batch KL clamped to [0.02, 0.1]). A NaN KL gives eps_low, the tightest clip.
    """
    if not kl_low < kl_high:
        raise ValueError("kl_low must be < kl_high")
    if math.isnan(batch_kl) or batch_kl <= kl_low:
        return eps_low
    if batch_kl >= kl_high:
        return eps_high
    return eps_low + (batch_kl - kl_low) / (kl_high - kl_low) * (eps_high - eps_low)


def clip_epsilon(config: PPOConfig, batch_kl: float) -> float:
    """ε in use for this update: the fixed ``clip_coef`` or the KL-adaptive rule."""
    if config.clip_mode == "fixed":
        return config.clip_coef
    return adaptive_clip_epsilon(
        batch_kl, config.clip_eps_low, config.clip_eps_high, config.clip_kl_low, config.clip_kl_high
    )


# -- the update ----------------------------------------------------------------------------------------


@torch.no_grad()
def _forward_chunked(policy: torch.nn.Module, batch: RolloutBatch, chunk: int) -> PolicyOutput:
    """A no-grad forward of the whole batch, ``chunk`` rows at a time (full-vocab logits are big)."""
    parts = [
        policy(batch.input_ids[i : i + chunk], batch.attention_mask[i : i + chunk])
        for i in range(0, batch.input_ids.shape[0], chunk)
    ]
    return PolicyOutput(*(torch.cat(fields) for fields in zip(*parts, strict=True)))


def ppo_update(
    policy: torch.nn.Module,
    ref_policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    config: PPOConfig,
    update_index: int,
    row_groups: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, float]:
    """One PPO update (several epochs of minibatch steps) on one batch; returns the update's metrics.

    ``policy`` and ``ref_policy`` map ``(input_ids, attention_mask)`` to a :class:`PolicyOutput`;
    ``optimizer`` holds ``policy``'s parameters (value head included). ``update_index`` counts
    updates from 0 and drives the KL warm-up. ``row_groups`` (name -> ``(B,)`` bool) only adds
    metrics: ``off_policy/<name>_is_weight_mean``, the mean weight over that group's response tokens.
    """
    device = next(policy.parameters()).device
    batch = batch.to(device)
    n_rows = batch.input_ids.shape[0]
    mask = (batch.response_mask[:, 1:] * batch.attention_mask[:, 1:]).bool()  # (B, T-1) actions
    if not mask.any():
        raise ValueError("the batch has no response tokens")

    # 1. Freeze the rollout statistics under θ_old, the weights before this update ("proximal"
    #    policy). Dropout stays off in the learner, so ratios are exactly 1 at the first minibatch.
    policy.eval()
    chunk = max(1, config.minibatch_size)
    old = _forward_chunked(policy, batch, chunk)  # (B, T-1) each
    ref_logprobs = _forward_chunked(ref_policy, batch, chunk).logprobs  # (B, T-1)

    # 2. Rewards per token: score at the last token, -β·KL everywhere (β warms up, R17).
    kl_coef = kl_coef_at(update_index, config.kl_coef, config.kl_warmup_updates)
    kl_per_token = old.logprobs - ref_logprobs  # (B, T-1) k1 estimate of KL(π_old ‖ π_ref)
    rewards = token_rewards(batch.scores, kl_per_token, mask, kl_coef)  # (B, T-1)
    advantages, returns = compute_gae(rewards, old.values, mask, config.gamma, config.gae_lambda)
    if config.norm_adv:
        advantages = masked_whiten(advantages, mask)

    # 3. Stale samples: each token weighted by min(c̄, π_old/π_behaviour) (decoupled PPO); on-policy rows weigh 1.
    weights = torch.ones_like(old.logprobs)  # (B, T-1)
    if batch.behaviour_logprobs is not None:
        stale_weights = truncated_importance_weights(old.logprobs, batch.behaviour_logprobs, mask, config.is_truncation)
        stale = (torch.ones(n_rows, dtype=torch.bool, device=device) if batch.off_policy is None
                 else batch.off_policy.bool())  # (B,)
        weights = torch.where(stale[:, None], stale_weights, weights)

    # 4. ε for this update, from the batch KL to the reference (k3, per response token).
    batch_kl = masked_mean(approx_kl_k3(ref_logprobs - old.logprobs), mask).item()
    clip_eps = clip_epsilon(config, batch_kl)

    # 5. Epochs of shuffled minibatches (CleanRL's loop).
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + update_index)
    sums: dict[str, float] = {}
    steps = skipped = 0
    for _epoch in range(config.update_epochs):
        epoch_kls = []
        order = torch.randperm(n_rows, generator=generator).to(device)
        for start in range(0, n_rows, chunk):
            rows = order[start : start + chunk]
            m = mask[rows]  # (b, T-1)
            new = policy(batch.input_ids[rows], batch.attention_mask[rows])  # (b, T-1) each
            logratio, ratio = log_ratio(new.logprobs, old.logprobs[rows])

            pg_loss = clipped_policy_loss(ratio, advantages[rows], clip_eps) * weights[rows]
            policy_loss = masked_mean(pg_loss, m)
            v_clip = config.vf_clip_coef if config.clip_vloss else None
            value_loss = masked_mean(clipped_value_loss(new.values, old.values[rows], returns[rows], v_clip), m)
            entropy = masked_mean(new.entropy, m)
            loss = policy_loss - config.ent_coef * entropy + config.vf_coef * value_loss

            optimizer.zero_grad(set_to_none=True)
            if not torch.isfinite(loss):
                skipped += 1  # a step on a NaN or inf loss would poison every weight
                continue
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
            if not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            optimizer.step()

            with torch.no_grad():
                approx_kl = masked_mean(approx_kl_k3(logratio), m).item()
                clipfrac = masked_mean(((ratio - 1.0).abs() > clip_eps).float(), m).item()
            epoch_kls.append(approx_kl)
            for name, value in (
                ("losses/policy_loss", policy_loss.item()),
                ("losses/value_loss", value_loss.item()),
                ("losses/entropy", entropy.item()),
                ("losses/approx_kl", approx_kl),
                ("losses/clipfrac", clipfrac),
                ("charts/grad_norm", float(grad_norm)),
            ):
                sums[name] = sums.get(name, 0.0) + value
            steps += 1
        if config.target_kl is not None and epoch_kls and sum(epoch_kls) / len(epoch_kls) > config.target_kl:
            break  # CleanRL's early stop: the policy already moved far enough from θ_old

    # 6. Metrics: means over the minibatch steps, plus the batch's statistics.
    metrics = {name: total / steps for name, total in sums.items()} if steps else {}
    metrics["losses/nonfinite_steps_skipped"] = float(skipped)
    values_m, returns_m = old.values[mask], returns[mask]
    var_returns = returns_m.var(unbiased=False).item() if returns_m.numel() > 1 else 0.0
    explained = 1.0 - (returns_m - values_m).var(unbiased=False).item() / var_returns if var_returns > 0 else 0.0
    token_weights = weights[mask]  # Kish effective sample size over the response tokens
    ess = (token_weights.sum() ** 2 / (token_weights**2).sum().clamp(min=1e-12)).item() / token_weights.numel()
    metrics.update(
        {
            "losses/explained_variance": explained,
            "charts/clip_epsilon": clip_eps,
            "charts/kl_coef": kl_coef,
            "charts/mean_reward": batch.scores.float().mean().item(),
            "charts/kl": batch_kl,
            "charts/importance_weight": token_weights.mean().item(),
            "charts/effective_sample_fraction": ess,
            "charts/response_tokens": float(mask.sum().item()),
            "charts/minibatch_steps": float(steps),
        }
    )
    for name, rows in (row_groups or {}).items():  # e.g. the Level-2 rows: how much their tokens count
        group_mask = mask & rows.to(device).bool()[:, None]  # (B, T-1)
        if group_mask.any():
            metrics[f"off_policy/{name}_is_weight_mean"] = weights[group_mask].mean().item()
    return metrics
