"""A generator's confidence in its own answer, as the rollout event carries it (issue 61). Pure.

Each response token's log-probability under the model's logits (``GenerationOutput.logprobs``) is
summarised twice: the mean (how sure the model was overall) and the minimum (the least likely token it
produced, where an answer tends to go wrong). Which way either points for quality is learned, not
assumed: a confident answer can be a confidently repeated one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LogprobSummary:
    mean: float
    min: float


def logprob_summary(logprobs: Sequence[float]) -> LogprobSummary | None:
    """Mean and minimum of the finite log-probabilities; None when there are none (empty response, or a
    backend that does not report them)."""
    finite = [lp for lp in logprobs if math.isfinite(lp)]
    if not finite:
        return None
    return LogprobSummary(sum(finite) / len(finite), min(finite))
