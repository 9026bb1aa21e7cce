"""Reward arithmetic (R8): scoring temperature and ensemble aggregation. Pure torch, no I/O.

A Strata RM outputs logits over score bins on [0, 5] (``strata.models.reward``). The scoring
temperature divides those logits before the softmax, so T < 1 concentrates the mass on the most
likely bins and a noisy tail moves the expected score less; a regression RM (one logit) ignores it.
An ensemble scores with every member and combines the rewards by mean or median; the spread across
members is reported as ``reward_std``.
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


def aggregate(member_rewards: Sequence[torch.Tensor], how: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """(M tensors of (N,)) -> (reward (N,), spread (N,)) across the ensemble's members."""
    stacked = torch.stack(list(member_rewards))  # (M, N)
    if how == "mean":
        reward = stacked.mean(dim=0)
    elif how == "median":
        reward = stacked.median(dim=0).values
    else:
        raise ValueError(f"unknown aggregation {how!r}: use mean or median")
    spread = stacked.std(dim=0, unbiased=False) if stacked.shape[0] > 1 else torch.zeros_like(reward)
    return reward, spread
