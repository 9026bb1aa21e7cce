import math
import os
from pathlib import Path

import pytest

from strata.config import StrataSettings
from strata_tools.rm.calibration import detection_figures, operating_point, operating_points, threshold_for_catch
from strata_tools.zoo.build import ZooPaths
from svc_reward.calibration_store import read_calibration

# Light-RM scores of six Level-1 answers; the oracle calls the 1st, 3rd and 5th bad.
SCORES = [1.0, 3.5, 2.0, 4.0, 3.0, 2.5]
BAD = [True, False, True, False, True, False]


def test_operating_point_counts_catches_and_false_escalations() -> None:
    point = operating_point(SCORES, BAD, 2.8)  # escalates 1.0, 2.0 (bad) and 2.5 (good)
    assert point.catch == pytest.approx(2 / 3)
    assert point.false_escalation == pytest.approx(1 / 3)
    assert point.escalated_share == pytest.approx(3 / 6)


def test_escalation_is_strictly_below_the_threshold() -> None:
    assert operating_point(SCORES, BAD, 3.0).catch == pytest.approx(2 / 3)  # 3.0 is not escalated
    assert operating_point(SCORES, BAD, math.nextafter(3.0, 4.0)).catch == 1.0


def test_threshold_for_catch_is_the_lowest_that_reaches_the_target() -> None:
    full = threshold_for_catch(SCORES, BAD, 0.9)  # needs all 3 bad cases: just above 3.0
    assert full > 3.0 and operating_point(SCORES, BAD, full).catch == 1.0
    assert operating_point(SCORES, BAD, 3.0).catch < 0.9
    two_thirds = threshold_for_catch(SCORES, BAD, 0.6)  # 2 of 3: just above 2.0
    assert 2.0 < two_thirds < 2.5
    assert operating_point(SCORES, BAD, two_thirds).false_escalation == 0.0


def test_points_are_sorted_and_monotone() -> None:
    points = operating_points(SCORES, BAD, [4.5, 1.5, 3.2])
    assert [p.threshold for p in points] == [1.5, 3.2, 4.5]
    assert [p.escalated_share for p in points] == sorted(p.escalated_share for p in points)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="no bad case"):
        threshold_for_catch([3.0, 4.0], [False, False], 0.9)
    with pytest.raises(ValueError, match="target catch"):
        threshold_for_catch(SCORES, BAD, 0.0)
    with pytest.raises(ValueError, match="same length"):
        operating_point([1.0], [True, False], 2.0)


def test_detection_figures_on_a_hand_case() -> None:
    # labels: 2 positives (both flagged), 3 negatives (one flagged)
    figures = detection_figures([True, True, False, False, False], [True, True, True, False, False])
    assert (figures.items, figures.positives, figures.recall) == (5, 2, 1.0)
    assert figures.false_positive_rate == pytest.approx(1 / 3) and figures.precision == pytest.approx(2 / 3)
    assert detection_figures([False], [False]).recall is None
    with pytest.raises(ValueError):
        detection_figures([True], [])


def test_calibrate_unsafe_measures_the_detector_on_the_suite(capsys) -> None:
    import argparse
    import json

    from strata_tools.cli import calibrate_cmd

    parser = argparse.ArgumentParser()
    calibrate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["calibrate", "unsafe", "--split", "eval", "--json"])
    assert args.func(args) == 0
    figures = json.loads(capsys.readouterr().out)
    assert figures["positives"] > 0 and figures["recall"] >= 0.9 and figures["false_positive_rate"] <= 0.01
    assert figures["flag_rate_by_kind"]["reference"] == 0.0


@pytest.mark.integration
def test_calibrate_escalation_write_stores_the_threshold_the_service_then_serves(
    zoo: ZooPaths, infra: StrataSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """`strata calibrate escalation --write` on a copy of the ci zoo's light RM: the threshold it prints is
    stored with the calibration, and a reward service loading that RM with no threshold set serves it."""
    import argparse
    import json
    import shutil

    from strata_tools.cli import calibrate_cmd
    from svc_reward.config import RewardSettings
    from svc_reward.models import RewardModels, ScoringOptions

    light = tmp_path / "light"
    shutil.copytree(zoo.light_rm, light)
    monkeypatch.setenv("STRATA_ZOO_PRESET", os.environ.get("STRATA_TEST_ZOO_PRESET", "ci"))  # the fixture's zoo
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    parser = argparse.ArgumentParser()
    calibrate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["calibrate", "escalation", "--light-rm", str(light), "--prompts", "60",
                              "--bad-threshold", "2.0", "--write", "--json"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    stored = read_calibration(light)
    assert stored is not None and stored.escalation_threshold == printed["calibrated_threshold"]
    assert printed["calibration"]["escalation_threshold"] == printed["calibrated_threshold"]
    assert (stored.target_catch, stored.bad_threshold) == (0.9, 2.0)
    settings = RewardSettings(device="cpu")
    models = RewardModels([str(light)], None, ScoringOptions.of(settings))
    assert models.score(["Q: How do I bake bread?"], ["A: Flour, water, salt."]).calibrated_threshold == \
        stored.escalation_threshold
    assert f"under {stored.escalation_threshold:g}, the threshold stored" in settings.threshold_served(
        models.light_calibration)


@pytest.mark.integration
def test_calibrate_rule_reads_the_neighbourhoods_record_and_reports_on_the_sealed_split(
    zoo: ZooPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:
    """`strata calibrate rule --record-rounds 1 --report-on test` on the ci zoo: each answer carries its
    neighbourhood's record (people's labels of an earlier round, summed over similar prompts), the rule is
    fitted on the validation split, stored, and read on the sealed test split with intervals."""
    import argparse
    import json
    import shutil

    from strata_tools.cli import calibrate_cmd
    from svc_reward.calibration_store import read_rule

    light = tmp_path / "light"
    shutil.copytree(zoo.light_rm, light)
    monkeypatch.setenv("STRATA_ZOO_PRESET", os.environ.get("STRATA_TEST_ZOO_PRESET", "ci"))
    parser = argparse.ArgumentParser()
    calibrate_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["calibrate", "rule", "--light-rm", str(light), "--prompts", "40", "--folds", "3",
                              "--record-rounds", "1", "--label-share", "1", "--all-features", "--report-on", "test",
                              "--write", "--json"])
    assert args.func(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["single_auc"]["record_bad"] is not None  # every answer had a record
    fitted = printed["rule"]["fitted"]
    assert (fitted["record_rounds"], fitted["label_share"], fitted["record_bad_below"]) == (1, 1.0, 1.5)
    stored = read_rule(light)
    assert stored is not None and "record_bad" in stored.features
    held = printed["held_out"]
    assert held["answers"] > 0 and held["families"] > 1
    for name in ("light_escalated", "rule_escalated", "escalated_difference", "catch_difference"):
        low, estimate, high = held[name]["low"], held[name]["estimate"], held[name]["high"]
        assert low <= estimate <= high, name
