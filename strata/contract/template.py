"""The one text template every Strata model reads and writes.

Generators see ``format_prompt(prompt, directions)`` and continue it with the response; the probe
sees ``format_probe_query(prompt)`` and continues it with direction names and a risk flag; reward
models see ``format_rm_input(prompt, response)``. The zoo's models are pretrained on exactly these
strings, and a user's own checkpoint sees the same plain text (no special tokens are required):

    Q: How do I reverse a linked list?
    Directions: give_code, give_steps
    A: Here is a short example in Python: ...<eos>

The ``Directions:`` line is omitted when no direction is given. The first direction is the one the
response follows; the others are alternatives the probe also considered.
"""

from __future__ import annotations

from collections.abc import Sequence

from strata.contract.directions import check_direction

PROMPT_PREFIX = "Q: "
DIRECTIONS_PREFIX = "Directions: "
RESPONSE_PREFIX = "A:"
RISK_PREFIX = "Risk: "
# Tokens of ``format_rm_input`` the zoo's reward models read (``ZooConfig.rm_max_length``), and the
# default for RMs trained or distilled here: the whole of nearly every answer in the zoo's task.
RM_MAX_LENGTH = 256


def _clean(text: str) -> str:
    # The template is line-based: a newline inside the prompt would look like a new field.
    return " ".join(text.split())


def format_prompt(prompt: str, directions: Sequence[str] = ()) -> str:
    """Generator input: the prompt, the directions to follow (first = main), then ``A:``.

    The model's continuation (after the trailing ``A:``) is the response; strip it and stop at EOS.
    """
    lines = [PROMPT_PREFIX + _clean(prompt)]
    if directions:
        lines.append(DIRECTIONS_PREFIX + ", ".join(check_direction(d) for d in directions))
    lines.append(RESPONSE_PREFIX)
    return "\n".join(lines)


def format_example(prompt: str, directions: Sequence[str], response: str) -> str:
    """A full training example for a generator (without the EOS token, which the tokenizer adds)."""
    return f"{format_prompt(prompt, directions)} {response.strip()}"


def format_probe_query(prompt: str) -> str:
    """Probe input: the prompt and the start of the directions line; the probe continues it."""
    return f"{PROMPT_PREFIX}{_clean(prompt)}\n{DIRECTIONS_PREFIX.rstrip()}"


def format_probe_example(prompt: str, direction: str, risk: bool) -> str:
    """A probe training example: the best direction, then the risk flag (``yes``/``no``)."""
    return f"{format_probe_query(prompt)} {check_direction(direction)}\n{RISK_PREFIX}{'yes' if risk else 'no'}"


def format_rm_input(prompt: str, response: str) -> str:
    """Reward-model input: prompt and response, no directions (the RM judges the answer only)."""
    return f"{PROMPT_PREFIX}{_clean(prompt)}\n{RESPONSE_PREFIX} {response.strip()}"
