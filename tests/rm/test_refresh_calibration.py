"""A refresh turn carries the score calibration forward: when the light RM in service is served calibrated,
the candidate is calibrated on the turn's held-out labels before it can be promoted (else the escalation
threshold's scale would change under a hot swap). Tiny RMs, no zoo, no Kafka or Redis."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from rmutil import N_BINS, TINY
from transformers import PreTrainedTokenizerFast

from strata.contract.checksums import weights_checksum
from strata_tools.rm.loop import carry_calibration
from strata_tools.rm.train import new_reward_model
from svc_reward.calibrate import ScoreCalibration
from svc_reward.calibration_store import read_calibration, write_calibration
from svc_reward.config import RewardSettings
from svc_reward.models import RewardModels, ScoringOptions
from svc_reward.registry import describe

WORDS = ["flour", "dough", "loan", "payment", "tea", "coffee", "river", "tide", "moon", "salt", "bread", "rate"]


def calibrated(model_dir: Path, escalation_threshold: float | None = None) -> Path:
    write_calibration(model_dir, ScoreCalibration((1.0, 5.0), (0.0, 4.0), 40, weights_checksum([model_dir]),
                                                  "test", 1.0, escalation_threshold=escalation_threshold,
                                                  target_catch=None if escalation_threshold is None else 0.9,
                                                  bad_threshold=None if escalation_threshold is None else 1.5))
    return model_dir


def varied_rm(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> Path:
    """A randomly initialised tiny RM: its score moves with the text (unlike rmutil's constant ones)."""
    out = tmp_path / "candidate"
    new_reward_model(tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=7).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def held_out(model_dir: Path) -> list[dict[str, object]]:
    """Answers labelled in the order the RM scores them (so the fit has several knots), 0..5."""
    prompts = [f"Q: Tell me about {w}." for w in WORDS]
    responses = [f"A: The {w} is {' '.join(WORDS[: i + 1])}." for i, w in enumerate(WORDS)]
    options = dataclasses.replace(ScoringOptions.of(RewardSettings()), device="cpu", dtype="auto")
    scores = RewardModels([str(model_dir)], None, options).score(prompts, responses).rewards
    order = sorted(range(len(scores)), key=scores.__getitem__)
    labels = {i: 5.0 * rank / (len(order) - 1) for rank, i in enumerate(order)}
    return [{"prompt": p, "response": r, "score": labels[i]} for i, (p, r) in enumerate(zip(prompts, responses,
                                                                                            strict=True))]


def test_a_calibrated_version_in_service_makes_the_candidate_calibrated(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    current = calibrated(make_rm("current", 3.0))
    candidate_dir = varied_rm(tmp_path, tiny_tokenizer)
    candidate = describe("light", [candidate_dir])
    held = held_out(candidate_dir)
    said: list[str] = []
    assert carry_calibration([current], candidate, held, None, said.append) == "carried"
    stored = read_calibration(candidate_dir)
    assert stored is not None and stored.checksum == candidate.checksum and stored.answers == len(held)
    assert len(stored.raw) >= 2 and stored.temperature == RewardSettings().temperature
    assert said and candidate.version in said[0]
    assert stored.escalation_threshold is None  # the version in service stored none


def test_the_threshold_stored_with_the_calibration_in_service_is_carried(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    """On the oracle's scale, which both calibrations map onto: without it the promoted version would be
    served at the brief's 3.2 on that scale, escalating nearly everything."""
    current = calibrated(make_rm("current", 3.0), escalation_threshold=2.104)
    candidate_dir = varied_rm(tmp_path, tiny_tokenizer)
    said: list[str] = []
    assert carry_calibration([current], describe("light", [candidate_dir]), held_out(candidate_dir), None,
                             said.append) == "carried"
    stored = read_calibration(candidate_dir)
    assert stored is not None
    assert (stored.escalation_threshold, stored.target_catch, stored.bad_threshold) == (2.104, 0.9, 1.5)
    assert "escalation threshold 2.104 kept" in said[0]


def test_nothing_is_carried_when_the_version_in_service_is_uncalibrated(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    candidate_dir = varied_rm(tmp_path, tiny_tokenizer)
    result = carry_calibration([make_rm("current", 3.0)], describe("light", [candidate_dir]),
                               held_out(candidate_dir), None, lambda line: None)
    assert result == "" and read_calibration(candidate_dir) is None


def test_a_candidate_that_cannot_be_calibrated_says_why(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    current = calibrated(make_rm("current", 3.0))
    flat = make_rm("flat", 2.0)  # scores every answer the same: no calibration can be fitted
    held = held_out(varied_rm(tmp_path, tiny_tokenizer))
    result = carry_calibration([current], describe("light", [flat]), held, None, lambda line: None)
    assert result.startswith(f"cannot calibrate {describe('light', [flat]).version}")
    assert read_calibration(flat) is None
