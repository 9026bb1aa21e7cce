"""Tiny reward models for the RM tests (tests/rm, tests/svc_reward): built in milliseconds, no zoo needed.

The fixtures are imported by those directories' conftest files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import GPT2ForSequenceClassification, PreTrainedTokenizerFast

from strata.models.reward import score_bins
from strata.models.training import ModelShape
from strata_tools.rm.train import new_reward_model
from strata_tools.zoo.train import train_tokenizer

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


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(TEXTS * 4, vocab_size=300)


@pytest.fixture
def make_rm(tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast) -> Callable[[str, float], Path]:
    """``make_rm(name, score)`` saves a constant tiny RM under tmp_path and returns its directory."""

    def make(name: str, score: float, seed: int = 0) -> Path:
        out = tmp_path / name
        constant_rm(tiny_tokenizer, score, seed).save_pretrained(out)
        tiny_tokenizer.save_pretrained(out)
        return out

    return make
