"""The request contract: one set of checks for every service's edge (gRPC servicers, Kafka workers).

The scheduler validates a submission with :func:`validate_submit` against limits that are the tiers'
own (``strata.contract.limits``, the tiers' token budgets), so that whatever the front door accepts
the tiers serve; the probe, generator and reward servicers use the same prompt and sampling checks.
Bad input gets a :class:`RequestError` naming the field; servicers turn it into INVALID_ARGUMENT.
No I/O.
"""

from __future__ import annotations

import math
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from strata.contract import limits
from strata.contract.directions import DIRECTIONS
from strata.hashing import InvalidTextError, encode_utf8
from strata.sampling import (
    Sampling,
    SamplingBounds,
    SamplingError,
    SamplingRequest,
    ValidatedSampling,
    resolve_sampling,
)
from strata.v1 import common_pb2

if TYPE_CHECKING:
    from strata.models.budget import TokenBudget
    from strata.models.prompts import PromptFormat

# Control characters that ordinary text carries; every other Cc / Cs / Co / Cn character is a sign of
# binary data (a NUL byte, a terminal escape, a surrogate) and is refused.
_ALLOWED_CONTROLS = frozenset("\t\n\r")


class RequestError(ValueError):
    """A bad request; ``field`` names the offending field."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


def check_prompt(prompt: str, max_chars: int, field: str = "prompt", max_bytes: int | None = None) -> str:
    if not prompt or not prompt.strip():
        raise RequestError(field, "must not be empty")
    if len(prompt) > max_chars:
        raise RequestError(field, f"is {len(prompt)} characters, over the limit of {max_chars}")
    try:
        size = len(encode_utf8(prompt))
    except InvalidTextError as exc:
        raise RequestError(field, str(exc)) from exc
    if max_bytes is not None and size > max_bytes:
        raise RequestError(field, f"is {size} bytes in UTF-8, over the limit of {max_bytes}")
    for position, char in enumerate(prompt):
        if char not in _ALLOWED_CONTROLS and unicodedata.category(char) in ("Cc", "Cs", "Co", "Cn"):
            raise RequestError(
                field, f"contains a control or non-text character (U+{ord(char):04X} at position {position}); "
                "binary data is not a prompt"
            )
    return prompt


def check_directions(names: list[str], field: str = "directions", prompt_format: PromptFormat | None = None
                     ) -> tuple[str, ...]:
    """Directions a model can be given: the canonical set, or, for a ``prompt_format`` with a chat template
    (``strata.models.prompts.PromptFormat``), any well-formed name (a user's probe head proposes its own)."""
    for index, name in enumerate(names):
        if prompt_format is not None:
            try:
                prompt_format.check_directions([name])
            except ValueError as exc:
                raise RequestError(f"{field}[{index}].name", str(exc)) from exc
        elif name not in DIRECTIONS:
            raise RequestError(f"{field}[{index}].name", f"unknown direction {name!r}; known: {', '.join(DIRECTIONS)}")
    return tuple(names)


def check_rollout_dropout(dropout: float | None, supported: bool) -> None:
    """Refuse rollout dropout (R17) that the serving model would silently ignore (0 asks for none)."""
    if dropout and not supported:
        raise RequestError("sampling.rollout_dropout", "this generator cannot keep dropout on during rollout (vLLM "
                           "backend, or a model without dropout layers); leave it unset")


def check_n_samples(n_samples: int, limit: int) -> int:
    n = n_samples or 1
    if n > limit:
        raise RequestError("n_samples", f"must be at most {limit}, got {n}")
    return n


def resolve_requested(requested: SamplingRequest, defaults: Sampling, bounds: SamplingBounds) -> ValidatedSampling:
    """``requested`` with unset values from ``defaults``, checked against the R16 bounds."""
    try:
        return resolve_sampling(
            defaults, bounds, temperature=requested.temperature, top_p=requested.top_p,
            max_new_tokens=requested.max_new_tokens, seed=requested.seed, rollout_dropout=requested.rollout_dropout,
        )
    except SamplingError as exc:
        raise RequestError(exc.field, exc.problem) from exc


def check_sampling(requested: SamplingRequest, bounds: SamplingBounds) -> SamplingRequest:
    """The values a request set, checked against the R16 bounds; unset ones stay unset (the tier's
    defaults apply where the rollout is served)."""
    resolve_requested(requested, Sampling(), bounds)
    return requested


# -- a submission at the front door -------------------------------------------------------------------

@dataclass(frozen=True)
class SubmitLimits:
    """What one submission may ask for: the scheduler's settings, defaulting to the tiers' contract."""

    max_prompt_chars: int = limits.MAX_PROMPT_CHARS
    max_prompt_bytes: int = 64 * 1024
    max_n_samples: int = limits.MAX_N_SAMPLES
    default_n_samples: int = 4
    max_request_id_chars: int = 128
    bounds: SamplingBounds = field(default_factory=SamplingBounds)


@dataclass(frozen=True)
class PromptRequest:
    """One prompt submission after validation."""

    prompt: str
    sampling: SamplingRequest
    n_samples: int  # resolved: 0 in the request becomes default_n_samples
    request_id: str


def validate_submit(
    prompt: str, sampling: SamplingRequest, n_samples: int, request_id: str, submit_limits: SubmitLimits,
    budgets: Sequence[TokenBudget] = (),
) -> PromptRequest:
    """The submission as the scheduler will use it, or :class:`RequestError` for the first bad field.

    ``budgets``: the tiers' models; the prompt, with its ``max_new_tokens``, must fit each of them.
    """
    lim = submit_limits
    check_prompt(prompt, lim.max_prompt_chars, max_bytes=lim.max_prompt_bytes)
    check_sampling(sampling, lim.bounds)
    max_new_tokens = sampling.max_new_tokens or limits.DEFAULT_MAX_NEW_TOKENS
    for budget in budgets:
        if (problem := budget.problem(prompt, max_new_tokens)) is not None:
            raise RequestError("prompt", problem)
    if n_samples < 0 or n_samples > lim.max_n_samples:
        raise RequestError("n_samples", f"{n_samples} is out of range; must be in [0, {lim.max_n_samples}] "
                           f"(0 means the default, {lim.default_n_samples})")
    if len(request_id) > lim.max_request_id_chars:
        raise RequestError("request_id", f"is {len(request_id)} characters, over {lim.max_request_id_chars}")
    if any(unicodedata.category(c) == "Cc" for c in request_id):
        raise RequestError("request_id", "contains control characters")
    # Every accepted submission is its own request: downstream idempotency keys include this id,
    # so a client retry with the same id is deduplicated and two plain submits are not.
    return PromptRequest(prompt, sampling, n_samples or lim.default_n_samples, request_id or uuid.uuid4().hex)


# -- protobuf ------------------------------------------------------------------------------------------

_FLOAT32_FIELDS = ("temperature", "top_p", "rollout_dropout")


def _as_sent(value: float) -> float:
    """A float32 wire value as the client wrote it: 0.3 arrives as 0.30000001192..., which would pass
    a "> 0.3" bound the client did not mean to pass; float32 holds 7 significant digits."""
    return float(f"{value:.7g}") if math.isfinite(value) else value


def requested_sampling(message: common_pb2.SamplingParams) -> SamplingRequest:
    def opt(name: str) -> float | int | None:
        if not message.HasField(name):
            return None
        value = getattr(message, name)
        return _as_sent(value) if name in _FLOAT32_FIELDS else value

    return SamplingRequest(opt("temperature"), opt("top_p"), opt("max_new_tokens"),  # type: ignore[arg-type]
                           opt("seed"), opt("rollout_dropout"))  # type: ignore[arg-type]


def sampling_from_proto(
    message: common_pb2.SamplingParams, defaults: Sampling, bounds: SamplingBounds
) -> ValidatedSampling:
    """Resolve a ``SamplingParams`` message against the deployment's defaults and R16 bounds."""
    return resolve_requested(requested_sampling(message), defaults, bounds)


def sampling_to_proto(sampling: Sampling | SamplingRequest) -> common_pb2.SamplingParams:
    """Set fields only: a request's unset values stay unset on the wire (the tier's defaults apply)."""
    message = common_pb2.SamplingParams()
    for name in ("temperature", "top_p", "max_new_tokens", "seed", "rollout_dropout"):
        value = getattr(sampling, name)
        if value is not None:
            setattr(message, name, value)
    return message
