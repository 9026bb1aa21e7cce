"""memory and repetition against a real generator service (gRPC Generate, dynamic batcher, HF backend)."""

from __future__ import annotations

import pytest
from diagutil import LeakyBackend, TinyModels, generator_parts, serving

from strata.telemetry import start_metrics_server
from strata_tools.diagnose import runner
from strata_tools.diagnose.memory import MIB
from strata_tools.diagnose.settings import DiagnoseSettings
from strata_tools.diagnose.verdict import Verdict
from svc_generator.backends.hf import HfBackend
from svc_generator.config import GeneratorSettings


@pytest.fixture(scope="module")
def metrics_url() -> str:
    # The in-process generator's Prometheus endpoint (this process's registry: RSS comes from
    # prometheus_client's process collector, as in a service started with STRATA_METRICS_PORT).
    return f"http://127.0.0.1:{start_metrics_server(0)}/metrics"


def memory_settings(port: int, url: str) -> DiagnoseSettings:
    return DiagnoseSettings(generator_address=f"127.0.0.1:{port}", generator_metrics_url=url, memory_rounds=4,
                            memory_samples_per_round=4, memory_max_growth_mib=8.0)


def test_memory_passes_on_a_generator_that_releases_its_batches(tiny_models: TinyModels, metrics_url: str) -> None:
    settings = GeneratorSettings(device="cpu", max_new_tokens=12)
    with serving(generator_parts(settings, HfBackend(str(tiny_models.lm), "cpu"))) as (port,):
        result = runner.run_check("memory", memory_settings(port, metrics_url))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.details["source"] == "process RSS"
    assert len(result.details["readings_mib"]) == 5


def test_memory_alarms_on_a_leaking_generator(tiny_models: TinyModels, metrics_url: str) -> None:
    settings = GeneratorSettings(device="cpu", max_new_tokens=12)
    # The leak is set well above the RSS noise: the other memory of a round moves by up to ~80 MiB (CI:
    # readings +32, -49, +32, +32 MiB with a 32 MiB leak, a least-squares slope of 7.8 under the 8 MiB bound).
    leaky = LeakyBackend(HfBackend(str(tiny_models.lm), "cpu"), leak_bytes=128 * MIB)
    with serving(generator_parts(settings, leaky)) as (port,):
        result = runner.run_check("memory", memory_settings(port, metrics_url))
    leaked_batches = len(leaky.kept)
    leaky.kept.clear()
    assert leaked_batches >= 5
    assert result.verdict is Verdict.ALARM, result.summary
    readings = result.details["readings_mib"]
    assert result.value is not None and result.value > 32
    assert readings[-1] - readings[0] > 128
    assert "empty_cache" in result.cure


def repetition_settings(port: int) -> DiagnoseSettings:
    return DiagnoseSettings(generator_address=f"127.0.0.1:{port}", repetition_rollouts=12, generate_chunk=6)


def test_repetition_passes_with_sane_sampling(tiny_models: TinyModels) -> None:
    settings = GeneratorSettings(device="cpu", max_new_tokens=12, temperature=0.8, top_p=0.9)
    with serving(generator_parts(settings, HfBackend(str(tiny_models.lm), "cpu"))) as (port,):
        result = runner.run_check("repetition", repetition_settings(port))
    assert result.verdict is Verdict.PASS, result.summary
    assert result.details["temperature"] == pytest.approx(0.8)
    assert result.details["sampling_problems"] == []


def test_repetition_alarms_on_greedy_sampling_and_prints_the_parameters(tiny_models: TinyModels) -> None:
    # A deployment whose default temperature was overridden to near-greedy, accepted with a warning, and
    # rollout dropout off (R17's variety would hide the collapse on this tiny model).
    settings = GeneratorSettings(device="cpu", max_new_tokens=12, temperature=0.02, top_p=0.9,
                                 allow_out_of_range_sampling=True, rollout_dropout_enabled=False)
    with serving(generator_parts(settings, HfBackend(str(tiny_models.lm), "cpu"))) as (port,):
        result = runner.run_check("repetition", repetition_settings(port))
    assert result.verdict is Verdict.ALARM, result.summary
    assert result.value is not None and result.value > 0.4
    assert "temperature=0.02" in result.summary
    assert result.details["sampling_problems"] == ["temperature 0.02 <= 0.3"]
