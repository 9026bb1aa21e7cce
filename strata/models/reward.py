"""Reward models as sequence classifiers: score bins, expected reward, batched scoring.

A Strata reward model has ``num_labels = n_bins`` logits over evenly spaced scores on [0, 5] (11 bins:
0, 0.5, ..., 5). Its reward is the expected score under the softmax, and the full distribution is
what a light RM is distilled onto (KL between strong and light logits, R6). A user's regression RM
(``num_labels = 1``) also works: its single logit is taken as the reward as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from strata.models.loading import LoadedModel
from strata.models.prompts import PromptFormat, model_positions

MAX_SCORE = 5.0


def score_bins(n_bins: int, max_score: float = MAX_SCORE) -> torch.Tensor:
    """Bin centres, evenly spaced from 0 to ``max_score``: (n_bins,)."""
    if n_bins < 2:
        raise ValueError("a binned reward model needs at least 2 bins")
    return torch.linspace(0.0, max_score, n_bins)


def expected_reward(logits: torch.Tensor, max_score: float = MAX_SCORE) -> torch.Tensor:
    """(B, n_bins) logits -> (B,) expected score; (B, 1) regression logits pass through."""
    if logits.shape[-1] == 1:
        return logits[..., 0]
    bins = score_bins(logits.shape[-1], max_score).to(logits.device, logits.dtype)
    return torch.softmax(logits, dim=-1) @ bins


def two_hot(scores: torch.Tensor, n_bins: int, max_score: float = MAX_SCORE) -> torch.Tensor:
    """(B,) scores -> (B, n_bins) target distributions whose expected value is the score.

    The mass is split between the two nearest bins (linear interpolation), as in MuZero's value
    targets, so cross-entropy training makes ``expected_reward`` regress the score.
    """
    position = scores.clamp(0.0, max_score) / max_score * (n_bins - 1)  # (B,) in bin units
    lower = position.floor().long().clamp(max=n_bins - 2)
    upper_weight = position - lower.to(position.dtype)  # (B,)
    target = torch.zeros(scores.shape[0], n_bins, dtype=scores.dtype, device=scores.device)
    target.scatter_(1, lower[:, None], (1.0 - upper_weight)[:, None])
    target.scatter_add_(1, (lower + 1)[:, None], upper_weight[:, None])
    return target


def save_rm_tokenizer(tokenizer: Any, out: str | Path, max_length: int) -> None:
    """Save an RM's tokenizer with ``model_max_length = max_length``, the tokens the RM was trained
    to read (``reward_logits`` never reads more), leaving the caller's tokenizer object as it was."""
    saved = tokenizer.model_max_length
    tokenizer.model_max_length = max_length
    try:
        tokenizer.save_pretrained(out)
    finally:
        tokenizer.model_max_length = saved


def reward_logits(
    rm: LoadedModel, prompts: Sequence[str], responses: Sequence[str], batch_size: int = 32, max_length: int = 256
) -> torch.Tensor:
    """Raw RM logits for (prompt, response) pairs: (N, num_labels), on the CPU, float32."""
    return reward_logits_and_lengths(rm, prompts, responses, batch_size, max_length)[0]


@torch.no_grad()
def reward_logits_and_lengths(
    rm: LoadedModel, prompts: Sequence[str], responses: Sequence[str], batch_size: int = 32, max_length: int = 256
) -> tuple[torch.Tensor, list[int]]:
    """:func:`reward_logits`, and the tokens the RM read of each pair (after truncation)."""
    if len(prompts) != len(responses):
        raise ValueError("prompts and responses must have the same length")
    prompt_format = PromptFormat.of(rm.tokenizer)  # the RM's chat template when it has one
    texts = [prompt_format.rm_text(p, r) for p, r in zip(prompts, responses, strict=True)]
    # Never read more than the RM was trained on (its tokenizer's model_max_length, when it says) nor
    # more than its positions.
    max_length = min(max_length, rm.tokenizer.model_max_length, model_positions(rm.model.config) or max_length)
    out = []
    lengths: list[int] = []
    for start in range(0, len(texts), batch_size):
        batch = prompt_format.encode(
            texts[start : start + batch_size], return_tensors="pt", padding=True, truncation=True, max_length=max_length
        ).to(rm.device)
        lengths += batch["attention_mask"].sum(dim=1).tolist()
        out.append(rm.model(**batch).logits.float().cpu())  # (b, num_labels)
    if not out:
        return torch.zeros(0, rm.model.config.num_labels or 1), lengths
    return torch.cat(out), lengths


def score_responses(
    rm: LoadedModel, prompts: Sequence[str], responses: Sequence[str], batch_size: int = 32, max_length: int = 256
) -> list[float]:
    """Rewards for (prompt, response) pairs (expected score over the RM's bins)."""
    return expected_reward(reward_logits(rm, prompts, responses, batch_size, max_length)).tolist()


def prompt_match(rms: Sequence[LoadedModel], responses: Sequence[str], own_prompts: Sequence[str],
                 other_prompts: Sequence[str], max_length: int = 256, batch_size: int = 32) -> float:
    """Share of responses the RM (ensemble: mean reward) scores higher under their own prompt than under
    another one. An RM that judges the answer alone gets ~0.5; one that compares it with the prompt, more."""
    if not responses:
        raise ValueError("prompt match needs at least one response")

    def mean_rewards(prompts: Sequence[str]) -> torch.Tensor:
        return torch.stack([expected_reward(reward_logits(rm, prompts, responses, batch_size, max_length))
                            for rm in rms]).mean(dim=0)

    return float((mean_rewards(own_prompts) > mean_rewards(other_prompts)).float().mean())
