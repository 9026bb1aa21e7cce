"""PromptFormat: the one place that decides what text and token ids a model is fed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer, GPT2Config, LlamaConfig

from strata.models.budget import TokenBudget
from strata.models.prompts import PromptFormat, direction_phrase, model_positions, stop_token_ids
from strata.models.tiny import build_tiny_model, build_tokenizer


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model("qwen2", tmp_path_factory.mktemp("qwen") / "model")


def test_chat_prompt_ids_hold_one_set_of_special_tokens() -> None:
    tokenizer = build_tokenizer("llama")
    prompt_format = PromptFormat.of(tokenizer)
    ids = prompt_format.prompt_ids("hello there", ("give_code",))
    bos = tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    assert ids[0] == bos and ids.count(bos) == 1  # the template's BOS, not a second from the tokenizer
    assert ids == list(prompt_format.encode([prompt_format.generator_text("hello there", ("give_code",))])
                       ["input_ids"][0])


def test_zoo_format_keeps_the_plain_template_for_tokenizers_without_chat_template() -> None:
    prompt_format = PromptFormat.of(build_tokenizer("gpt2"))
    assert prompt_format.kind == "zoo"
    assert prompt_format.generator_text("hi", ("give_code",)) == "Q: hi\nDirections: give_code\nA:"
    assert prompt_format.rm_text("hi", " yes ") == "Q: hi\nA: yes"


def test_a_template_that_drops_the_system_turn_gets_the_directions_in_the_user_turn() -> None:
    tokenizer = build_tokenizer("qwen2")
    tokenizer.chat_template = ("{% for m in messages %}{% if m['role'] != 'system' %}<|im_start|>{{ m['role'] }}\n"
                               "{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}")
    prompt_format = PromptFormat.of(tokenizer)
    assert not prompt_format.system_role
    assert "give code" in prompt_format.generator_text("q", ("give_code",))


def test_stop_ids_list_the_generation_config_first_without_repeats() -> None:
    tokenizer = build_tokenizer("qwen2")
    eos = tokenizer.eos_token_id
    assert stop_token_ids(tokenizer, SimpleNamespace(eos_token_id=[7, eos, 7])) == (7, eos)
    assert stop_token_ids(tokenizer, SimpleNamespace(eos_token_id=None)) == (eos,)
    assert stop_token_ids(tokenizer) == (eos,)


def test_positions_come_from_the_config_of_each_family() -> None:
    assert model_positions(GPT2Config(n_positions=160)) == 160
    assert model_positions(LlamaConfig(max_position_embeddings=4096)) == 4096
    assert model_positions(SimpleNamespace()) is None


@pytest.mark.parametrize("name", ["Give_Code", "give code", "", "x" * 49, "1st"])
def test_bad_direction_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="bad direction name"):
        direction_phrase(name)


def test_the_budget_counts_the_chat_template_and_tells_templates_apart(qwen_dir: Path, tmp_path: Path) -> None:
    budget = TokenBudget.of_model("Level-1", qwen_dir)
    assert budget.n_positions == 512
    assert budget.prompt_tokens("hi", ("give_code",)) == len(budget.format.prompt_ids("hi", ("give_code",)))
    assert budget.prompt_tokens("hi") >= budget.prompt_tokens("hi", ("give_code",))  # worst case of the probe
    assert budget.problem("hi", 500) is not None and budget.problem("hi", 8) is None

    other = tmp_path / "other"
    tokenizer = AutoTokenizer.from_pretrained(qwen_dir)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.save_pretrained(other)
    (other / "config.json").write_text((qwen_dir / "config.json").read_text())
    assert budget.reads_like(TokenBudget.of_model("Level-2", qwen_dir))
    assert not budget.reads_like(TokenBudget.of_model("Level-2", other))
