"""Choosing the escalation threshold (R3) from the light RM's scores against the oracle. Pure.

A Level-1 answer is a *bad case* when the oracle (or a human) scores it under a bad threshold; an
answer is escalated when the light RM scores it under the escalation threshold. Raising the
threshold catches more bad cases and escalates more good ones: :func:`operating_points` shows the
trade-off, :func:`threshold_for_catch` picks the lowest threshold that reaches a target catch rate.

The light RM's raw score is not on the oracle's scale: :func:`fit_isotonic` fits a monotone map
(:class:`ScoreCalibration`) from one to the other on labelled answers, so that the threshold is a
score on the scale people read.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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

SCORE_RANGE = (0.0, 5.0)  # the oracle's (and a human's) scale


@dataclass(frozen=True)
class ScoreCalibration:
    """A monotone map from the light RM's raw score to the oracle's 0-5 scale, fitted for one RM version.

    Knots ``(raw[i], calibrated[i])``: linear between them, flat beyond the first and the last. Built
    by :func:`fit_isotonic`; stored beside the RM's weights and in the registry (``to_dict``).
    """

    raw: tuple[float, ...]         # strictly increasing
    calibrated: tuple[float, ...]  # non-decreasing, in [0, 5]
    answers: int                   # labelled answers it was fitted on
    checksum: str                  # weights_checksum of the RM it was fitted for ("" if unknown)
    source: str                    # where the labels came from, for people
    fitted_at: float               # unix seconds
    # How the raw scores were computed: a score at another temperature or aggregation is on another
    # scale, so serving uses the calibration only with the same ones (None: not recorded, not checked).
    temperature: float | None = None
    aggregation: str | None = None  # of an ensemble's members
    # The escalation threshold chosen with it (`strata calibrate escalation --write`): on the calibrated
    # scale, the lowest that escalates ``target_catch`` of the labelled answers the oracle scored under
    # ``bad_threshold``. Served wherever no threshold is set, so that a version brings its own.
    escalation_threshold: float | None = None
    target_catch: float | None = None
    bad_threshold: float | None = None

    def __post_init__(self) -> None:
        raw, calibrated = self.raw, self.calibrated
        if not raw:
            raise ValueError("raw: at least one knot is needed")
        if len(calibrated) != len(raw):
            raise ValueError(f"calibrated: {len(calibrated)} values for {len(raw)} raw knots")
        for name, values in (("raw", raw), ("calibrated", calibrated)):
            if not all(_finite_number(v) for v in values):
                raise ValueError(f"{name}: every knot must be a finite number")
        if any(b <= a for a, b in itertools.pairwise(raw)):
            raise ValueError("raw: knots must be strictly increasing")
        if any(b < a for a, b in itertools.pairwise(calibrated)):
            raise ValueError("calibrated: knots must be non-decreasing")
        low, high = SCORE_RANGE
        if not all(low <= v <= high for v in calibrated):
            raise ValueError(f"calibrated: knots must lie in [{low:g}, {high:g}]")
        if isinstance(self.answers, bool) or not isinstance(self.answers, int) or self.answers < 1:
            raise ValueError(f"answers: must be a positive integer, got {self.answers!r}")
        for name in ("checksum", "source"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: must be a string")
        if not _finite_number(self.fitted_at):
            raise ValueError(f"fitted_at: must be a finite number, got {self.fitted_at!r}")
        if self.temperature is not None and not (_finite_number(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature: must be a positive number or null, got {self.temperature!r}")
        if self.aggregation is not None and not isinstance(self.aggregation, str):
            raise ValueError(f"aggregation: must be a string or null, got {self.aggregation!r}")
        for name in ("escalation_threshold", "bad_threshold"):
            value = getattr(self, name)
            if value is not None and not _finite_number(value):
                raise ValueError(f"{name}: must be a finite number or null, got {value!r}")
        if self.target_catch is not None and not (_finite_number(self.target_catch) and 0 < self.target_catch <= 1):
            raise ValueError(f"target_catch: must be in (0, 1] or null, got {self.target_catch!r}")

    def apply(self, score: float) -> float:
        """``score`` on the oracle's scale; NaN stays NaN (the caller refuses it as a raw score)."""
        raw, calibrated = self.raw, self.calibrated
        if math.isnan(score):
            return score
        if score <= raw[0]:
            return calibrated[0]
        if score >= raw[-1]:
            return calibrated[-1]
        i = bisect.bisect_right(raw, score)  # raw[i - 1] <= score < raw[i]
        share = (score - raw[i - 1]) / (raw[i] - raw[i - 1])
        return calibrated[i - 1] + share * (calibrated[i] - calibrated[i - 1])

    def apply_all(self, scores: Iterable[float]) -> list[float]:
        return [self.apply(s) for s in scores]

    def to_dict(self) -> dict[str, Any]:
        return {"raw": list(self.raw), "calibrated": list(self.calibrated), "answers": self.answers,
                "checksum": self.checksum, "source": self.source, "fitted_at": self.fitted_at,
                "temperature": self.temperature, "aggregation": self.aggregation,
                "escalation_threshold": self.escalation_threshold, "target_catch": self.target_catch,
                "bad_threshold": self.bad_threshold}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScoreCalibration:
        """The calibration ``to_dict`` wrote; ValueError naming the field that is missing or wrong."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a calibration is a JSON object, got {type(data).__name__}")
        missing = [f for f in ("raw", "calibrated", "answers", "checksum", "source", "fitted_at") if f not in data]
        if missing:
            raise ValueError(f"{missing[0]}: missing")
        for name in ("raw", "calibrated"):
            if not isinstance(data[name], list | tuple):
                raise ValueError(f"{name}: must be a list of numbers")
        return cls(tuple(data["raw"]), tuple(data["calibrated"]), data["answers"], data["checksum"], data["source"],
                   data["fitted_at"], data.get("temperature"), data.get("aggregation"),
                   data.get("escalation_threshold"), data.get("target_catch"), data.get("bad_threshold"))


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


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
