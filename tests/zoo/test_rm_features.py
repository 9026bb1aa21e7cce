"""Training aids of the strong RM: feature-head labels from RM data rows, the match pool, and how
train_reward_model runs the feature heads and the match steps."""

from __future__ import annotations

import math
import random

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from strata.contract.directions import DIRECTION_NAMES
from strata.contract.template import format_rm_input
from strata.models.training import ModelShape, TrainConfig
from strata_tools.rm.rows import match_pool, rm_features
from strata_tools.rm.train import (
    FeatureLabels,
    MatchPool,
    _FrozenTrunk,
    _score,
    freeze_lower_layers,
    new_reward_model,
    rm_text_ids,
    train_reward_model,
)
from strata_tools.task.corpus import reference_response
from strata_tools.task.lexicon import TOPICS
from strata_tools.task.oracle import SUBJECT_NAMES, oracle_score
from strata_tools.task.suite import load_suite
from strata_tools.zoo.train import train_tokenizer


def test_rm_features_label_the_prompt_from_the_suite_and_the_answer_from_its_words() -> None:
    code_prompt = next(r for r in load_suite("train") if r.intent == "give_code")
    other = next(r for r in load_suite("train") if r.subject != code_prompt.subject and r.intent == "give_steps")
    answer = reference_response(code_prompt, random.Random(0))
    rows = [
        {"prompt_id": code_prompt.id, "prompt": code_prompt.text, "response": answer},
        {"prompt_id": other.id, "prompt": other.text, "response": answer},  # the same answer, another prompt
        {"prompt_id": "not-in-the-suite", "prompt": "Hi?", "response": "Sure."},
    ]
    features = rm_features(rows)
    sides, kinds = ("prompt", "answer"), ("intent", "topic", "subject")
    assert set(features) == {f"{side}_{kind}" for side in sides for kind in kinds}
    assert features["prompt_intent"].n_classes == len(DIRECTION_NAMES)
    assert features["prompt_subject"].n_classes == len(SUBJECT_NAMES)
    code, steps = DIRECTION_NAMES.index("give_code"), DIRECTION_NAMES.index("give_steps")
    assert list(features["prompt_intent"].labels) == [code, steps, -1]
    own, swapped = SUBJECT_NAMES.index(code_prompt.subject), SUBJECT_NAMES.index(other.subject)
    assert list(features["prompt_subject"].labels) == [own, swapped, -1]
    # The answer's features do not depend on the prompt it is shown with.
    assert list(features["answer_intent"].labels) == [code, code, -1]
    assert list(features["answer_subject"].labels) == [own, own, -1]
    topics = [t.name for t in TOPICS]
    assert list(features["prompt_topic"].labels) == [topics.index(code_prompt.topic), topics.index(other.topic), -1]
    assert features["answer_topic"].labels[1] == topics.index(code_prompt.topic)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    texts = [format_rm_input(r.text, reference_response(r, random.Random(0))) for r in load_suite()[:200]]
    return train_tokenizer(texts, 300)


def test_feature_heads_train_with_the_rm_and_are_not_saved_with_it(tokenizer: PreTrainedTokenizerFast) -> None:
    texts = ["Q: a?\nA: yes.", "Q: b?\nA: no, because.", "Q: c?\nA: maybe.", "Q: d?\nA: sure, whereas."]
    features = {"prompt_letter": FeatureLabels([0, 1, 2, -1], 3)}
    model = new_reward_model(tokenizer, ModelShape(n_embd=16, n_layer=1, n_head=2), 64, n_bins=11, seed=0)
    keys = set(model.state_dict())
    cfg = TrainConfig(steps=3, batch_size=2, lr=1e-3, warmup_steps=1)
    loss = train_reward_model(model, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm",
                              features=features, feature_weight=1.0)
    assert math.isfinite(loss)
    assert set(model.state_dict()) == keys  # the heads are a training aid, not part of the RM

    with pytest.raises(ValueError, match="'prompt_letter' has 3 labels for 4 texts"):
        train_reward_model(model, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm",
                           features={"prompt_letter": FeatureLabels([0, 1, 2], 3)}, feature_weight=1.0)


def test_frozen_layers_keep_the_embeddings_and_lowest_blocks_and_train_the_rest(
        tokenizer: PreTrainedTokenizerFast) -> None:
    texts = ["Q: a?\nA: yes.", "Q: b?\nA: no, because.", "Q: c?\nA: maybe.", "Q: d?\nA: sure, whereas."]
    model = new_reward_model(tokenizer, ModelShape(n_embd=16, n_layer=2, n_head=2), 64, n_bins=11, seed=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    cfg = TrainConfig(steps=3, batch_size=2, lr=1e-2, warmup_steps=1)
    train_reward_model(model, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm", frozen_layers=1)
    moved = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert not {n for n in moved if n.startswith(("transformer.wte", "transformer.wpe", "transformer.h.0."))}
    assert any(n.startswith("transformer.h.1.") for n in moved) and "score.weight" in moved
    assert all(p.requires_grad for p in model.parameters())  # the model leaves trainable, as it came
    with pytest.raises(ValueError, match="must leave a block of the trunk's 2 to train"):
        train_reward_model(model, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm",
                           frozen_layers=2)


def test_frozen_layers_find_a_bert_trunks_blocks() -> None:
    from transformers import BertConfig, BertForSequenceClassification

    bert = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=3,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=11))
    total = sum(p.numel() for p in bert.parameters())
    trainable = freeze_lower_layers(bert, 2)
    frozen = {name for name, p in bert.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith(("bert.embeddings.", "bert.encoder.layer.0.", "bert.encoder.layer.1."))
                          for n in frozen)
    assert any(n.startswith("bert.embeddings.") for n in frozen)
    assert trainable == total - sum(p.numel() for n, p in bert.named_parameters() if n in frozen)
    assert freeze_lower_layers(bert, 0) == trainable  # 0: freezes nothing more


def _tiny_bert(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=3, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64, num_labels=11, pad_token_id=tokenizer.pad_token_id))


def test_a_bert_trunks_frozen_blocks_run_once_and_the_model_comes_back_whole(
        tokenizer: PreTrainedTokenizerFast) -> None:
    texts = ["Q: a?\nA: yes.", "Q: bb?\nA: no, because of it.", "Q: c?\nA: maybe.", "Q: d?\nA: sure."]
    bert = _tiny_bert(tokenizer).eval()
    embeddings, encoded = bert.bert.embeddings, rm_text_ids(tokenizer, texts, 64)
    whole, _ = _score(bert, tokenizer, encoded, False)
    with _FrozenTrunk(bert, 2, tokenizer, encoded, cache=True, desc="rm") as trunk:
        assert len(bert.bert.encoder.layer) == 1  # only the block above the frozen ones runs
        trunk.feed([2, 0, 3, 1])
        cached, _ = _score(bert, tokenizer, [encoded[i] for i in (2, 0, 3, 1)], False)
        assert torch.allclose(cached, whole[[2, 0, 3, 1]], atol=1e-5)  # the same function, read from the cache
    assert bert.bert.embeddings is embeddings and len(bert.bert.encoder.layer) == 3
    assert torch.allclose(_score(bert, tokenizer, encoded, False)[0], whole)
    # Trained through the cache: the frozen part does not move, the block above and the head do.
    before = {name: p.detach().clone() for name, p in bert.named_parameters()}
    cfg = TrainConfig(steps=3, batch_size=2, lr=1e-2, warmup_steps=1)
    train_reward_model(bert, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm", frozen_layers=2)
    moved = {name for name, p in bert.named_parameters() if not torch.equal(p, before[name])}
    frozen = ("bert.embeddings.", "bert.encoder.layer.0.", "bert.encoder.layer.1.")
    assert not {n for n in moved if n.startswith(frozen)}
    assert any(n.startswith("bert.encoder.layer.2.") for n in moved) and "classifier.weight" in moved
    assert all(p.requires_grad for p in bert.parameters()) and len(bert.bert.encoder.layer) == 3


def test_a_frozen_trunk_that_fails_to_set_up_leaves_the_model_as_it_came(
        tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch) -> None:
    bert = _tiny_bert(tokenizer)
    embeddings, encoded = bert.bert.embeddings, rm_text_ids(tokenizer, ["Q: a?\nA: yes.", "Q: b?\nA: no."], 64)
    with _FrozenTrunk(bert, 2, tokenizer, encoded, cache=False, desc="rm") as trunk:
        trunk.train()  # frozen modules run without dropout, the rest trains
        assert not bert.bert.embeddings.training and not bert.bert.encoder.layer[1].training
        assert bert.bert.encoder.layer[2].training and bert.classifier.training

    def out_of_memory(self: _FrozenTrunk) -> list[torch.Tensor]:
        raise MemoryError("no room for the cache")

    monkeypatch.setattr(_FrozenTrunk, "_lower_states", out_of_memory)
    with pytest.raises(MemoryError), _FrozenTrunk(bert, 2, tokenizer, encoded, cache=True, desc="rm"):
        pass
    assert bert.bert.embeddings is embeddings and len(bert.bert.encoder.layer) == 3
    assert all(p.requires_grad for p in bert.parameters())


def test_frozen_layers_refuse_a_trunk_they_do_not_know() -> None:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    llama = LlamaForSequenceClassification(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32,
                                                       num_hidden_layers=2, num_attention_heads=2, num_labels=11))
    with pytest.raises(ValueError, match="frozen layers work on BERT and GPT-2 trunks, not on a LlamaModel"):
        freeze_lower_layers(llama, 1)
    assert all(p.requires_grad for p in llama.parameters())


def test_match_pool_pairs_each_reference_with_its_own_prompt_then_another() -> None:
    records = load_suite("train")[:40]
    by_text = {r.text: r for r in load_suite()}
    pool = match_pool(records, seed=3)
    assert len(pool.texts) % 2 == 0 and len(pool.texts) == len(pool.scores) > 0
    assert match_pool(records, seed=3) == pool  # deterministic per seed
    for k in range(0, len(pool.texts), 2):
        own_prompt, answer = pool.texts[k].split("\nA: ", 1)
        other_prompt, same_answer = pool.texts[k + 1].split("\nA: ", 1)
        assert same_answer == answer and other_prompt != own_prompt
        own, other = by_text[own_prompt.removeprefix("Q: ")], by_text[other_prompt.removeprefix("Q: ")]
        assert own in records
        assert (pool.scores[k], pool.scores[k + 1]) == (oracle_score(own, answer), oracle_score(other, answer))
        assert pool.features["answer_intent"].labels[k] == pool.features["answer_intent"].labels[k + 1]
    # The oracle prefers the answer under the prompt it was written for.
    assert sum(a > b for a, b in zip(pool.scores[0::2], pool.scores[1::2], strict=True)) > 0.9 * len(pool.texts) / 2


def test_match_steps_read_the_pools_in_order_and_train_the_rm_alone(tokenizer: PreTrainedTokenizerFast) -> None:
    texts = ["Q: a?\nA: yes.", "Q: b?\nA: no, because.", "Q: c?\nA: maybe.", "Q: d?\nA: sure, whereas."]
    fetched: list[int] = []

    def pools(k: int) -> MatchPool:
        fetched.append(k)
        pair_texts = [f"Q: {k}{i}?\nA: {k}{i}." for i in range(6)]  # 3 pairs
        return MatchPool(pair_texts, [5.0, 1.0] * 3, {"prompt_letter": FeatureLabels([0, 1, 2, -1, 0, 1], 3)})

    model = new_reward_model(tokenizer, ModelShape(n_embd=16, n_layer=1, n_head=2), 64, n_bins=11, seed=0)
    keys = set(model.state_dict())
    before = {name: value.clone() for name, value in model.state_dict().items()}
    cfg = TrainConfig(steps=5, batch_size=2, lr=1e-3, warmup_steps=1)
    features = {"prompt_letter": FeatureLabels([0, 1, 2, -1], 3)}
    loss = train_reward_model(model, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm",
                              features=features, feature_weight=0.3, match_pools=pools, match_pairs=2)
    assert math.isfinite(loss)
    # 5 match steps of 2 pairs from pools of 3 pairs: a new pool whenever the next 2 pairs do not fit.
    assert fetched == [0, 1, 2, 3, 4]
    assert set(model.state_dict()) == keys  # the feature heads are not part of the RM
    assert any(not torch.equal(before[name], value) for name, value in model.state_dict().items())

    def odd(k: int) -> MatchPool:
        return MatchPool(["Q: x?\nA: y."] * 5, [1.0] * 5, {})

    with pytest.raises(ValueError, match="match pool 0 must hold pairs of texts"):
        train_reward_model(model, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm",
                           match_pools=odd, match_pairs=2)
    with pytest.raises(ValueError, match="match steps need match_pairs >= 1"):
        train_reward_model(model, tokenizer, texts, [5.0, 1.0, 3.0, 2.0], 64, cfg, seed=0, desc="rm",
                           match_pools=pools, match_pairs=0)
