"""Sampling parameters: defaults, and the R16 validation every entry point applies.

The article's repetition check (R16) found greedy-ish sampling behind most collapsed rollouts: Strata
requires temperature > 0.3 and top_p < 0.95 by default. Out-of-range values are rejected with an
error naming the field, or, where the deployment allows it, accepted with a warning.
Pure: no I/O, no protobuf (the servicers convert ``SamplingParams`` messages at the edge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from strata.contract import limits


class SamplingError(ValueError):
    """An invalid sampling value; ``field`` names it (e.g. ``sampling.temperature``)."""

    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")
        self.field = field_name
        self.problem = problem


@dataclass(frozen=True)
class SamplingBounds:
    min_temperature: float = limits.MIN_TEMPERATURE   # exclusive (R16)
    max_temperature: float = limits.MAX_TEMPERATURE   # inclusive
    max_top_p: float = limits.MAX_TOP_P               # exclusive (R16)
    max_new_tokens_limit: int = limits.MAX_NEW_TOKENS
    allow_out_of_range: bool = False   # accept R16 violations with a warning instead of rejecting


@dataclass(frozen=True)
class Sampling:
    """Resolved sampling parameters of one rollout request."""

    temperature: float = 0.8
    top_p: float = 0.9
    max_new_tokens: int = 64
    seed: int | None = None
    rollout_dropout: float | None = None   # dropout kept on during rollout (R17); None = off


@dataclass(frozen=True)
class SamplingRequest:
    """Sampling parameters as a request gave them; None: the serving tier's default."""

    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    rollout_dropout: float | None = None


@dataclass(frozen=True)
class ValidatedSampling:
    sampling: Sampling
    warnings: tuple[str, ...] = field(default_factory=tuple)


def resolve_sampling(
    defaults: Sampling,
    bounds: SamplingBounds,
    temperature: float | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
    seed: int | None = None,
    rollout_dropout: float | None = None,
    prefix: str = "sampling.",
) -> ValidatedSampling:
    """Fill unset values from ``defaults`` and check them; raises :class:`SamplingError`."""
    resolved = Sampling(
        temperature=defaults.temperature if temperature is None else float(temperature),
        top_p=defaults.top_p if top_p is None else float(top_p),
        max_new_tokens=defaults.max_new_tokens if max_new_tokens is None else int(max_new_tokens),
        seed=defaults.seed if seed is None else int(seed),
        rollout_dropout=defaults.rollout_dropout if rollout_dropout is None else float(rollout_dropout),
    )
    warnings: list[str] = []

    def hard(name: str, ok: bool, problem: str) -> None:
        if not ok:
            raise SamplingError(prefix + name, problem)

    def soft(name: str, ok: bool, problem: str) -> None:
        if ok:
            return
        if not bounds.allow_out_of_range:
            raise SamplingError(prefix + name, problem + " (R16; the deployment may allow it with a warning)")
        warnings.append(f"{prefix}{name}: {problem}")

    t, p = resolved.temperature, resolved.top_p
    hard("temperature", math.isfinite(t) and t > 0, f"must be a finite number > 0, got {t}")
    hard("temperature", t <= bounds.max_temperature, f"must be <= {bounds.max_temperature}, got {t}")
    soft("temperature", t > bounds.min_temperature,
         f"must be > {bounds.min_temperature}, got {t}: low temperatures collapse rollouts into repetition")
    hard("top_p", math.isfinite(p) and 0 < p <= 1, f"must be in (0, 1], got {p}")
    soft("top_p", p < bounds.max_top_p, f"must be < {bounds.max_top_p}, got {p}")
    hard("max_new_tokens", 1 <= resolved.max_new_tokens <= bounds.max_new_tokens_limit,
         f"must be in [1, {bounds.max_new_tokens_limit}], got {resolved.max_new_tokens}")
    if resolved.rollout_dropout is not None:
        d = resolved.rollout_dropout
        hard("rollout_dropout", math.isfinite(d) and 0 <= d < 1, f"must be in [0, 1), got {d}")
    if resolved.seed is not None:
        hard("seed", 0 <= resolved.seed < 2**63, f"must be in [0, 2^63), got {resolved.seed}")
    return ValidatedSampling(resolved, tuple(warnings))
