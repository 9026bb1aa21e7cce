"""Batched sampling from a causal LM with its prompt format (``strata.models.prompts``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from transformers import GenerationMixin

from strata.models.loading import LoadedModel
from strata.models.prompts import PromptFormat, cut_at_stop, stop_token_ids


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.7  # 0 means greedy
    top_p: float = 0.9
    max_new_tokens: int = 96
    seed: int | None = None  # seeds torch's global RNG before sampling when set


@dataclass(frozen=True)
class Generation:
    text: str  # the response, without the prompt and the EOS token
    n_tokens: int  # new tokens produced (EOS included when it came)
    finished: bool  # True if the model stopped by itself (EOS) rather than at max_new_tokens


@torch.no_grad()
def generate(
    lm: LoadedModel,
    prompts: Sequence[str],
    directions: Sequence[Sequence[str]] | None = None,
    sampling: SamplingConfig = SamplingConfig(),
    batch_size: int = 16,
) -> list[Generation]:
    """Responses to ``prompts``, each guided by its directions (first = main, may be empty)."""
    if directions is not None and len(directions) != len(prompts):
        raise ValueError("directions must have one entry per prompt")
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    tokenizer = lm.tokenizer
    prompt_format = PromptFormat.of(tokenizer)
    stops = stop_token_ids(tokenizer, getattr(lm.model, "generation_config", None))
    texts = [prompt_format.generator_text(p, directions[i] if directions else ()) for i, p in enumerate(prompts)]
    results: list[Generation] = []
    for start in range(0, len(texts), batch_size):
        batch = prompt_format.encode(texts[start : start + batch_size], return_tensors="pt", padding=True).to(lm.device)
        do_sample = sampling.temperature > 0
        output = cast(GenerationMixin, lm.model).generate(
            **batch,
            max_new_tokens=sampling.max_new_tokens,
            do_sample=do_sample,
            temperature=sampling.temperature if do_sample else None,
            top_p=sampling.top_p if do_sample else None,
            top_k=0 if do_sample else None,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=list(stops),
        )  # (b, T_prompt + T_new)
        new_tokens = output[:, batch["input_ids"].shape[1] :]  # (b, T_new)
        for row in new_tokens.tolist():
            row, finished = cut_at_stop(row, stops)
            text = str(tokenizer.decode([t for t in row if t not in stops and t != tokenizer.pad_token_id]))
            results.append(Generation(text.strip(), len(row), finished))
    return results
