"""Thresholds and score calibrations measured on labelled answers, before they are served (R3). Pure.

What ``strata calibrate escalation`` / ``unsafe`` and the RM refresh loop compute; the reward service
serves their result (``svc_reward.calibrate``) and needs none of this.

A Level-1 answer is a *bad case* when the oracle (or a human) scores it under a bad threshold; an
answer is escalated when the light RM scores it under the escalation threshold. Raising the
threshold catches more bad cases and escalates more good ones: :func:`operating_points` shows the
trade-off, :func:`threshold_for_catch` picks the lowest threshold that reaches a target catch rate.
:func:`detection_figures` measures a binary detector (the unsafe-advice one) against labels.

The light RM's raw score is not on the oracle's scale: :func:`fit_isotonic` fits a monotone map
(``svc_reward.calibrate.ScoreCalibration``) from one to the other on labelled answers, so that the
threshold is a score on the scale people read.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from svc_reward.calibrate import SCORE_RANGE, ScoreCalibration


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


def printable_threshold(threshold: float) -> float:
    """``threshold`` rounded *up* to the 3 decimals printed: escalation is ``score < threshold``, and a
    threshold just above a bad case's score, rounded down, would no longer catch it (nor, on the
    calibrated scale, every answer tied with it at a flat end of the map)."""
    printed = math.ceil(threshold * 1000) / 1000
    while printed < threshold:  # x * 1000 can round down in floating point
        printed = round(printed + 0.001, 3)
    return printed


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


# --- The light RM's raw score on the oracle's scale ------------------------------------------------

def fit_isotonic(scores: Sequence[float], targets: Sequence[float], *, checksum: str = "", source: str = "",
                 now: float | None = None, temperature: float | None = None,
                 aggregation: str | None = None) -> ScoreCalibration:
    """The non-decreasing least-squares fit of ``targets`` (oracle, 0-5) on ``scores`` (raw RM).

    Pool-adjacent-violators over the pairs sorted by score, equal scores pooled first into one
    weighted point. Adjacent blocks with equal means are pooled too, so the knots (each block's
    weighted mean score and mean target) are strictly increasing and interpolating between them is
    strictly increasing inside the knots' range: the calibrated score orders answers as the raw one
    does (the knots of centered isotonic regression, Oron & Flournoy 2017, not sklearn's steps).
    ``temperature`` and ``aggregation``: how the RM computed ``scores`` (see ScoreCalibration).
    """
    if not scores or len(scores) != len(targets):
        raise ValueError(f"scores and targets must be non-empty and of the same length, got {len(scores)} "
                         f"and {len(targets)}")
    if not all(math.isfinite(v) for v in (*scores, *targets)):
        raise ValueError("scores and targets must be finite numbers")
    low, high = SCORE_RANGE
    if not all(low <= t <= high for t in targets):
        raise ValueError(f"targets must lie on the oracle's scale [{low:g}, {high:g}]")
    by_score: dict[float, list[float]] = {}
    for s, t in zip(scores, targets, strict=True):
        by_score.setdefault(float(s), []).append(float(t))
    if len(by_score) < 2:
        raise ValueError(f"all {len(scores)} answers have the same score: at least 2 distinct scores are needed "
                         "to fit a calibration")
    # Blocks as [weight, sum of scores, sum of targets, lowest score, highest score]; a new point is
    # merged back into the block before it while that block's mean target is not below its own.
    blocks: list[list[float]] = []
    for s in sorted(by_score):
        ts = by_score[s]
        blocks.append([float(len(ts)), s * len(ts), sum(ts), s, s])
        while len(blocks) > 1 and blocks[-2][2] / blocks[-2][0] >= blocks[-1][2] / blocks[-1][0]:
            w, ss, st, _, hi = blocks.pop()
            blocks[-1][0] += w
            blocks[-1][1] += ss
            blocks[-1][2] += st
            blocks[-1][4] = hi
    # Clamped to where the mathematics puts them, against rounding: within the block's own scores
    # (so the knots stay strictly increasing), and on the 0-5 scale.
    raw = tuple(min(hi, max(lo, ss / w)) for w, ss, _, lo, hi in blocks)
    calibrated = tuple(min(high, max(low, st / w)) for w, _, st, _, _ in blocks)
    return ScoreCalibration(raw, calibrated, len(scores), checksum, source, time.time() if now is None else now,
                            temperature, aggregation)


def mean_absolute_error(predicted: Sequence[float], targets: Sequence[float]) -> float:
    if not predicted or len(predicted) != len(targets):
        raise ValueError("predicted and targets must be non-empty and of the same length")
    return sum(abs(p - t) for p, t in zip(predicted, targets, strict=True)) / len(predicted)


def cross_validated_error(scores: Sequence[float], targets: Sequence[float], folds: int = 5, seed: int = 0
                          ) -> float | None:
    """Mean absolute error of :func:`fit_isotonic` on answers it was not fitted on: each of ``folds``
    shuffled parts is predicted by the fit on the others. The in-sample error flatters the fit (each
    knot is a mean of its own targets). None when no fold could be fitted (too few distinct scores)."""
    if len(scores) != len(targets) or folds < 2:
        raise ValueError("scores and targets must have the same length, and folds be >= 2")
    order = list(range(len(scores)))
    random.Random(seed).shuffle(order)
    errors: list[float] = []
    for k in range(folds):
        held = set(order[k::folds])
        train = [i for i in order if i not in held]
        try:
            fit = fit_isotonic([scores[i] for i in train], [targets[i] for i in train], now=0.0)
        except ValueError:  # this fold's training part has fewer than 2 distinct scores
            continue
        errors.extend(abs(fit.apply(scores[i]) - targets[i]) for i in held)
    return sum(errors) / len(errors) if errors else None
