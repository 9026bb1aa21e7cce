"""The policy wrapper: log-probs of given ids, padding on either side, value head, reference copy, loading."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel

from strata.models.loading import ModelLoadError
from svc_learner.policy import VALUE_HEAD_FILE, PolicyWithValueHead, set_dropout


def test_forward_returns_logprobs_of_the_given_ids(tiny_policy: PolicyWithValueHead) -> None:
    ids = torch.tensor([[1, 5, 3, 9, 2]])  # (B, T)
    out = tiny_policy(ids, torch.ones_like(ids))
    assert out.logprobs.shape == out.entropy.shape == out.values.shape == (1, 4)
    with torch.no_grad():
        logits = tiny_policy.lm(ids).logits[0]  # (T, V)
    expected = F.log_softmax(logits, -1)[torch.arange(4), ids[0, 1:]]  # position j predicts token j + 1
    torch.testing.assert_close(out.logprobs[0], expected)
    probs = F.softmax(logits[:4], -1)
    torch.testing.assert_close(out.entropy[0], -(probs * probs.log()).sum(-1))
    assert out.values.dtype == torch.float32
    assert out.values.abs().max().item() == 0.0  # zero-initialised head


def test_left_and_right_padding_give_the_same_outputs(tiny_policy: PolicyWithValueHead) -> None:
    ids_right = torch.tensor([[4, 5, 6, 7, 0, 0]])
    ids_left = torch.tensor([[0, 0, 4, 5, 6, 7]])
    mask_right = torch.tensor([[1, 1, 1, 1, 0, 0]])
    mask_left = torch.tensor([[0, 0, 1, 1, 1, 1]])
    torch.nn.init.normal_(tiny_policy.value_head.weight)  # make the values non-trivial
    right = tiny_policy(ids_right, mask_right)
    left = tiny_policy(ids_left, mask_left)
    # Columns predicting the real tokens 5, 6, 7: 0..2 with right padding, 2..4 with left padding.
    for field in ("logprobs", "entropy", "values"):
        torch.testing.assert_close(getattr(right, field)[:, 0:3], getattr(left, field)[:, 2:5])
        assert torch.isfinite(getattr(left, field)).all()


def test_gradients_reach_the_lm_and_the_value_head(tiny_policy: PolicyWithValueHead) -> None:
    ids = torch.tensor([[1, 2, 3, 4]])
    out = tiny_policy(ids, torch.ones_like(ids))
    (out.logprobs.sum() + (out.values - 1.0).pow(2).sum()).backward()
    assert tiny_policy.value_head.weight.grad is not None and tiny_policy.value_head.weight.grad.abs().sum() > 0
    assert tiny_policy.lm.transformer.wte.weight.grad.abs().sum() > 0


def test_the_value_loss_trains_the_trunk_only_when_asked(tiny_policy: PolicyWithValueHead) -> None:
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        tiny_policy.value_head.weight.fill_(0.1)  # a fresh (zero) head passes no gradient back either way
    for trunk_grad in (False, True):
        tiny_policy.zero_grad(set_to_none=True)
        tiny_policy.value_trunk_grad = trunk_grad
        out = tiny_policy(ids, torch.ones_like(ids))
        (out.values - 1.0).pow(2).sum().backward()  # the value loss alone
        assert tiny_policy.value_head.bias.grad is not None and tiny_policy.value_head.bias.grad.abs().sum() > 0
        trunk = tiny_policy.lm.transformer.h[0].mlp.c_fc.weight.grad
        assert (trunk is not None and bool(trunk.abs().sum() > 0)) == trunk_grad


def test_a_fresh_value_head_starts_at_the_mean_return(tiny_policy: PolicyWithValueHead) -> None:
    ids = torch.tensor([[1, 2, 3, 4]])
    assert tiny_policy.start_value_at(3.5)
    torch.testing.assert_close(tiny_policy(ids, torch.ones_like(ids)).values, torch.full((1, 3), 3.5))
    assert not tiny_policy.start_value_at(1.0)  # no longer fresh: a trained (or restored) head is kept
    assert tiny_policy.value_head.bias.item() == 3.5


def test_reference_copy_is_frozen_and_independent(tiny_policy: PolicyWithValueHead) -> None:
    ref = tiny_policy.reference_copy()
    assert not any(p.requires_grad for p in ref.parameters())
    assert all(p.requires_grad for p in tiny_policy.parameters())
    assert not ref.training
    ids = torch.tensor([[1, 2, 3]])
    before = ref(ids, torch.ones_like(ids)).logprobs.clone()
    with torch.no_grad():
        for p in tiny_policy.parameters():
            p.add_(0.1)
    torch.testing.assert_close(ref(ids, torch.ones_like(ids)).logprobs, before)


def test_from_pretrained_loads_a_save_pretrained_directory(tmp_path: Path, tiny_lm: GPT2LMHeadModel) -> None:
    lm = tiny_lm
    lm.save_pretrained(tmp_path / "plain")
    policy = PolicyWithValueHead.from_pretrained(tmp_path / "plain", device="cpu")
    assert policy.device.type == "cpu"
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(policy.lm(ids).logits, lm(ids).logits)
    assert policy.value_head.weight.abs().sum().item() == 0.0  # no value head there: a new one

    torch.nn.init.normal_(policy.value_head.weight)
    policy.save_pretrained(tmp_path / "with_head")
    assert (tmp_path / "with_head" / VALUE_HEAD_FILE).is_file()
    again = PolicyWithValueHead.from_pretrained(tmp_path / "with_head", device="cpu")
    torch.testing.assert_close(again.value_head.weight, policy.value_head.weight)


def test_from_pretrained_rejects_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        PolicyWithValueHead.from_pretrained(tmp_path / "nowhere", device="cpu")


def test_set_dropout_changes_every_dropout_layer(tiny_policy: PolicyWithValueHead) -> None:
    count = set_dropout(tiny_policy, 0.1)
    layers = [m for m in tiny_policy.modules() if isinstance(m, torch.nn.Dropout)]
    assert count == len(layers) > 0
    assert all(m.p == 0.1 for m in layers)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    tiny_policy.train()
    torch.manual_seed(0)
    noisy = tiny_policy(ids, torch.ones_like(ids)).logprobs
    tiny_policy.eval()
    clean = tiny_policy(ids, torch.ones_like(ids)).logprobs
    assert not torch.allclose(noisy, clean)  # dropout acts in train mode only
    with pytest.raises(ValueError):
        set_dropout(tiny_policy, 1.0)
