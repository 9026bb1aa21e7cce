"""Training helpers of the zoo that are not covered by the micro build."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    GPT2LMHeadModel,
)

from strata.models.growth import deepen, widen, widen_bert


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


def _classifier(n_embd: int = 16, n_head: int = 4) -> GPT2ForSequenceClassification:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=n_embd, n_layer=2, n_head=n_head, num_labels=11,
                        pad_token_id=0)
    return GPT2ForSequenceClassification(config).eval()


def test_widen_computes_the_same_scores_in_a_wider_model() -> None:
    model = _classifier()
    ids = torch.randint(1, 64, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0  # padded rows are pooled at their last real token, as before
    wider = widen(model, 3, seed=1, noise=0.0).eval()
    assert (wider.config.n_embd, wider.config.n_head, wider.config.n_layer) == (48, 4, 2)
    assert model.config.n_embd == 16  # the original is left as it was
    with torch.no_grad():
        torch.testing.assert_close(wider(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=1e-5)
        # Widened and then deepened, still the same function: the zoo's strong RM grows both ways.
        grown = deepen(wider, 2, seed=2).eval()
        torch.testing.assert_close(grown(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=1e-5)
    # About factor^2 times the compute per token in the blocks.
    block = sum(p.numel() for p in model.transformer.h.parameters())
    assert sum(p.numel() for p in wider.transformer.h.parameters()) > 8 * block


def test_widen_noise_breaks_the_symmetry_of_the_copies() -> None:
    model = _classifier()
    ids = torch.randint(1, 64, (2, 10))
    exact = widen(model, 2, seed=1, noise=0.0)
    noisy = widen(model, 2, seed=1, noise=1e-3)
    first, second = noisy.transformer.h[0].mlp.c_fc.weight.split(16, dim=0)  # the two copies' input rows
    assert not torch.equal(first, second)
    assert torch.equal(exact.transformer.h[0].mlp.c_fc.weight.split(16, dim=0)[0],
                       exact.transformer.h[0].mlp.c_fc.weight.split(16, dim=0)[1])
    with torch.no_grad():
        torch.testing.assert_close(noisy.eval()(input_ids=ids).logits, model(input_ids=ids).logits,
                                   rtol=0, atol=5e-2)
    assert torch.equal(widen(model, 2, seed=1).transformer.wte.weight, widen(model, 2, seed=1).transformer.wte.weight)


def test_widen_refuses_what_it_cannot_keep_the_same() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        widen(_classifier(), 1, seed=0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="sequence classifier"):
        widen(lm, 2, seed=0)  # its output head is tied to the input embedding


def _bert_classifier() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=32, max_position_embeddings=32, num_labels=5)
    return BertForSequenceClassification(config).eval()


@pytest.mark.parametrize("factor", [2, 3])
def test_widen_bert_computes_the_same_scores_in_a_wider_model(factor: int) -> None:
    model = _bert_classifier()
    ids = torch.randint(1, 64, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, 8:] = 0
    wider = widen_bert(model, factor, seed=1, noise=0.0).eval()
    assert (wider.config.hidden_size, wider.config.num_attention_heads) == (16 * factor, 4)
    assert wider.config.intermediate_size == 32 * factor and model.config.hidden_size == 16
    with torch.no_grad():
        torch.testing.assert_close(wider(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=1e-5)
        noisy = widen_bert(model, factor, seed=1).eval()  # the default noise moves the scores a little
        torch.testing.assert_close(noisy(input_ids=ids, attention_mask=mask).logits,
                                   model(input_ids=ids, attention_mask=mask).logits, rtol=0, atol=5e-2)
    first, second = noisy.bert.encoder.layer[0].intermediate.dense.weight.split(32, dim=0)[:2]
    assert not torch.equal(first, second)  # the copies are not tied: training can tell them apart


def test_widen_bert_refuses_another_architecture_and_a_factor_under_2() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        widen_bert(_bert_classifier(), 1, seed=0)
    with pytest.raises(ValueError, match="model type 'gpt2'"):
        widen_bert(_classifier(), 2, seed=0)
