"""The light RM's raw score on the oracle's scale (R3), as svc_reward serves it. Pure.

The light RM's raw score is not on the oracle's scale: a :class:`ScoreCalibration` is a monotone map
from one to the other, fitted for one RM version on labelled answers (by the tools,
``strata_tools.rm.calibration.fit_isotonic``), so that the escalation threshold is a score on the
scale people read. The service reads it beside the RM's weights (``svc_reward.calibration_store``)
and maps each raw score through it.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

SCORE_RANGE = (0.0, 5.0)  # the oracle's (and a human's) scale


@dataclass(frozen=True)
class ScoreCalibration:
    """A monotone map from the light RM's raw score to the oracle's 0-5 scale, fitted for one RM version.

    Knots ``(raw[i], calibrated[i])``: linear between them, flat beyond the first and the last. Built
    by ``strata_tools.rm.calibration.fit_isotonic``; stored beside the RM's weights and in the registry
    (``to_dict``).
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
