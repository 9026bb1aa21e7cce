"""Tiny reward models for the svc_reward tests: built in memory in milliseconds, no zoo needed."""

from __future__ import annotations

import torch
from transformers import GPT2ForSequenceClassification, PreTrainedTokenizerFast

from strata.models.reward import score_bins
from strata.zoo.train import ModelShape, new_reward_model

N_BINS = 11
TINY = ModelShape(n_embd=32, n_layer=1, n_head=2)
TEXTS = [
    "Q: How do I bake bread?\nA: First, check the flour. Next, prepare the dough. Finally, bake it.",
    "Q: Explain how a loan works.\nA: The principle is simple: the payment depends on the principal.",
    "Q: Compare tea and coffee.\nA: Tea is better for calm mornings, whereas coffee is better for speed.",
]


def constant_rm(tokenizer: PreTrainedTokenizerFast, score: float, seed: int = 0) -> GPT2ForSequenceClassification:
    """A tiny RM whose bin distribution puts ~all mass on the bin nearest ``score``, whatever the input.

    The final layer norm outputs its bias only (weight 0), so the head sees the same vector for every
    input: rewards then tell unambiguously which model produced them.
    """
    model = new_reward_model(tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=seed)
    target = int(torch.argmin((score_bins(N_BINS) - score).abs()))
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.score.weight.zero_()
        model.score.weight[target].fill_(12.0 / TINY.n_embd)  # logit 12 on the target bin, 0 elsewhere
    return model.eval()
