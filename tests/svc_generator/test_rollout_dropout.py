"""Rollout dropout (R17) acts on every model family the HF backend serves, and only while sampling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from strata.models.tiny import build_tiny_model
from svc_generator.backends.hf import dropout_modules, rollout_dropout


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_dropout_changes_the_forward_pass_during_rollout_only_and_leaves_the_model_as_it_was(
        family: str, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(family, tmp_path / family)).eval()
    before = [(m.p, m.training) for m in dropout_modules(model)]
    ids = torch.tensor([[3, 5, 7, 11, 13, 17]])
    with torch.no_grad():
        clean = model(ids).logits
        with rollout_dropout(model, 0.3):
            torch.manual_seed(0)
            dropped = model(ids).logits
            torch.manual_seed(0)
            again = model(ids).logits
            torch.manual_seed(1)
            other = model(ids).logits
        after = model(ids).logits
    assert not torch.allclose(dropped, clean)  # dropout acts (Llama: by hooks, GPT-2: by its layers)
    assert torch.equal(dropped, again) and not torch.allclose(dropped, other)  # seeded, as a rollout is
    assert torch.equal(after, clean)  # and nothing of it stays behind
    assert all(not m._forward_hooks for m in model.modules())
    assert [(m.p, m.training) for m in dropout_modules(model)] == before
    with torch.no_grad(), rollout_dropout(model, None):
        assert torch.equal(model(ids).logits, clean)  # None: off
