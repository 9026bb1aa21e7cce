"""The reward service serves the light RM's calibration stored with its weights, only if it was fitted
for those weights, and a hot swap brings the new version's own calibration (or none).

Tiny constant RMs (``rmutil.constant_rm``): A scores every pair about 3.5, B about 4.5, C about 2.0.
No Kafka or Redis.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from strata.contract.checksums import weights_checksum
from svc_reward.calibrate import ScoreCalibration
from svc_reward.calibration_store import CALIBRATION_FILE, read_calibration, write_calibration
from svc_reward.config import RewardSettings
from svc_reward.models import RewardModels, ScoringOptions

PROMPTS, RESPONSES = ["Q: How do I bake bread?"], ["A: First, check the flour."]


def options(temperature: float = 1.0) -> ScoringOptions:
    return dataclasses.replace(ScoringOptions.of(RewardSettings()), device="cpu", dtype="float32",
                               temperature=temperature, batch_size=8, max_length=64)


def calibration_for(model_dir: Path, top: float, **fields: object) -> ScoreCalibration:
    """A calibration of ``model_dir``'s weights that maps raw 1..5 linearly to 0..``top``."""
    values = {"raw": (1.0, 5.0), "calibrated": (0.0, top), "answers": 50,
              "checksum": weights_checksum([model_dir]), "source": "test", "fitted_at": 1.0, **fields}
    return ScoreCalibration(**values)  # type: ignore[arg-type]


def test_the_light_rm_is_served_with_its_calibration(make_rm: Callable[..., Path], tmp_path: Path) -> None:
    light, strong = make_rm("a", 3.5), make_rm("strong", 1.0)
    cal = calibration_for(light, 4.0)
    write_calibration(light, cal)
    assert read_calibration(light) == cal
    assert not list(light.glob(f".{CALIBRATION_FILE}.*"))  # the temporary file was renamed, not left behind
    models = RewardModels([str(light)], str(strong), options())
    assert models.light_calibration == cal
    scores = models.score(PROMPTS, RESPONSES)
    assert scores.rewards == [pytest.approx(3.5, abs=0.05)]  # the published reward stays raw
    assert scores.calibrated == [cal.apply(scores.rewards[0])] == [pytest.approx(2.5, abs=0.05)]
    assert models.score(PROMPTS, RESPONSES, strong=True).calibrated is None  # only the light RM is calibrated


def test_without_a_calibration_the_scores_are_raw_only(make_rm: Callable[..., Path]) -> None:
    models = RewardModels([str(make_rm("a", 3.5))], None, options())
    assert models.light_calibration is None
    assert models.score(PROMPTS, RESPONSES).calibrated is None


def test_a_calibration_fitted_for_other_weights_is_not_served(
    make_rm: Callable[..., Path], caplog: pytest.LogCaptureFixture,
) -> None:
    light, other = make_rm("a", 3.5), make_rm("b", 4.5)
    write_calibration(light, calibration_for(other, 4.0))  # e.g. left behind when the weights were replaced
    with caplog.at_level(logging.WARNING, logger="svc_reward.models"):
        models = RewardModels([str(light)], None, options())
    assert models.light_calibration is None
    assert models.score(PROMPTS, RESPONSES).calibrated is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"calibration in {light} was fitted for {weights_checksum([other])[:12]}, weights are "
                        f"{weights_checksum([light])[:12]}: serving uncalibrated"]


def test_a_calibration_at_another_scoring_temperature_is_not_served(
    make_rm: Callable[..., Path], caplog: pytest.LogCaptureFixture,
) -> None:
    light = make_rm("a", 3.5)
    write_calibration(light, calibration_for(light, 4.0, temperature=0.3))
    with caplog.at_level(logging.WARNING, logger="svc_reward.models"):
        assert RewardModels([str(light)], None, options(temperature=1.0)).light_calibration is None
    assert "temperature 0.3, served at 1.0" in caplog.text
    assert RewardModels([str(light)], None, options(temperature=0.3)).light_calibration is not None


@pytest.mark.parametrize("body", ["{not json", '{"raw": [2, 1], "calibrated": [1, 2], "answers": 3, '
                                  '"checksum": "", "source": "", "fitted_at": 0}'])
def test_a_malformed_file_is_reported_and_the_rm_served_uncalibrated(
    make_rm: Callable[..., Path], caplog: pytest.LogCaptureFixture, body: str,
) -> None:
    light = make_rm("a", 3.5)
    (light / CALIBRATION_FILE).write_text(body)
    with caplog.at_level(logging.WARNING, logger="svc_reward.models"):
        models = RewardModels([str(light)], None, options())
    assert models.light_calibration is None
    assert models.score(PROMPTS, RESPONSES).rewards == [pytest.approx(3.5, abs=0.05)]
    assert str(light / CALIBRATION_FILE) in caplog.text and "serving uncalibrated" in caplog.text


def test_a_hot_swap_brings_the_new_versions_calibration_or_none(
    make_rm: Callable[..., Path], caplog: pytest.LogCaptureFixture,
) -> None:
    a, b, c = make_rm("a", 3.5), make_rm("b", 4.5, seed=1), make_rm("c", 2.0, seed=2)
    cal_a, cal_b = calibration_for(a, 4.0), calibration_for(b, 2.0)
    write_calibration(a, cal_a)
    write_calibration(b, cal_b)
    models = RewardModels([str(a)], None, options())
    assert models.light_calibration == cal_a
    models.swap_light([str(b)], "light-b")
    assert (models.light_version, models.light_calibration) == ("light-b", cal_b)
    scores = models.score(PROMPTS, RESPONSES)
    assert scores.rewards == [pytest.approx(4.5, abs=0.05)]
    assert scores.calibrated == [cal_b.apply(scores.rewards[0])] == [pytest.approx(1.75, abs=0.05)]
    with caplog.at_level(logging.WARNING, logger="svc_reward.models"):
        models.swap_light([str(c)], "light-c")  # no calibration: served raw, and said so
    assert (models.light_version, models.light_calibration) == ("light-c", None)
    assert models.score(PROMPTS, RESPONSES).calibrated is None
    assert "light RM light-c has no calibration, light-b had one" in caplog.text


def test_a_hot_swap_brings_the_new_versions_escalation_threshold(make_rm: Callable[..., Path]) -> None:
    """Each version's calibrated threshold rides with its scores, so a batch is judged by the threshold
    of the version that scored it; a version whose calibration stores none (or has no calibration)
    leaves the choice to the settings or the brief."""
    a, b, c = make_rm("a", 3.5), make_rm("b", 4.5, seed=1), make_rm("c", 2.0, seed=2)
    write_calibration(a, calibration_for(a, 4.0, escalation_threshold=2.1, target_catch=0.9, bad_threshold=1.5))
    write_calibration(b, calibration_for(b, 2.0))  # written before calibrations stored thresholds
    models = RewardModels([str(a)], None, options())
    assert read_calibration(a).escalation_threshold == 2.1  # type: ignore[union-attr]
    assert models.score(PROMPTS, RESPONSES).calibrated_threshold == 2.1
    models.swap_light([str(b)], "light-b")
    assert models.score(PROMPTS, RESPONSES).calibrated_threshold is None
    models.swap_light([str(c)], "light-c")
    assert models.score(PROMPTS, RESPONSES).calibrated_threshold is None
    models.swap_light([str(a)], "light-a")
    assert models.score(PROMPTS, RESPONSES).calibrated_threshold == 2.1


def test_a_constant_calibration_is_not_stored(make_rm: Callable[..., Path]) -> None:
    light = make_rm("a", 3.5)
    constant = ScoreCalibration((2.0,), (3.0,), 30, weights_checksum([light]), "test", 1.0)
    with pytest.raises(ValueError, match="one constant"):
        write_calibration(light, constant)
    assert read_calibration(light) is None and not list(light.glob(f"*{CALIBRATION_FILE}*"))
