"""Choosing the escalation threshold (R3) from the light RM's scores against the oracle. Pure.

A Level-1 answer is a *bad case* when the oracle (or a human) scores it under a bad threshold; an
answer is escalated when the light RM scores it under the escalation threshold. Raising the
threshold catches more bad cases and escalates more good ones: :func:`operating_points` shows the
trade-off, :func:`threshold_for_catch` picks the lowest threshold that reaches a target catch rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatingPoint:
    threshold: float
    catch: float | None             # bad cases escalated / bad cases (None: no bad case)
    false_escalation: float | None  # good answers escalated / good answers (None: no good answer)
    escalated_share: float          # answers escalated / answers


def operating_point(scores: Sequence[float], bad: Sequence[bool], threshold: float) -> OperatingPoint:
    if len(scores) != len(bad) or not scores:
        raise ValueError("scores and bad flags must be non-empty and of the same length")
    escalated = [s < threshold for s in scores]
    n_bad = sum(bad)
    n_good = len(bad) - n_bad
    caught = sum(e and b for e, b in zip(escalated, bad, strict=True))
    false = sum(e and not b for e, b in zip(escalated, bad, strict=True))
    return OperatingPoint(threshold, caught / n_bad if n_bad else None, false / n_good if n_good else None,
                          sum(escalated) / len(scores))


def operating_points(scores: Sequence[float], bad: Sequence[bool], thresholds: Sequence[float]
                     ) -> list[OperatingPoint]:
    return [operating_point(scores, bad, t) for t in sorted(thresholds)]


def threshold_for_catch(scores: Sequence[float], bad: Sequence[bool], target_catch: float) -> float:
    """The lowest threshold at which at least ``target_catch`` of the bad cases score under it."""
    if not 0 < target_catch <= 1:
        raise ValueError(f"target catch rate must be in (0, 1], got {target_catch}")
    bad_scores = sorted(s for s, b in zip(scores, bad, strict=True) if b)
    if not bad_scores:
        raise ValueError("no bad case among the answers: nothing to calibrate against "
                         "(more prompts, or a higher bad threshold)")
    needed = math.ceil(target_catch * len(bad_scores) - 1e-9)
    return math.nextafter(bad_scores[needed - 1], math.inf)  # escalation is score < threshold


@dataclass(frozen=True)
class DetectionFigures:
    """A binary detector (e.g. unsafe advice) against labels."""

    items: int
    positives: int
    recall: float | None  # flagged positives / positives
    false_positive_rate: float | None  # flagged negatives / negatives
    precision: float | None  # flagged positives / flagged


def detection_figures(labels: Sequence[bool], flags: Sequence[bool]) -> DetectionFigures:
    if len(labels) != len(flags):
        raise ValueError("labels and flags must have the same length")
    positives = sum(labels)
    negatives = len(labels) - positives
    hits = sum(f and y for f, y in zip(flags, labels, strict=True))
    false = sum(f and not y for f, y in zip(flags, labels, strict=True))
    flagged = hits + false
    return DetectionFigures(len(labels), positives, hits / positives if positives else None,
                            false / negatives if negatives else None, hits / flagged if flagged else None)
