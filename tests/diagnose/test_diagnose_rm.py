"""rm-noise and rm-overfit against a real svc_reward (in-process gRPC, real Kafka and Redis)."""

from __future__ import annotations

import pytest
from diagutil import TinyModels, service_settings, serving

from strata.config import StrataSettings
from strata_tools.diagnose import runner
from strata_tools.diagnose.settings import DiagnoseSettings
from strata_tools.diagnose.verdict import Verdict

pytestmark = pytest.mark.integration


def reward_parts(infra: StrataSettings, light: str, strong: str, **extra: object):
    from svc_reward.__main__ import build
    from svc_reward.config import RewardSettings

    # rm_watch off: a promoted RM on the shared strata.rm.updated topic must not replace ours.
    return build(RewardSettings(**service_settings(infra, light_rm=light, strong_rm=strong, rm_watch=False,
                                                   **extra)))


@pytest.fixture
def dropout_at_scoring(monkeypatch: pytest.MonkeyPatch) -> None:
    """The constructed noisy RM: reward models load with their dropout layers left on (train mode)."""
    import svc_reward.models

    real = svc_reward.models.load_reward_model

    def load_noisy(path, device="auto", dtype="auto"):
        loaded = real(path, device=device, dtype=dtype)
        loaded.model.train()  # dropout on at scoring time; no batch-norm in GPT-2, nothing else changes
        return loaded

    monkeypatch.setattr(svc_reward.models, "load_reward_model", load_noisy)


def noise_settings(port: int, **extra: object) -> DiagnoseSettings:
    return DiagnoseSettings(reward_address=f"127.0.0.1:{port}", rm_noise_responses=24, rm_noise_repeats=5, **extra)


def test_rm_noise_passes_on_a_deterministic_rm(infra, tiny_models: TinyModels) -> None:
    parts = reward_parts(infra, str(tiny_models.strong_rm), str(tiny_models.strong_rm))
    with serving(parts) as (port,):
        result = runner.run_check("rm-noise", noise_settings(port))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.value is not None and result.value < 1e-4
    assert result.details["ensemble_members"] == 1


def test_rm_noise_alarms_on_a_noisy_rm_and_shows_the_ensemble_spread(
        infra, tiny_models: TinyModels, dropout_at_scoring: None) -> None:
    single = reward_parts(infra, str(tiny_models.dropout_rm), str(tiny_models.strong_rm))
    # The cure of R8 on the same noisy model: three members voting (mean of three dropout draws).
    members = ",".join([str(tiny_models.dropout_rm)] * 3)
    ensemble = reward_parts(infra, members, str(tiny_models.strong_rm), light_rm_version="light-a+light-b+light-c")
    with serving(single, ensemble) as (port, ensemble_port):
        compare = f"127.0.0.1:{ensemble_port}"
        result = runner.run_check("rm-noise", noise_settings(port, ensemble_reward_address=compare))
    assert result.verdict is Verdict.ALARM, result.summary
    assert result.value is not None and result.value > 0.1
    assert "ensemble" in result.cure and "0.3" in result.cure
    assert result.details["ensemble_members_compared"] == 3
    # Averaging three independent draws divides the std by about sqrt(3).
    assert 0 < result.details["ensemble_spread"] < 0.8 * result.value
    assert "under the ensemble" in result.summary


def test_rm_overfit_passes_for_a_distilled_rm_and_alarms_for_a_random_one(infra, tiny_models: TinyModels) -> None:
    good = reward_parts(infra, str(tiny_models.light_rm), str(tiny_models.strong_rm))
    bad = reward_parts(infra, str(tiny_models.random_rm), str(tiny_models.strong_rm))
    with serving(good, bad) as (good_port, bad_port):
        healthy = runner.run_check("rm-overfit", DiagnoseSettings(
            reward_address=f"127.0.0.1:{good_port}", overfit_pairs=60, overfit_reference="strong"))
        overfit = runner.run_check("rm-overfit", DiagnoseSettings(
            reward_address=f"127.0.0.1:{bad_port}", overfit_pairs=60, overfit_reference="strong"))
    assert healthy.verdict is Verdict.PASS, healthy.summary
    assert healthy.value is not None and healthy.value >= 0.7
    assert overfit.verdict is Verdict.ALARM, overfit.summary
    assert overfit.value is not None and overfit.value < 0.7
    assert "adversarial" in overfit.cure
    assert "strong RM" in overfit.details["reference"]
