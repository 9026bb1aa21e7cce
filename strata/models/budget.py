"""How much of a prompt a tier's model can read: its positions, and the prompt in its tokens.

A generator feeds its model's prompt text (``PromptFormat.generator_text``: the chat template when
the tokenizer has one, else ``format_prompt``) and then ``max_new_tokens`` more positions;
a prompt for which that does not fit fails inside the model (position index out of range). The
scheduler checks it at the door with the tiers' own tokenizers, so that a prompt it accepts is one
both tiers can serve (issue 22). Directions are counted at their worst: ``MAX_DIRECTIONS`` of the
longest names, as many as the probe may return.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig, AutoTokenizer

from strata.contract.directions import DIRECTION_NAMES
from strata.models.prompts import PromptFormat, model_positions
from strata.models.tokens import tokenizer_id

MAX_DIRECTIONS = 3  # the probe's top_k (R1)


@dataclass(frozen=True)
class TokenBudget:
    """One tier's model: its name (for messages), positions and tokenizer."""

    name: str
    n_positions: int
    tokenizer: Any
    directions: tuple[str, ...]  # the longest directions line the probe can produce, in tokens
    format: PromptFormat

    def reads_like(self, other: TokenBudget) -> bool:
        """Same positions, vocabulary and template: one check of a prompt serves both models."""
        return (self.n_positions == other.n_positions and tokenizer_id(self.tokenizer) == tokenizer_id(other.tokenizer)
                and getattr(self.tokenizer, "chat_template", None) == getattr(other.tokenizer, "chat_template", None))

    @classmethod
    def of_model(cls, name: str, model_dir: str | Path) -> TokenBudget:
        """Read the tokenizer and the position count of a local model directory (no weights)."""
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        positions = model_positions(config)
        if not positions:
            raise ValueError(f"{model_dir}: its config names no position limit (n_positions, max_position_embeddings)")
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        prompt_format = PromptFormat.of(tokenizer)
        return cls(name, int(positions), tokenizer, _worst_directions(prompt_format), prompt_format)

    def prompt_tokens(self, prompt: str, directions: Sequence[str] | None = None) -> int:
        """Tokens the generator feeds for ``prompt`` with ``directions`` (None: the longest the probe may add)."""
        chosen = self.directions if directions is None else tuple(directions)
        return len(self.format.prompt_ids(prompt, chosen))

    def problem(self, prompt: str, max_new_tokens: int, directions: Sequence[str] | None = None) -> str | None:
        """Why ``prompt`` cannot be served with ``max_new_tokens`` new tokens, or None when it can."""
        needed = self.prompt_tokens(prompt, directions) + max_new_tokens
        if needed <= self.n_positions:
            return None
        return (f"needs {needed} positions of the {self.name} model ({needed - max_new_tokens} prompt tokens with "
                f"the template + max_new_tokens {max_new_tokens}); it reads {self.n_positions}: shorten the "
                "prompt or ask for fewer new tokens")


def _worst_directions(prompt_format: PromptFormat) -> tuple[str, ...]:
    """The directions line with the most tokens the probe may return: the longest canonical names, or
    for a chat template (which takes a user's probe-head names too) the longest names allowed."""
    def cost(names: tuple[str, ...]) -> int:
        return len(prompt_format.prompt_ids("", names))

    longest = tuple(sorted(DIRECTION_NAMES, key=lambda d: cost((d,)), reverse=True)[:MAX_DIRECTIONS])
    if not prompt_format.chat:
        return longest
    # A user's names are words too: the longest canonical names' words, repeated up to the 48 characters
    # a name may have.
    widest = tuple(_stretch(name) for name in longest)
    return max(longest, widest, key=cost)


def _stretch(name: str, limit: int = 48) -> str:
    words = name.split("_")
    stretched: list[str] = []
    while len("_".join([*stretched, words[len(stretched) % len(words)]])) <= limit:
        stretched.append(words[len(stretched) % len(words)])
    return "_".join(stretched)
