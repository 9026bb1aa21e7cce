"""The canonical response directions (R1): what the Level-0 probe proposes and the generators follow.

One name per kind of answer a prompt can ask for. The suite's prompts each carry one of them as their
``intent``; the probe returns the top three; the generators read them from the prompt template; the
oracle checks that a response follows the prompt's intent. Add a direction here and everywhere else
follows (the suite needs prompt templates for it and the oracle marker phrases).
"""

from __future__ import annotations

from types import MappingProxyType

# name -> what it asks for, in words (used in docs and in the probe's explanations).
DIRECTIONS: MappingProxyType[str, str] = MappingProxyType(
    {
        "explain_principle": "explain the principle",
        "give_code": "give code",
        "compare_options": "compare the options",
        "give_steps": "give steps",
        "give_example": "give an example",
        "summarize": "summarize the key points",
    }
)

DIRECTION_NAMES: tuple[str, ...] = tuple(DIRECTIONS)


def check_direction(name: str) -> str:
    """Return ``name`` if it is a known direction, else raise ``ValueError`` listing the known ones."""
    if name not in DIRECTIONS:
        raise ValueError(f"unknown direction {name!r}; known: {', '.join(DIRECTION_NAMES)}")
    return name
