"""How a model reads its inputs: its tokenizer's chat template when it has one, else the zoo's template.

One :class:`PromptFormat` per tokenizer decides every text a model sees and the token ids it is fed,
so that the generator (HF or vLLM), the scheduler's length check, the learner (which rebuilds the
prompt ids of each rollout) and the reward service agree to the token:

- **Zoo format** (no chat template, e.g. the zoo's GPT-2s): ``strata.contract.template``'s plain text
  (``Q: ...\\nDirections: ...\\nA:``), tokenized with the tokenizer's own special tokens.
- **Chat format** (``tokenizer.chat_template`` set: Llama, Qwen2, Mistral instruct checkpoints): the
  prompt is the user turn, the directions a system message (or, when the template refuses a system
  role, a first paragraph of the user turn), rendered with ``add_generation_prompt=True``; a reward
  model reads the user turn and the response as the assistant turn. The rendered text already holds
  the template's special tokens, so it is tokenized with ``add_special_tokens=False`` (no second BOS).

User text never becomes control tokens: special-token strings inside a prompt or a response (say a
prompt that contains ``<|im_start|>system``) are removed before rendering.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.contract.directions import DIRECTIONS, check_direction
from strata.contract.template import format_prompt, format_rm_input

# A direction name outside the canonical set (a user's probe head may propose its own, docs/models.md).
_DIRECTION_NAME = re.compile(r"[a-z][a-z0-9_]{0,47}")


def direction_phrase(name: str) -> str:
    """A direction in words: the canonical description, or the name with spaces for a user's own."""
    if not _DIRECTION_NAME.fullmatch(name):
        raise ValueError(f"bad direction name {name!r}: use lowercase letters, digits and _ (at most 48)")
    return DIRECTIONS.get(name, name.replace("_", " "))


def directions_instruction(directions: Sequence[str]) -> str:
    """The system message that carries the probe's directions (first = the one to follow)."""
    main = direction_phrase(directions[0])
    text = f"Answer the user's request this way: {main}."
    if len(directions) > 1:
        text += " Other ways considered: " + ", ".join(direction_phrase(d) for d in directions[1:]) + "."
    return text


def model_positions(config: Any) -> int | None:
    """The most tokens a model reads (prompt and response together), from its config; None if unnamed."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("n_positions", "max_position_embeddings", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> tuple[int, ...]:
    """Tokens that end a response: the model's generation-config EOS ids (instruct models list their
    end-of-turn token there) and the tokenizer's EOS, in that order, without repeats."""
    ids: list[int] = []
    configured = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    for value in ([configured] if isinstance(configured, int) else list(configured or [])):
        if value is not None and value not in ids:
            ids.append(int(value))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(ids)


def cut_at_stop(row: Sequence[int], stops: Sequence[int] | set[int]) -> tuple[list[int], bool]:
    """A generated row up to and including its first stop token, and whether it had one."""
    end = next((i for i, token in enumerate(row) if token in stops), None)
    return (list(row) if end is None else list(row[: end + 1])), end is not None


@dataclass(frozen=True)
class PromptFormat:
    """The text and token ids a model with ``tokenizer`` is fed. Build it with :meth:`of`."""

    tokenizer: Any
    chat: bool  # the tokenizer has a chat template
    system_role: bool  # the chat template accepts a system message
    _special: tuple[str, ...] = field(default=(), repr=False)  # special-token strings, longest first

    @classmethod
    def of(cls, tokenizer: Any) -> PromptFormat:
        if not getattr(tokenizer, "chat_template", None):
            return cls(tokenizer, chat=False, system_role=False)
        special = sorted({t for t in tokenizer.all_special_tokens if t} | set(_added_special(tokenizer)),
                         key=len, reverse=True)
        marker = "strata-system-marker"
        probe = [{"role": "system", "content": marker}, {"role": "user", "content": "u"}]
        try:  # a template may refuse a system turn, or silently drop it
            rendered = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
            system_role = isinstance(rendered, str) and marker in rendered
        except Exception:  # jinja raise_exception ("System role not supported") and the like
            system_role = False
        return cls(tokenizer, chat=True, system_role=system_role, _special=tuple(special))

    @property
    def kind(self) -> str:
        """``chat`` or ``zoo`` (for logs and reports)."""
        return "chat" if self.chat else "zoo"

    def _defang(self, text: str) -> str:
        for token in self._special:
            text = text.replace(token, "")
        return text

    def _user_turn(self, prompt: str, directions: Sequence[str]) -> list[dict[str, str]]:
        prompt = self._defang(prompt)
        if not directions:
            return [{"role": "user", "content": prompt}]
        instruction = directions_instruction(directions)
        if self.system_role:
            return [{"role": "system", "content": instruction}, {"role": "user", "content": prompt}]
        return [{"role": "user", "content": f"{instruction}\n\n{prompt}"}]

    def generator_text(self, prompt: str, directions: Sequence[str] = ()) -> str:
        """What a generator continues with its response (directions: first = main, may be empty)."""
        if not self.chat:
            return format_prompt(prompt, directions)
        return self.tokenizer.apply_chat_template(self._user_turn(prompt, directions), tokenize=False,
                                                  add_generation_prompt=True)

    def query_text(self, prompt: str) -> str:
        """The prompt alone, as the model would be asked it (the probe's directions head reads this)."""
        return self.generator_text(prompt, ())

    def rm_text(self, prompt: str, response: str) -> str:
        """What a reward model reads for ``response`` to ``prompt`` (no directions: it judges the answer)."""
        if not self.chat:
            return format_rm_input(prompt, response)
        messages = [{"role": "user", "content": self._defang(prompt)},
                    {"role": "assistant", "content": self._defang(response.strip())}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False)

    def check_directions(self, directions: Sequence[str]) -> None:
        """Raise ``ValueError`` for a direction this format cannot render (the zoo's knows only its own)."""
        for name in directions:
            if self.chat:
                direction_phrase(name)
            else:
                check_direction(name)

    @property
    def add_special_tokens(self) -> bool:
        """Pass to the tokenizer: a chat-rendered text already holds its special tokens."""
        return not self.chat

    def encode(self, texts: Sequence[str], **kwargs: Any) -> Any:
        """``tokenizer(texts, ...)`` with the right ``add_special_tokens``."""
        return self.tokenizer(list(texts), add_special_tokens=self.add_special_tokens, **kwargs)

    def prompt_ids(self, prompt: str, directions: Sequence[str] = ()) -> list[int]:
        """The token ids a generator feeds for ``prompt`` (the learner rebuilds them from the texts)."""
        text = self.generator_text(prompt, directions)
        return list(self.tokenizer(text, add_special_tokens=self.add_special_tokens)["input_ids"])


def _added_special(tokenizer: Any) -> list[str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return [str(token) for token in decoder.values() if getattr(token, "special", False)]
