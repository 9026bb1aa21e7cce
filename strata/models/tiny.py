"""Tiny random-weight checkpoints of the model families users bring: GPT-2, Llama, Qwen2, Mistral.

Built from a config in a second, no download: each is a real ``save_pretrained`` directory of its
architecture (grouped-query attention, RoPE, RMSNorm where the family has them) with a byte-level BPE
tokenizer and, for the instruct families, a chat template in that family's style:

- ``llama``: Llama-3 headers (``<|start_header_id|>role<|end_header_id|>``), ``<|eot_id|>`` ends a
  turn and is the EOS; no pad token (the loader pads with EOS, as users do with Llama).
- ``qwen2``: ChatML (``<|im_start|>role ... <|im_end|>``), pad ``<|endoftext|>``.
- ``mistral``: ``[INST] ... [/INST]``; the template refuses a system message (as Mistral's v0.1 does),
  so directions go into the user turn.
- ``gpt2``: no chat template: the zoo's plain text template.

Tests run generate -> score -> PPO update -> weight sync with each (tests/models/test_architectures.py),
and ``strata models tiny`` writes one for a bench (``strata bench generator --model``).
``build_char_policy`` is the other tiny model: a GPT-2 on a character tokenizer, whose toy rewards
on characters PPO can climb in a few updates (``strata bench learner``, the learner's tests).
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

ARCHITECTURES: tuple[str, ...] = ("gpt2", "llama", "qwen2", "mistral")
ModelKind = Literal["causal", "reward"]


@dataclass(frozen=True)
class Family:
    bos: str | None
    eos: str
    pad: str | None
    extra_special: tuple[str, ...]
    chat_template: str | None


_LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% elif message['role'] == 'user' %}[INST] {{ message['content'] }} [/INST]"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)

FAMILIES: dict[str, Family] = {
    "gpt2": Family(None, "<|endoftext|>", None, (), None),
    "llama": Family("<|begin_of_text|>", "<|eot_id|>", None, ("<|start_header_id|>", "<|end_header_id|>"),
                    _LLAMA_TEMPLATE),
    "qwen2": Family(None, "<|im_end|>", "<|endoftext|>", ("<|im_start|>",), _CHATML_TEMPLATE),
    "mistral": Family("<s>", "</s>", None, ("[INST]", "[/INST]"), _MISTRAL_TEMPLATE),
}

# What the tokenizer's merges are learnt from: the words of the task (any text still encodes: byte level).
_CORPUS = (
    "Q: How do I reverse a linked list in Python? Directions: give_code A: Here is a short example.",
    "Explain the principle behind gradient descent, then give an example and compare the options.",
    "Please summarize the key points of the article and give steps to follow, thank you!",
    "The answer is to iterate over the nodes and swap the next pointers; the result is the reversed list.",
    "Answer the user's request this way: give code. Other ways considered: give steps, explain the principle.",
)


def build_tokenizer(arch: str, vocab_size: int = 384) -> Any:
    """A byte-level BPE tokenizer with ``arch``'s special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    family = _family(arch)
    specials = [t for t in (family.bos, family.eos, family.pad, *family.extra_special) if t]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(list(_CORPUS) * 4, trainer)
    if family.bos is not None:  # prepend BOS to plain texts as the family's tokenizers do
        from tokenizers import processors

        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A $B", special_tokens=[
                (family.bos, tokenizer.token_to_id(family.bos))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=family.bos, eos_token=family.eos,
                                   pad_token=family.pad, additional_special_tokens=list(family.extra_special))
    if family.chat_template is not None:
        fast.chat_template = family.chat_template
    return fast


def build_tiny_model(arch: str, out: str | Path, kind: ModelKind = "causal", *, n_labels: int = 11,
                     positions: int = 512, seed: int = 0, hidden: int = 64, heads: int = 4) -> Path:
    """Write a tiny random ``arch`` model (``causal`` LM or ``reward`` sequence classifier) to ``out``.

    ``hidden`` / ``heads`` is the head size: 16 by default; GPU kernels (vLLM's) want 64 or more.
    """
    if hidden % heads or heads % 2:
        raise ValueError(f"hidden {hidden} must split into an even number of heads, got {heads}")

    family = _family(arch)
    tokenizer = build_tokenizer(arch)
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    eos_id = tokenizer.convert_tokens_to_ids(family.eos)
    bos_id = tokenizer.convert_tokens_to_ids(family.bos) if family.bos else eos_id
    pad_id = tokenizer.convert_tokens_to_ids(family.pad) if family.pad else None
    common = {"vocab_size": vocab, "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}
    if kind == "reward":
        common["num_labels"] = n_labels
    if arch == "gpt2":
        config = transformers.GPT2Config(n_positions=positions, n_embd=hidden, n_layer=2, n_head=heads, **common)
        prefix = "GPT2"
    else:
        prefix = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}[arch]
        config_class = getattr(transformers, f"{prefix}Config")
        extra = {"sliding_window": None} if arch in ("qwen2", "mistral") else {}
        config = config_class(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                              num_attention_heads=heads, num_key_value_heads=heads // 2,
                              max_position_embeddings=positions, tie_word_embeddings=True,
                              **extra, **common)
    head = "LMHeadModel" if (arch == "gpt2" and kind == "causal") else (
        "ForCausalLM" if kind == "causal" else "ForSequenceClassification")
    model = getattr(transformers, f"{prefix}{head}")(config).eval()
    if kind == "causal":
        model.generation_config.eos_token_id = eos_id
        model.generation_config.pad_token_id = pad_id if pad_id is not None else eos_id
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _family(arch: str) -> Family:
    if arch not in FAMILIES:
        raise ValueError(f"unknown architecture {arch!r}: use one of {', '.join(ARCHITECTURES)}")
    return FAMILIES[arch]


CHAR_EOS, CHAR_PAD, CHAR_UNK = "<|endoftext|>", "<|pad|>", "<|unk|>"


def build_char_policy(directory: str | Path, seed: int = 0, n_positions: int = 160) -> Path:
    """A ~0.1M-parameter GPT-2 and a character-level tokenizer (printable ASCII), saved as a model dir.

    Random weights: next-token probabilities start near uniform (vowels ~5%), so a toy reward on
    characters carries signal from the first batch (``strata bench learner``, the learner's tests).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    directory = Path(directory)
    symbols = [CHAR_EOS, CHAR_PAD, CHAR_UNK, "\n", *string.printable[:95]]  # 95 printable, space included
    vocab = {symbol: index for index, symbol in enumerate(dict.fromkeys(symbols))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=CHAR_UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=CHAR_EOS, bos_token=CHAR_EOS,
                                        pad_token=CHAR_PAD, unk_token=CHAR_UNK)  # fmt: skip
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(vocab), n_positions=n_positions, n_embd=64, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=vocab[CHAR_EOS], eos_token_id=vocab[CHAR_EOS], pad_token_id=vocab[CHAR_PAD],
    )  # fmt: skip
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
