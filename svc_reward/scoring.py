"""Reward arithmetic (R8): scoring temperature and ensemble aggregation. Pure torch, no I/O.

A Strata RM outputs logits over score bins on [0, 5] (``strata.models.reward``). The scoring
temperature divides those logits before the softmax, so T < 1 concentrates the mass on the most
likely bins and a noisy tail moves the expected score less; a regression RM (one logit) ignores it.
An ensemble scores with every member and combines the rewards by mean or median, or conservatively
(issue 61): ``min`` of the members, or ``lcb``, the mean less ``spread_k`` times the members' spread,
so an answer the members disagree on earns less (Coste et al., ICLR 2024: conservative ensembles
stop PPO over-optimising one RM's errors). The spread across members is reported as ``reward_std``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from strata.models.reward import MAX_SCORE, score_bins


def tempered_reward(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(N, bins) logits -> (N,) expected score under softmax(logits / T); (N, 1) passes through."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    if logits.shape[-1] == 1:
        return logits[..., 0].clamp(0.0, MAX_SCORE)
    bins = score_bins(logits.shape[-1]).to(logits.device, logits.dtype)
    return torch.softmax(logits / temperature, dim=-1) @ bins


AGGREGATIONS = ("mean", "median", "min", "lcb")


def aggregate(member_rewards: Sequence[torch.Tensor], how: str = "mean",
              spread_k: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(M tensors of (N,)) -> (reward (N,), spread (N,)) across the ensemble's members; ``spread_k``
    weighs the spread for ``lcb``. A single member is its own reward under every aggregation."""
    stacked = torch.stack(list(member_rewards))  # (M, N)
    spread = stacked.std(dim=0, unbiased=False) if stacked.shape[0] > 1 else torch.zeros_like(stacked[0])
    if how == "mean":
        reward = stacked.mean(dim=0)
    elif how == "median":
        reward = stacked.median(dim=0).values
    elif how == "min":
        reward = stacked.min(dim=0).values
    elif how == "lcb":
        reward = (stacked.mean(dim=0) - spread_k * spread).clamp(min=0.0)
    else:
        raise ValueError(f"unknown aggregation {how!r}: use one of {', '.join(AGGREGATIONS)}")
    return reward, spread
