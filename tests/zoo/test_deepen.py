"""Training helpers of the zoo that are not covered by the micro build."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from strata.zoo.train import deepen


def test_deepen_adds_blocks_that_change_nothing_until_trained() -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)).eval()
    deeper = deepen(model, 3, seed=1).eval()
    assert deeper.config.n_layer == 5 and model.config.n_layer == 2  # the original is left as it was
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(deeper(ids).logits, model(ids).logits, rtol=0, atol=1e-5)
    assert sum(p.numel() for p in deeper.parameters()) > sum(p.numel() for p in model.parameters())
    assert deeper.lm_head.weight.data_ptr() == deeper.transformer.wte.weight.data_ptr()  # still tied

    # The new blocks learn: one step moves the output away from the original model's.
    optimizer = torch.optim.SGD(deeper.parameters(), lr=0.5)
    deeper.train()
    deeper(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert any(block.mlp.c_proj.weight.abs().sum() > 0 for block in deeper.transformer.h[2:])
    with torch.no_grad():
        assert not torch.allclose(deeper.eval()(ids).logits, model(ids).logits, atol=1e-4)

    with pytest.raises(ValueError, match="at least 1"):
        deepen(model, 0, seed=1)
