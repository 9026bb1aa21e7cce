"""The RM feature heads: their labels from RM data rows, and how train_reward_model uses them."""

from __future__ import annotations

import math
import random

import pytest
from transformers import PreTrainedTokenizerFast

from strata.zoo.build import rm_features
from strata.zoo.corpus import reference_response
from strata.zoo.directions import DIRECTION_NAMES
from strata.zoo.lexicon import TOPICS
from strata.zoo.oracle import SUBJECT_NAMES
from strata.zoo.suite import load_suite
from strata.zoo.template import format_rm_input
from strata.zoo.train import (
    FeatureLabels,
    ModelShape,
    TrainConfig,
    new_reward_model,
    train_reward_model,
    train_tokenizer,
)


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
