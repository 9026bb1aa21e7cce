"""shift: rollouts made by a real generator (Kafka worker path), read back from the rollout topic and
the content store, scored under the current policy and under a drifted one."""

from __future__ import annotations

import time
import uuid

import pytest
from diagutil import TinyModels, service_settings, serving

from strata.bus import Publisher, topics
from strata.bus.tail import TailReader
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2
from strata_tools.diagnose import runner
from strata_tools.diagnose.settings import DiagnoseSettings
from strata_tools.diagnose.verdict import Verdict
from strata_tools.task.suite import load_suite

pytestmark = pytest.mark.integration

N_PROMPTS, N_SAMPLES = 6, 2


def generate_rollouts(infra: StrataSettings, lm: str) -> float:
    """Route prompts to Level-1 and wait for their rollouts; returns when the run started (epoch s)."""
    from svc_generator.__main__ import build
    from svc_generator.config import GeneratorSettings

    started = time.time()
    # follow_policy_updates off: policy events of other tests must not swap our weights.
    parts = build(GeneratorSettings(**service_settings(infra, tier=1, model=lm, max_new_tokens=12,
                                                       follow_policy_updates=False)))
    tail = TailReader(infra, [topics.ROLLOUTS_GENERATED], client_id="test-diagnose-shift")
    tail.seek_to_end()
    store = ContentStore.from_url(infra.redis_address, infra.content_ttl_s, infra.content_max_bytes)
    publisher = Publisher(infra.kafka_address, client_id="test-diagnose-shift")
    requests = set()
    try:
        with serving(parts):
            for record in load_suite("eval")[:N_PROMPTS]:
                routed = events_pb2.PromptRouted(prompt_hash=store.put(record.text), tier=common_pb2.TIER_LEVEL_1,
                                                 n_samples=N_SAMPLES, request_id=uuid.uuid4().hex)
                routed.routed_at.GetCurrentTime()
                publisher.publish(topics.PROMPTS_LEVEL1, routed)
                requests.add(routed.request_id)
            publisher.flush()
            seen = 0
            deadline = time.monotonic() + 120
            while seen < N_PROMPTS * N_SAMPLES:
                assert time.monotonic() < deadline, f"only {seen} rollouts arrived"
                seen += sum(event.request_id in requests for _, event in tail.poll(0.5))
    finally:
        publisher.close()
        tail.close()
    return started


def test_shift_passes_under_the_generating_policy_and_alarms_under_a_drifted_one(
        infra: StrataSettings, tiny_models: TinyModels) -> None:
    started = generate_rollouts(infra, str(tiny_models.lm))
    window = time.time() - started + 1.0
    common = {"kafka_bootstrap": infra.kafka_address, "redis_url": infra.redis_address, "shift_samples":
              N_PROMPTS * N_SAMPLES, "shift_window_s": window, "shift_device": "cpu"}
    healthy = runner.run_check("shift", DiagnoseSettings(shift_policy=str(tiny_models.lm), **common))
    drifted = runner.run_check("shift", DiagnoseSettings(shift_policy=str(tiny_models.drifted_lm), **common))
    assert healthy.verdict is Verdict.PASS, healthy.summary
    assert healthy.details["samples"] == N_PROMPTS * N_SAMPLES
    assert healthy.value is not None and healthy.value > -150
    assert drifted.verdict is Verdict.ALARM, drifted.summary
    assert drifted.value is not None and drifted.value < -150
    assert "warm-up" in drifted.cure


def test_shift_reports_an_error_when_there_are_no_recent_rollouts(infra: StrataSettings, tiny_models) -> None:
    result = runner.run_check("shift", DiagnoseSettings(
        kafka_bootstrap=infra.kafka_address, redis_url=infra.redis_address, shift_policy=str(tiny_models.lm),
        shift_window_s=1e-3, shift_device="cpu"))
    assert result.verdict is Verdict.ERROR
    assert "no tier-1 rollouts" in result.summary
