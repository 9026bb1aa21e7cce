"""``strata diagnose``: one check and ``all`` through the real CLI entry point, against services."""

from __future__ import annotations

import pytest
from diagutil import TinyModels, generator_parts, service_settings, serving

from strata.config import StrataSettings
from strata.telemetry import start_metrics_server
from strata_tools.cli.main import main
from svc_generator.backends.hf import HfBackend
from svc_generator.config import GeneratorSettings

pytestmark = pytest.mark.integration


def greedy_generator(models: TinyModels):
    # Near-greedy and no rollout dropout (R17 adds the variety that would hide the collapse).
    settings = GeneratorSettings(device="cpu", max_new_tokens=10, temperature=0.02, allow_out_of_range_sampling=True,
                                 rollout_dropout_enabled=False)
    return generator_parts(settings, HfBackend(str(models.lm), "cpu"))


def test_a_single_check_prints_alarm_the_number_the_parameters_and_the_cure(
        tiny_models: TinyModels, capsys: pytest.CaptureFixture[str]) -> None:
    with serving(greedy_generator(tiny_models)) as (port,):
        code = main(["diagnose", "repetition", "--generator-address", f"127.0.0.1:{port}",
                     "--repetition-rollouts", "8"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.startswith("repetition: ALARM")
    assert "temperature=0.02" in out and "cure: raise the temperature" in out


def test_all_prints_one_table_and_exits_non_zero_on_an_alarm(
        infra: StrataSettings, tiny_models: TinyModels, capsys: pytest.CaptureFixture[str]) -> None:
    from svc_reward.__main__ import build as build_reward
    from svc_reward.config import RewardSettings

    reward = build_reward(RewardSettings(**service_settings(infra, light_rm=str(tiny_models.strong_rm),
                                                            strong_rm=str(tiny_models.strong_rm), rm_watch=False)))
    metrics = f"http://127.0.0.1:{start_metrics_server(0)}/metrics"
    with serving(reward, greedy_generator(tiny_models)) as (reward_port, generator_port):
        code = main([
            "diagnose", "all", "--reward-address", f"127.0.0.1:{reward_port}",
            "--generator-address", f"127.0.0.1:{generator_port}", "--generator-metrics-url", metrics,
            "--kafka-bootstrap", infra.kafka_address, "--redis-url", str(infra.redis_address),
            "--rm-noise-responses", "10", "--rm-noise-repeats", "3", "--overfit-pairs", "20",
            "--overfit-reference", "strong", "--memory-rounds", "2", "--memory-samples-per-round", "2",
            "--repetition-rollouts", "8", "--shift-policy", str(tiny_models.lm), "--shift-window-s", "0.001",
        ])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:7]}
    assert rows == {"rm-noise": "PASS", "shift": "ERROR", "rm-overfit": "PASS", "memory": "PASS",
                    "repetition": "ALARM"}
    assert code == 1
    assert "cure for repetition:" in out
