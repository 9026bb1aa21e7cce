"""What the reward service's own audit adds to ``strata.audit``: which Level-1 answers the strong RM
audits (drawn by hash) and when the strong RM calls one bad. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Callable

from strata.hashing import stable_fraction


def strong_calls_bad(strong: float, bad_below: float | None, threshold: float,
                     on_threshold_scale: Callable[[float], float] | None = None) -> bool:
    """Whether the strong RM's reward marks an audited answer bad: under ``bad_below`` where one is set;
    else under the escalation threshold the light RM's rule is served with (``threshold``), the strong
    score mapped onto that threshold's scale (``on_threshold_scale``: the light RM's calibration, when the
    threshold is on the calibrated scale): "the strong RM's own score would have escalated it". The light
    RM is distilled onto the strong RM's scale, so their raw scores compare."""
    if bad_below is not None:
        return strong < bad_below
    return (on_threshold_scale(strong) if on_threshold_scale is not None else strong) < threshold


def sampled_for_audit(response_hash: str, share: float) -> bool:
    """Whether a Level-1 answer is audited: drawn from its hash, so a redelivery and every replica agree."""
    if share <= 0:
        return False
    return stable_fraction(f"audit:{response_hash}") < share
