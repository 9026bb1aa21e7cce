"""LearnerSettings: defaults of the brief's rules, env and flags, consistency checks, the PPO view."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from strata.config import StrataSettings, add_settings_flags, settings_from_flags
from svc_learner.config import LearnerSettings
from svc_learner.ppo import PPOConfig


def test_defaults_carry_the_brief_rules() -> None:
    settings = LearnerSettings()
    assert settings.kl_warmup_updates == 100
    assert settings.clip_mode == "adaptive"
    assert (settings.clip_eps_low, settings.clip_eps_high) == (0.02, 0.1)
    assert (settings.clip_kl_low, settings.clip_kl_high) == (0.02, 0.1)
    assert "rollout_dropout" not in LearnerSettings.model_fields  # the generators' setting (R17), not the learner's
    assert settings.grpc_port == 50055


def test_every_learner_field_is_described() -> None:
    own = set(LearnerSettings.model_fields) - set(StrataSettings.model_fields)
    undescribed = sorted(name for name in own if not LearnerSettings.model_fields[name].description)
    assert undescribed == []


def test_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_CLIP_MODE", "fixed")
    monkeypatch.setenv("STRATA_MAX_STALENESS", "1")
    assert LearnerSettings().clip_mode == "fixed"
    parser = argparse.ArgumentParser()
    add_settings_flags(parser, LearnerSettings)
    settings = settings_from_flags(LearnerSettings, parser.parse_args(["--clip-coef", "0.3", "--kl-coef", "0.1"]))
    assert (settings.clip_mode, settings.clip_coef, settings.kl_coef, settings.max_staleness) == ("fixed", 0.3, 0.1, 1)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"clip_mode": "sometimes"}, "clip_mode"),
        ({"clip_eps_low": 0.2, "clip_eps_high": 0.1}, "clip_eps_low"),
        ({"clip_kl_low": 0.1, "clip_kl_high": 0.1}, "clip_kl_low"),
        ({"minibatch_size": 64, "batch_size": 32}, "minibatch_size"),
        ({"max_staleness": 5, "keep_checkpoints": 3}, "keep_checkpoints"),
        ({"gamma": 1.5}, "gamma"),
    ],
)
def test_inconsistent_settings_are_refused(kwargs: dict, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        LearnerSettings(**kwargs)


def test_ppo_config_copies_every_ppo_field() -> None:
    settings = LearnerSettings(gamma=0.99, clip_mode="fixed", clip_coef=0.15, kl_coef=0.2, target_kl=0.05, seed=7)
    config = settings.ppo_config()
    for field in dataclasses.fields(PPOConfig):
        assert getattr(config, field.name) == getattr(settings, field.name), field.name


def test_settings_default_to_the_math_defaults_written_once_in_ppo_py() -> None:
    assert LearnerSettings().ppo_config() == PPOConfig()


def test_checkpoints_follow_the_state_dir_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert LearnerSettings(state_dir=Path("/srv/strata")).checkpoint_dir == Path("/srv/strata/learner/checkpoints")
    monkeypatch.setenv("STRATA_STATE_DIR", "/var/lib/strata")
    assert LearnerSettings().checkpoint_dir == Path("/var/lib/strata/learner/checkpoints")
    assert LearnerSettings(checkpoint_dir=Path("/checkpoints")).checkpoint_dir == Path("/checkpoints")
    monkeypatch.setenv("STRATA_CHECKPOINT_DIR", "/mnt/ckpt")
    assert LearnerSettings().checkpoint_dir == Path("/mnt/ckpt")


def test_a_relative_checkpoint_dir_is_made_absolute_for_the_events_that_carry_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert LearnerSettings(state_dir=Path(".strata")).checkpoint_dir == tmp_path / ".strata/learner/checkpoints"
    monkeypatch.setenv("STRATA_CHECKPOINT_DIR", "run/ckpt")
    assert LearnerSettings().checkpoint_dir == tmp_path / "run/ckpt"


def test_a_home_relative_checkpoint_dir_is_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert LearnerSettings(checkpoint_dir=Path("~/ckpt")).checkpoint_dir == tmp_path / "ckpt"
