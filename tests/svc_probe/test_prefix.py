"""The shared-prefix forward computes what the transformers forward computes over full rows."""

from __future__ import annotations

import pytest
import torch

from strata.models.loading import load_causal_lm
from strata_tools.task.suite import load_suite
from svc_probe.core import _likelihood_scores, forward_alone
from svc_probe.prefix import prefix_shared_logits, unsupported


@pytest.fixture(scope="module")
def probe_lm(zoo):
    return load_causal_lm(zoo.probe, device="cpu")


def test_rows_equal_the_transformers_forward_over_full_rows(probe_lm) -> None:
    model = probe_lm.model
    contexts = [[5, 9, 30, 7, 12, 44, 3], [8, 2], [17, 4, 4, 90]]  # different lengths in one batch
    continuations = [[11, 12, 13], [40], [22, 23]]
    shared = prefix_shared_logits(model, contexts, continuations, probe_lm.tokenizer.pad_token_id)
    for r, (c, k) in enumerate((c, k) for c in contexts for k in continuations):
        with torch.no_grad():
            full = model(input_ids=torch.tensor([c + k])).logits[0]  # (T, V)
        predicted = full[len(c) - 1: len(c) - 1 + len(k)]  # the logits that predict each continuation token
        assert torch.allclose(shared.predict[r, : len(k)], predicted, atol=1e-4)
        assert torch.allclose(shared.after[r], full[-1], atol=1e-4)


def test_the_probe_scores_are_those_of_the_full_rows(probe_lm) -> None:
    prompts = [r.text for r in load_suite("eval")[:24]]
    prompts.append("Please, could you kindly explain " + "in great detail " * 30 + "how a hash map works? Thank you!")
    names, probs, risk, tokens = _likelihood_scores(probe_lm, prompts, 128)
    names_full, probs_full, risk_full, tokens_full = _likelihood_scores(probe_lm, prompts, 128, share_prefix=False)
    assert names == names_full
    assert torch.allclose(probs, probs_full, atol=1e-5)
    assert risk == pytest.approx(risk_full, abs=1e-5)
    assert all(t < t_full for t, t_full in zip(tokens, tokens_full, strict=True))  # the query is read once


def test_the_bench_limit_is_the_forward_the_probe_runs(probe_lm) -> None:
    out = forward_alone(probe_lm, ["How do I sort a list?"])()
    assert out.predict.shape[0] == 6  # one row per canonical direction
    assert out.after.shape == (6, probe_lm.model.config.vocab_size)


def test_other_models_and_variants_take_the_transformers_forward(probe_lm) -> None:
    assert unsupported(probe_lm.model) is None
    assert unsupported(torch.nn.Linear(2, 2)) == "not a GPT-2 model"
    probe_lm.model.config.activation_function = "relu"
    try:
        assert unsupported(probe_lm.model) == "activation 'relu'"
    finally:
        probe_lm.model.config.activation_function = "gelu_new"
    with pytest.raises(ValueError, match="non-empty"):
        prefix_shared_logits(probe_lm.model, [[1, 2]], [[]], 0)
