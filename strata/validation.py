"""Request checks and conversions shared by every service's edge (gRPC servicers, Kafka workers).

Bad input gets a :class:`RequestError` naming the field; servicers turn it into INVALID_ARGUMENT.
No I/O.
"""

from __future__ import annotations

from strata.contract.directions import DIRECTIONS
from strata.hashing import InvalidTextError, encode_utf8
from strata.sampling import Sampling, SamplingBounds, SamplingError, ValidatedSampling, resolve_sampling
from strata.v1 import common_pb2


class RequestError(ValueError):
    """A bad request; ``field`` names the offending field."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


def check_prompt(prompt: str, max_chars: int, field: str = "prompt") -> str:
    if not prompt or not prompt.strip():
        raise RequestError(field, "must not be empty")
    if len(prompt) > max_chars:
        raise RequestError(field, f"is {len(prompt)} characters, over the limit of {max_chars}")
    if "\x00" in prompt:
        raise RequestError(field, "contains NUL bytes (binary data is not a prompt)")
    try:
        encode_utf8(prompt)
    except InvalidTextError as exc:
        raise RequestError(field, str(exc)) from exc
    return prompt


def check_directions(names: list[str], field: str = "directions") -> tuple[str, ...]:
    for index, name in enumerate(names):
        if name not in DIRECTIONS:
            raise RequestError(f"{field}[{index}].name", f"unknown direction {name!r}; known: {', '.join(DIRECTIONS)}")
    return tuple(names)


def check_n_samples(n_samples: int, limit: int) -> int:
    n = n_samples or 1
    if n > limit:
        raise RequestError("n_samples", f"must be at most {limit}, got {n}")
    return n


def sampling_from_proto(
    message: common_pb2.SamplingParams, defaults: Sampling, bounds: SamplingBounds
) -> ValidatedSampling:
    """Resolve a ``SamplingParams`` message against the deployment's defaults and R16 bounds."""

    def opt(name: str) -> float | int | None:
        return getattr(message, name) if message.HasField(name) else None

    try:
        return resolve_sampling(
            defaults, bounds, temperature=opt("temperature"), top_p=opt("top_p"),
            max_new_tokens=opt("max_new_tokens"), seed=opt("seed"), rollout_dropout=opt("rollout_dropout"),
        )
    except SamplingError as exc:
        raise RequestError(exc.field, exc.problem) from exc


def sampling_to_proto(sampling: Sampling) -> common_pb2.SamplingParams:
    message = common_pb2.SamplingParams(
        temperature=sampling.temperature, top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens
    )
    if sampling.seed is not None:
        message.seed = sampling.seed
    if sampling.rollout_dropout is not None:
        message.rollout_dropout = sampling.rollout_dropout
    return message
