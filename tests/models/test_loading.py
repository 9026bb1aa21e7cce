"""Loaders: real from_pretrained directories load; bad paths fail with a message saying what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DistilBertConfig, DistilBertModel, GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

from strata.models.generation import SamplingConfig, generate
from strata.models.loading import ModelLoadError, load_causal_lm, load_reward_model, resolve_device, resolve_dtype
from strata.models.reward import expected_reward, score_bins, score_responses, two_hot
from strata_tools.zoo.train import train_tokenizer

TEXTS = [f"Q: question {i}\nA: answer number {i} is fine." for i in range(50)]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXTS, vocab_size=300)


def _tiny_config(tokenizer, **extra) -> GPT2Config:
    return GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id, **extra)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("lm")
    torch.manual_seed(0)
    GPT2LMHeadModel(_tiny_config(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("rm")
    torch.manual_seed(0)
    GPT2ForSequenceClassification(_tiny_config(tokenizer, num_labels=11)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_causal_lm_loads_and_generates(lm_dir: Path) -> None:
    lm = load_causal_lm(lm_dir, device="cpu", dtype="float32")
    assert lm.device == torch.device("cpu")
    assert lm.tokenizer.pad_token is not None and lm.tokenizer.padding_side == "left"
    assert lm.zoo_info is None and lm.n_params > 0
    prompts, directions = ["question 1", "a longer question 2"], [["give_code"], []]
    out = generate(lm, prompts, directions, SamplingConfig(max_new_tokens=5, seed=0))
    assert len(out) == 2 and all(0 < g.n_tokens <= 5 for g in out)
    again = generate(lm, prompts, directions, SamplingConfig(max_new_tokens=5, seed=0))
    assert out == again  # seeded


def test_reward_model_loads_and_scores_in_range(rm_dir: Path) -> None:
    rm = load_reward_model(rm_dir, device="cpu")
    assert rm.model.config.pad_token_id is not None
    rewards = score_responses(rm, ["q1", "q2", "q3"], ["short", "a much longer answer here", ""], batch_size=2)
    assert len(rewards) == 3 and all(0.0 <= r <= 5.0 for r in rewards)
    # Batching must not change a score (right padding, last real token pooled).
    single = score_responses(rm, ["q2"], ["a much longer answer here"], batch_size=1)
    assert single[0] == pytest.approx(rewards[1], abs=1e-5)


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        (lambda tmp: tmp / "nowhere", "does not exist"),
        (lambda tmp: "some-org/some-model", "never downloads"),
        (lambda tmp: _file(tmp), "got a file"),
        (lambda tmp: _empty_dir(tmp), "config.json is missing"),
    ],
)
def test_bad_paths_are_rejected_with_a_clear_message(tmp_path: Path, make_path, message: str) -> None:
    for load in (load_causal_lm, load_reward_model):
        with pytest.raises(ModelLoadError, match=message):
            load(make_path(tmp_path), device="cpu")


def _file(tmp: Path) -> Path:
    (tmp / "model.bin").write_bytes(b"x")
    return tmp / "model.bin"


def _empty_dir(tmp: Path) -> Path:
    (tmp / "empty").mkdir(exist_ok=True)
    return tmp / "empty"


def test_an_incompatible_model_is_rejected(tmp_path: Path, tokenizer) -> None:
    config = DistilBertConfig(vocab_size=len(tokenizer), dim=16, hidden_dim=32, n_layers=1, n_heads=2)
    DistilBertModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot be loaded as a causal LM"):
        load_causal_lm(tmp_path, device="cpu")


def test_missing_weights_and_tokenizer(tmp_path: Path, lm_dir: Path, tokenizer) -> None:
    (tmp_path / "config.json").write_text((lm_dir / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_causal_lm(tmp_path, device="cpu")
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="weights"):
        load_causal_lm(tmp_path, device="cpu")


def test_device_and_dtype_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type in ("cpu", "cuda")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ModelLoadError, match="bad device"):
        resolve_device("tpu")
    with pytest.raises(ModelLoadError, match="bad dtype"):
        resolve_dtype("int3", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU"):
            resolve_device("cuda:0")


def test_reward_bins() -> None:
    assert score_bins(11).tolist() == pytest.approx([0.5 * i for i in range(11)])
    scores = torch.tensor([0.0, 1.3, 2.5, 4.99, 5.0])
    target = two_hot(scores, 11)  # (5, 11)
    assert target.sum(-1).tolist() == pytest.approx([1.0] * 5)
    assert (target @ score_bins(11)).tolist() == pytest.approx(scores.tolist(), abs=1e-5)
    assert expected_reward(torch.log(target + 1e-9)).tolist() == pytest.approx(scores.tolist(), abs=1e-4)
    assert expected_reward(torch.tensor([[3.7]])).tolist() == pytest.approx([3.7])  # regression RM
