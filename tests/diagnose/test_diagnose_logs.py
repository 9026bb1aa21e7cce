"""R14 at the service level: a full run's INFO logs carry hashes, never prompt or response text.

Probe, both generators and the reward service run in-process on real Kafka and Redis; prompts go in
at Level-0 and come out as final rewards (Level-1, escalations to Level-2), and the gRPC paths
(Generate, Score) are called too. Every log record at INFO and above is rendered as a handler would.
"""

from __future__ import annotations

import logging
import time
import uuid

import grpc
import pytest
from diagutil import TinyModels, service_settings, serving

from strata.bus import Publisher, topics
from strata.bus.tail import TailReader
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.v1 import common_pb2, events_pb2, generator_pb2, generator_pb2_grpc, reward_pb2, reward_pb2_grpc
from strata_tools.task.suite import load_suite

pytestmark = pytest.mark.integration


def stack_parts(infra: StrataSettings, models: TinyModels) -> list:
    from svc_generator.__main__ import build as build_generator
    from svc_generator.config import GeneratorSettings
    from svc_probe.__main__ import build as build_probe
    from svc_probe.config import ProbeSettings
    from svc_reward.__main__ import build as build_reward
    from svc_reward.config import RewardSettings

    return [
        # Every prompt to Level-1 (no caution), and every Level-1 reward escalates to Level-2 (R3).
        build_probe(ProbeSettings(**service_settings(infra, model=str(models.lm), min_confidence=0.0,
                                                     risk_threshold=1.0, risk_keywords="",
                                                     probe_method="likelihood"))),  # a tiny LM, no head
        *(build_generator(GeneratorSettings(**service_settings(
            infra, tier=tier, model=str(models.lm), max_new_tokens=12, follow_policy_updates=False)))
          for tier in (1, 2)),
        build_reward(RewardSettings(**service_settings(infra, light_rm=str(models.strong_rm),
                                                       strong_rm=str(models.random_rm), rm_watch=False,
                                                       escalation_threshold=5.1))),
    ]


def rendered(records: list[logging.LogRecord]) -> str:
    formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    return "\n".join(formatter.format(r) for r in records if r.levelno >= logging.INFO)


def test_a_full_run_logs_no_prompt_or_response_text_at_info(
        infra: StrataSettings, tiny_models: TinyModels, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    prompts = [r.text for r in load_suite("eval")[20:26]]
    store = ContentStore.from_url(infra.redis_address, infra.content_ttl_s, infra.content_max_bytes)
    rewards = TailReader(infra, [topics.REWARDS_SCORED], client_id="test-diagnose-logs")
    rewards.seek_to_end()
    publisher = Publisher(infra.kafka_address, client_id="test-diagnose-logs")
    finals: dict[str, events_pb2.RewardScored] = {}
    escalated: set[str] = set()
    responses: list[str] = []
    try:
        with serving(*stack_parts(infra, tiny_models)) as (_probe, gen1, _gen2, reward):
            requests = {}
            for text in prompts[:4]:  # the Kafka path: Level-0 -> probe -> generators -> reward
                routed = events_pb2.PromptRouted(prompt_hash=store.put(text), tier=common_pb2.TIER_LEVEL_0,
                                                 n_samples=1, request_id=uuid.uuid4().hex,
                                                 decision=common_pb2.DECISION_LEVEL_1)
                routed.routed_at.GetCurrentTime()
                publisher.publish(topics.PROMPTS_LEVEL0, routed)
                requests[routed.request_id] = text
            publisher.flush()
            deadline = time.monotonic() + 120
            while len(finals) < len(requests):
                assert time.monotonic() < deadline, f"{len(finals)} of {len(requests)} final rewards arrived"
                for _, event in rewards.poll(0.5):
                    if event.request_id in requests and event.final:
                        finals[event.request_id] = event
                    if event.request_id in requests and event.escalated:
                        escalated.add(event.request_id)
            with grpc.insecure_channel(f"127.0.0.1:{gen1}") as channel:  # the gRPC paths
                reply = generator_pb2_grpc.GeneratorStub(channel).Generate(
                    generator_pb2.GenerateRequest(prompt=prompts[4], n_samples=2), timeout=60)
            responses += [g.response for g in reply.generations]
            with grpc.insecure_channel(f"127.0.0.1:{reward}") as channel:
                reward_pb2_grpc.RewardStub(channel).Score(reward_pb2.ScoreRequest(
                    items=[reward_pb2.ScoreItem(prompt=prompts[5], response=responses[0])]), timeout=60)
    finally:
        publisher.close()
        rewards.close()
    responses += [store.get_text(e.response_hash) for e in finals.values()]
    logs = rendered(caplog.records)
    # The run did log about these prompts, by hash.
    assert escalated == set(requests), "the Level-1 -> Level-2 path was not exercised"
    assert all(e.tier == common_pb2.TIER_LEVEL_2 for e in finals.values())
    for event in finals.values():
        assert event.prompt_hash[:12] in logs
    # ... and never their text, nor the responses' (ignoring trivially short responses).
    for text in prompts:
        assert text not in logs, f"prompt text in the INFO logs: {text!r}"
    for text in responses:
        if len(text) >= 12:
            assert text not in logs, f"response text in the INFO logs: {text!r}"
