"""Checks on what users submit. Pure: every problem is an :class:`InvalidField` naming the field.

The servicer turns an ``InvalidField`` into ``INVALID_ARGUMENT`` with ``"<field>: <problem>"``.
Sampling bounds are the generator's (R16): temperature > ``min_temperature`` and
top_p < ``max_top_p``, so that a prompt the scheduler accepts is never refused further down.
"""

from __future__ import annotations

import math
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata.contract import limits
from svc_scheduler.settings import SchedulerSettings

if TYPE_CHECKING:
    from strata.models.budget import TokenBudget

# Control characters that ordinary text carries; every other Cc / Cs / Co / Cn character is a sign of
# binary data (a NUL byte, a terminal escape, a surrogate) and is refused.
_ALLOWED_CONTROLS = frozenset("\t\n\r")


class InvalidField(ValueError):
    """A request field is out of bounds."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters as the request gave them (None: the generator's default)."""

    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    rollout_dropout: float | None = None


@dataclass(frozen=True)
class PromptRequest:
    """One prompt submission after validation."""

    prompt: str
    sampling: Sampling
    n_samples: int  # resolved: 0 in the request becomes default_n_samples
    request_id: str


def check_prompt(prompt: str, settings: SchedulerSettings, field: str = "prompt") -> None:
    if not prompt or not prompt.strip():
        raise InvalidField(field, "must not be empty")
    if len(prompt) > settings.max_prompt_chars:
        raise InvalidField(field, f"is {len(prompt)} characters, over the limit of {settings.max_prompt_chars}")
    try:
        size = len(prompt.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidField(field, f"is not valid Unicode (position {exc.start}: {exc.reason})") from exc
    limit = min(settings.max_prompt_bytes, settings.content_max_bytes)
    if size > limit:
        raise InvalidField(field, f"is {size} bytes in UTF-8, over the limit of {limit}")
    for position, char in enumerate(prompt):
        if char not in _ALLOWED_CONTROLS and unicodedata.category(char) in ("Cc", "Cs", "Co", "Cn"):
            raise InvalidField(
                field, f"contains a control or non-text character (U+{ord(char):04X} at position {position}); "
                "binary data is not a prompt"
            )


def check_sampling(sampling: Sampling, settings: SchedulerSettings, field: str = "sampling") -> None:
    t, p = sampling.temperature, sampling.top_p
    if t is not None and (not math.isfinite(t) or not settings.min_temperature < t <= settings.max_temperature):
        raise InvalidField(
            f"{field}.temperature",
            f"{t:g} is out of range; must be > {settings.min_temperature:g} and <= {settings.max_temperature:g} (R16)",
        )
    if p is not None and (not math.isfinite(p) or not 0.0 < p < settings.max_top_p):
        raise InvalidField(f"{field}.top_p", f"{p:g} is out of range; must be > 0 and < {settings.max_top_p:g} (R16)")
    if sampling.max_new_tokens is not None and not 1 <= sampling.max_new_tokens <= settings.max_new_tokens_limit:
        raise InvalidField(
            f"{field}.max_new_tokens",
            f"{sampling.max_new_tokens} is out of range; must be in [1, {settings.max_new_tokens_limit}]",
        )
    d = sampling.rollout_dropout
    if d is not None and (not math.isfinite(d) or not 0.0 <= d < 1.0):
        raise InvalidField(f"{field}.rollout_dropout", f"{d:g} is out of range; must be in [0, 1)")


def validate(
    prompt: str, sampling: Sampling, n_samples: int, request_id: str, settings: SchedulerSettings,
    budgets: Sequence[TokenBudget] = (),
) -> PromptRequest:
    """The request as the scheduler will use it, or :class:`InvalidField` for the first bad field.

    ``budgets``: the tiers' models; the prompt, with its ``max_new_tokens``, must fit each of them.
    """
    check_prompt(prompt, settings)
    check_sampling(sampling, settings)
    max_new_tokens = sampling.max_new_tokens or limits.DEFAULT_MAX_NEW_TOKENS
    for budget in budgets:
        if (problem := budget.problem(prompt, max_new_tokens)) is not None:
            raise InvalidField("prompt", problem)
    if n_samples < 0 or n_samples > settings.max_n_samples:
        raise InvalidField("n_samples", f"{n_samples} is out of range; must be in [0, {settings.max_n_samples}] "
                           f"(0 means the default, {settings.default_n_samples})")
    if len(request_id) > settings.max_request_id_chars:
        raise InvalidField("request_id", f"is {len(request_id)} characters, over {settings.max_request_id_chars}")
    if any(unicodedata.category(c) == "Cc" for c in request_id):
        raise InvalidField("request_id", "contains control characters")
    # Every accepted submission is its own request: downstream idempotency keys include this id,
    # so a client retry with the same id is deduplicated and two plain submits are not.
    return PromptRequest(prompt, sampling, n_samples or settings.default_n_samples, request_id or uuid.uuid4().hex)
