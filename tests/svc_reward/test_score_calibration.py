"""The light RM's score calibration (isotonic, to the oracle's 0-5 scale): fit, map, validation. Pure."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
from typing import Any

import pytest

from strata_tools.rm.calibration import cross_validated_error, fit_isotonic, mean_absolute_error
from svc_reward.calibrate import ScoreCalibration

CHECKSUM = "ab" * 32


def knots(cal: ScoreCalibration) -> list[tuple[float, float]]:
    return list(zip(cal.raw, cal.calibrated, strict=True))


def test_pool_adjacent_violators_on_a_hand_computed_case() -> None:
    # (3, 2) violates (2, 3): pooled into one block at raw 2.5, target 2.5.
    cal = fit_isotonic([1, 2, 3, 4], [1, 3, 2, 4], checksum=CHECKSUM, source="hand", now=100.0)
    assert knots(cal) == [(1, 1), (2.5, 2.5), (4, 4)]
    assert (cal.answers, cal.checksum, cal.source, cal.fitted_at) == (4, CHECKSUM, "hand", 100.0)


def test_order_of_the_input_does_not_matter() -> None:
    assert knots(fit_isotonic([4, 2, 1, 3], [4, 3, 1, 2], now=0)) == [(1, 1), (2.5, 2.5), (4, 4)]


def test_equal_scores_are_pooled_first_weighted_by_their_count() -> None:
    # Three answers at 1.0 (mean 4) then one at 2.0 (0): one block, raw (3*1 + 2) / 4, target 12 / 4.
    # Pooling the tie as one unweighted point would give (1.5, 2.0).
    cal = fit_isotonic([1.0, 1.0, 1.0, 2.0], [4, 4, 4, 0], now=0)
    assert knots(cal) == [(pytest.approx(1.25), pytest.approx(3.0))]
    assert knots(fit_isotonic([1, 1, 2], [0, 2, 3], now=0)) == [(1, 1), (2, 3)]


def test_adjacent_blocks_of_equal_mean_become_one_knot() -> None:
    # A strictly increasing map: the calibrated score keeps the raw score's order.
    assert knots(fit_isotonic([1, 2, 3], [2, 2, 4], now=0)) == [(1.5, 2), (3, 4)]


def _isotonic_by_min_max(ys: list[float]) -> list[float]:
    """The least-squares non-decreasing fit at each point, by its min-max formula (distinct, sorted x):
    f(i) = max over j <= i of min over k >= i of mean(y[j..k]). Independent of PAV."""
    n = len(ys)
    return [max(min(sum(ys[j:k + 1]) / (k + 1 - j) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fit_is_the_least_squares_monotone_fit_with_centred_knots(seed: int) -> None:
    rng = random.Random(seed)
    xs = sorted(rng.uniform(0, 5) for _ in range(40))
    ys = [min(5.0, max(0.0, 0.6 * x + rng.gauss(0, 1.0))) for x in xs]
    expected = _isotonic_by_min_max(ys)
    blocks: list[list[int]] = []  # runs of equal fitted value
    for i in range(len(xs)):
        if blocks and math.isclose(expected[i], expected[blocks[-1][0]], abs_tol=1e-9):
            blocks[-1].append(i)
        else:
            blocks.append([i])
    cal = fit_isotonic(xs, ys, now=0)
    assert len(cal.raw) == len(blocks) > 1
    assert list(cal.raw) == pytest.approx([sum(xs[i] for i in b) / len(b) for b in blocks])
    assert list(cal.calibrated) == pytest.approx([expected[b[0]] for b in blocks])


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_the_map_is_monotone_and_beats_a_constant(seed: int) -> None:
    rng = random.Random(seed)
    scores = [rng.uniform(1, 4.5) for _ in range(200)]
    targets = [min(5.0, max(0.0, 1.5 * (s - 1) + rng.gauss(0, 0.8))) for s in scores]
    cal = fit_isotonic(scores, targets, now=0)
    grid = [i / 100 for i in range(-100, 700)]
    mapped = cal.apply_all(grid)
    assert all(b >= a for a, b in itertools.pairwise(mapped))
    inside = cal.apply_all(g for g in grid if cal.raw[0] <= g <= cal.raw[-1])
    assert all(b > a for a, b in itertools.pairwise(inside))  # keeps the raw score's order there
    assert all(0 <= v <= 5 for v in mapped)
    mean = sum(targets) / len(targets)
    constant = mean_absolute_error([mean] * len(targets), targets)
    assert mean_absolute_error(cal.apply_all(scores), targets) < constant
    held_out = cross_validated_error(scores, targets, folds=5, seed=seed)
    assert held_out is not None and held_out < constant


def test_cross_validation_recovers_an_exact_line() -> None:
    scores = [i / 10 for i in range(41)]  # targets equal to the scores: every point its own knot
    error = cross_validated_error(scores, scores, folds=5, seed=0)
    assert error is not None and error < 0.01  # interpolation is exact; only a held-out end point is clamped
    assert cross_validated_error([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None  # no fold has 2 distinct scores


def test_apply_interpolates_between_knots_and_is_flat_beyond_them() -> None:
    cal = ScoreCalibration((1.0, 2.0, 4.0), (0.5, 1.5, 4.5), 10, CHECKSUM, "", 0.0)
    assert cal.apply(1.5) == pytest.approx(1.0)
    assert cal.apply(3.0) == pytest.approx(3.0)
    assert cal.apply(2.0) == 1.5
    assert (cal.apply(-7.0), cal.apply(1.0), cal.apply(4.0), cal.apply(9.0)) == (0.5, 0.5, 4.5, 4.5)
    assert cal.apply(math.inf) == 4.5
    assert math.isnan(cal.apply(math.nan))  # the worker refuses a NaN raw score; the map must not hide it
    assert cal.apply_all([1.5, 9.0]) == [pytest.approx(1.0), 4.5]
    single = ScoreCalibration((2.0,), (3.0,), 1, "", "", 0.0)
    assert single.apply(0.0) == single.apply(5.0) == 3.0


def test_round_trip_through_json() -> None:
    cal = fit_isotonic([1, 2, 3, 4], [1, 3, 2, 4], checksum=CHECKSUM, source="oracle, fresh split", now=5.5,
                       temperature=0.3, aggregation="median")
    assert ScoreCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


def test_the_escalation_threshold_chosen_with_it_round_trips() -> None:
    cal = dataclasses.replace(fit_isotonic([1, 2, 3], [1, 2, 4], now=0), escalation_threshold=2.146,
                              target_catch=0.9, bad_threshold=1.5)
    assert ScoreCalibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


def test_an_entry_without_the_scoring_fields_still_loads() -> None:
    data = fit_isotonic([1, 2], [1, 2], now=0).to_dict()
    del data["temperature"], data["aggregation"], data["escalation_threshold"], data["target_catch"]
    del data["bad_threshold"]
    cal = ScoreCalibration.from_dict(data)
    assert (cal.temperature, cal.aggregation, cal.escalation_threshold, cal.target_catch) == (None,) * 4


GOOD: dict[str, Any] = {"raw": [1.0, 2.0], "calibrated": [1.0, 3.0], "answers": 8, "checksum": CHECKSUM,
                        "source": "test", "fitted_at": 1.0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("raw", []),
        ("raw", [2.0, 1.0]),
        ("raw", [1.0, 1.0]),
        ("raw", [1.0, float("nan")]),
        ("raw", "1,2"),
        ("raw", [1.0, "2"]),
        ("calibrated", [1.0]),
        ("calibrated", [3.0, 1.0]),
        ("calibrated", [1.0, 5.5]),
        ("calibrated", [-0.1, 1.0]),
        ("calibrated", [1.0, float("inf")]),
        ("answers", 0),
        ("answers", "8"),
        ("answers", True),
        ("checksum", None),
        ("source", 3),
        ("fitted_at", "yesterday"),
        ("fitted_at", float("nan")),
        ("temperature", 0.0),
        ("aggregation", 1),
        ("escalation_threshold", float("nan")),
        ("escalation_threshold", "2.1"),
        ("target_catch", 0.0),
        ("target_catch", 1.5),
        ("bad_threshold", True),
    ],
)
def test_from_dict_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        ScoreCalibration.from_dict({**GOOD, field: value})


@pytest.mark.parametrize("field", ["raw", "calibrated", "answers", "checksum", "source", "fitted_at"])
def test_from_dict_names_a_missing_field(field: str) -> None:
    data = {k: v for k, v in GOOD.items() if k != field}
    with pytest.raises(ValueError, match=f"^{field}: missing"):
        ScoreCalibration.from_dict(data)


def test_from_dict_wants_an_object() -> None:
    with pytest.raises(ValueError, match="JSON object"):
        ScoreCalibration.from_dict([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("scores", "targets", "message"),
    [
        ([], [], "non-empty"),
        ([1.0, 2.0], [1.0], "same length"),
        ([1.0, float("nan")], [1.0, 2.0], "finite"),
        ([1.0, 2.0], [1.0, float("inf")], "finite"),
        ([1.0, 2.0], [1.0, 6.0], "oracle's scale"),
        ([2.0, 2.0, 2.0], [1.0, 2.0, 3.0], "at least 2 distinct scores"),
    ],
)
def test_fit_refuses_what_it_cannot_fit(scores: list[float], targets: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_isotonic(scores, targets)


@pytest.mark.parametrize("bad_score", [2.5, 2.123, 2.1234567, 0.1, 3.9999999])
def test_the_printed_threshold_still_catches_the_bad_case_it_was_chosen_for(bad_score: float) -> None:
    from strata_tools.rm.calibration import operating_point, printable_threshold, threshold_for_catch

    scores, bad = [bad_score, bad_score + 1.0], [True, False]
    printed = printable_threshold(threshold_for_catch(scores, bad, 1.0))
    assert printed == round(printed, 3) and printed > bad_score
    assert operating_point(scores, bad, float(f"{printed:.3f}")).catch == 1.0
