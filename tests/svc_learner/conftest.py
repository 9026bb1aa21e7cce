"""Tiny GPT-2 policies for the learner tests: built in memory, ~100k parameters, no downloads."""

from __future__ import annotations

import pytest
import torch
from torchutil import one_torch_thread
from transformers import GPT2Config, GPT2LMHeadModel

from svc_learner.policy import PolicyWithValueHead

VOCAB = 16  # small: the rewarded token starts at p ~ 1/16, so a 16-sample batch carries signal


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=64, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


@pytest.fixture
def tiny_lm() -> GPT2LMHeadModel:
    return tiny_gpt2()


@pytest.fixture
def tiny_policy(tiny_lm: GPT2LMHeadModel) -> PolicyWithValueHead:
    return PolicyWithValueHead(tiny_lm).eval()


__all__ = ["one_torch_thread"]
