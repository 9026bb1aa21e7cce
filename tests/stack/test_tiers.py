"""Issue 4 acceptance on real Kafka and Redis with the zoo's models: Level-0 -> probe -> Level-1 /
Level-2 generators -> reward service -> final rewards, escalations and the three-field rollout log;
and a generator killed mid-stream (SIGKILL) loses nothing and duplicates nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from stackutil import Tail, spawn, submit

from strata.bus import topics
from strata.config import StrataSettings
from strata.service import RunningService, ServiceParts, start_service, stop_service
from strata.v1 import common_pb2, events_pb2
from strata_tools.task.suite import load_suite

pytestmark = pytest.mark.integration

TIMEOUT_S = 240.0


def service_settings(infra: StrataSettings, **extra) -> dict:
    return {"kafka_bootstrap": infra.kafka_address, "redis_url": infra.redis_address, "device": "cpu",
            "consumer_session_timeout_ms": 6000, "consumer_heartbeat_interval_ms": 1000, **extra}


@pytest.fixture(scope="module")
def stack(infra: StrataSettings, zoo) -> Iterator[dict]:
    """Probe, both generators and the reward service, in-process on free ports."""
    from svc_generator.__main__ import build as build_generator
    from svc_generator.config import GeneratorSettings
    from svc_probe.__main__ import build as build_probe
    from svc_probe.config import ProbeSettings
    from svc_reward.__main__ import build as build_reward
    from svc_reward.config import RewardSettings

    parts: list[ServiceParts] = [
        build_probe(ProbeSettings(**service_settings(infra, model=str(zoo.probe), grpc_port=0))),
        build_generator(GeneratorSettings(**service_settings(infra, tier=1, model=str(zoo.level1), grpc_port=0,
                                                             max_new_tokens=40))),
        build_generator(GeneratorSettings(**service_settings(infra, tier=2, model=str(zoo.level2), grpc_port=0,
                                                             max_new_tokens=40))),
        build_reward(RewardSettings(**service_settings(infra, light_rm=str(zoo.light_rm),
                                                       strong_rm=str(zoo.strong_rm), grpc_port=0))),
    ]
    running: list[RunningService] = []
    try:  # a service that fails to start must not leave the others consuming (later tests would see them)
        for p in parts:
            running.append(start_service(p))
        yield {"parts": parts, "running": running}
    finally:
        for p, r in zip(parts, running, strict=False):
            stop_service(p, r, grace_s=0)


def finals_by_request(events: list[events_pb2.RewardScored], requests: dict[str, str]) -> dict[str, list]:
    finals: dict[str, list] = defaultdict(list)
    for event in events:
        if event.request_id in requests and event.final:
            finals[event.request_id].append(event)
    return finals


def test_level0_prompts_come_out_as_final_rewards_with_escalations_and_hash_only_log(infra, stack) -> None:
    records = load_suite("eval")
    texts = [r.text for r in records if not r.risk][:10] + [r.text for r in records if r.risk][:3]
    rewards, log_tail = Tail(infra, topics.REWARDS_SCORED), Tail(infra, topics.ROLLOUT_LOG)
    try:
        requests = submit(infra, texts)
        seen = rewards.read(lambda evs: len(finals_by_request(evs, requests)) == len(requests))
        final_triples = {(v[0].prompt_hash, v[0].response_hash, round(v[0].reward, 6))
                         for v in finals_by_request(seen, requests).values()}
        log_records = log_tail.read(lambda recs: final_triples <= {
            (r.prompt_hash, r.response_hash, round(r.reward, 6)) for r in recs})
        log_records += log_tail.drain(seconds=2)  # a duplicate or a non-final record would come now
    finally:
        rewards.close()
        log_tail.close()
    ours = [e for e in seen if e.request_id in requests]
    finals = finals_by_request(seen, requests)
    assert all(len(v) == 1 for v in finals.values()), "a prompt got more than one final reward"
    level1 = [e for e in ours if e.tier == common_pb2.TIER_LEVEL_1]
    # Every Level-1 reward under the threshold escalated, and its prompt's final reward is Level-2.
    for event in level1:
        if event.reward < 3.2:
            assert event.escalated, f"Level-1 reward {event.reward:.2f} did not escalate"
        if not event.escalated:
            assert event.final and event.reward >= 3.2
        if event.escalated:
            assert not event.final
            assert finals[event.request_id][0].tier == common_pb2.TIER_LEVEL_2
            assert finals[event.request_id][0].scorer == common_pb2.SCORER_STRONG
    assert any(e.escalated for e in level1), "no Level-1 sample escalated"
    assert all(e.rm_version for e in ours)
    # The rollout log: exactly prompt hash, response hash and reward, one per final reward.
    # (Earlier runs may have logged the same prompts with other responses: ours are ours by pair.)
    our_pairs = {(e.prompt_hash, e.response_hash) for e in ours}
    ours_log = [r for r in log_records if (r.prompt_hash, r.response_hash) in our_pairs]
    assert [f.name for f in events_pb2.RolloutLogRecord.DESCRIPTOR.fields] == ["prompt_hash", "response_hash", "reward"]
    assert sorted((r.prompt_hash, r.response_hash, round(r.reward, 6)) for r in ours_log) == sorted(final_triples)


def test_the_neighbourhoods_record_reaches_the_reward_service_with_each_level1_answer(infra, stack) -> None:
    # The scheduler's record rides on the routed prompt; the probe and the generator pass it on unchanged,
    # so the reward service's escalation rule reads it off the rollout it scores.
    texts = [f"{r.text} ({time.time_ns()})" for r in load_suite("eval") if not r.risk][20:23]
    rollouts = Tail(infra, topics.ROLLOUTS_GENERATED)
    try:
        requests = submit(infra, texts, record=(6.0, 2.0))
        seen = rollouts.read(lambda evs: set(requests) <= {e.request_id for e in evs})
    finally:
        rollouts.close()
    ours = [e for e in seen if e.request_id in requests and e.tier == common_pb2.TIER_LEVEL_1]
    assert ours and all(e.HasField("level1_record") for e in ours)
    assert {(e.level1_record.labelled, e.level1_record.bad) for e in ours} == {(6.0, 2.0)}


def test_a_prompt_the_model_cannot_read_is_dead_lettered_once_and_its_batch_mates_served(infra, stack) -> None:
    # A prompt past the model's positions (which the scheduler refuses at the door) that reaches a
    # generator anyway: dead-lettered at the first attempt with the reason, not retried five times
    # inside one failing generation batch; the prompts beside it are rolled out.
    from kafka import KafkaConsumer, TopicPartition

    from strata.bus.security import kafka_connection

    dlq = KafkaConsumer(**kafka_connection(infra), enable_auto_commit=False, group_id=None)
    dlq_partitions = [TopicPartition(topics.PROMPTS_LEVEL1.dlq, p)
                      for p in sorted(dlq.partitions_for_topic(topics.PROMPTS_LEVEL1.dlq))]
    dlq.assign(dlq_partitions)
    dlq.seek_to_end(*dlq_partitions)
    for tp in dlq_partitions:
        dlq.position(tp)
    rollouts = Tail(infra, topics.ROLLOUTS_GENERATED)
    try:
        fine = [r.text for r in load_suite("eval") if not r.risk][40:43]
        too_long = "Please read all of this carefully before you answer. " * 60 + str(time.time_ns())
        requests = submit(infra, [*fine, too_long], tier=common_pb2.TIER_LEVEL_1)
        long_hash = next(h for rid, h in requests.items() if rid == list(requests)[-1])
        fine_ids = set(list(requests)[:-1])
        rollouts.read(lambda evs: fine_ids <= {e.request_id for e in evs})
        dead: list = []
        deadline = time.monotonic() + TIMEOUT_S
        while not dead:
            assert time.monotonic() < deadline, "the too-long prompt was not dead-lettered"
            for records in dlq.poll(timeout_ms=500).values():
                dead += [r for r in records if events_pb2.PromptRouted.FromString(r.value).prompt_hash == long_hash]
        headers = dict(dead[0].headers)
        assert headers["strata-dlq-attempts"] == b"1"
        assert b"positions of the Level-1 model" in headers["strata-dlq-error"]
    finally:
        dlq.close()
        rollouts.close()


def wait_for_log(path: Path, text: str, process: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until ``text`` appears in a service's log (it logs it once serving)."""
    deadline = time.monotonic() + timeout_s
    while text not in path.read_text(errors="replace"):
        assert process.poll() is None, f"the process exited with {process.returncode}: {path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"{text!r} not in {path} after {timeout_s:.0f} s"
        time.sleep(0.2)  # poll interval of a file written by another process


def test_generator_killed_mid_stream_loses_nothing_and_doubles_nothing(infra, stack, zoo, tmp_path) -> None:
    # Stop the in-process Level-1 generator and run one as a real process that we SIGKILL.
    parts, running = stack["parts"], stack["running"]
    stop_service(parts[1], running[1], grace_s=0)
    env = {**os.environ, "STRATA_KAFKA_BOOTSTRAP": infra.kafka_address, "STRATA_REDIS_URL": infra.redis_address,
           "STRATA_CONSUMER_SESSION_TIMEOUT_MS": "6000", "STRATA_CONSUMER_HEARTBEAT_INTERVAL_MS": "1000"}
    argv = [sys.executable, "-m", "svc_generator", "--tier", "1", "--model", str(zoo.level1), "--device", "cpu",
            "--grpc-port", "0", "--max-new-tokens", "40", "--max-batch-size", "4"]

    def start(name: str) -> subprocess.Popen:
        return spawn(argv, env, tmp_path / f"{name}.log")

    texts = [r.text for r in load_suite("eval") if not r.risk][10:26]
    rewards, rollouts = Tail(infra, topics.REWARDS_SCORED), Tail(infra, topics.ROLLOUTS_GENERATED)
    first = start("first")
    try:
        requests = submit(infra, texts)
        # Kill the generator as soon as it has published part of the work (mid-stream).
        rollouts.read(lambda evs: any(e.request_id in requests for e in evs))
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        second = start("second")
        try:
            seen = rewards.read(lambda evs: len(finals_by_request(evs, requests)) == len(requests))
            # A little longer: a duplicate final would show up now.
            seen += rewards.drain(seconds=5)
            # The first may have finished everything before the kill: the second must still be up (its
            # SIGTERM handler installed) before it is told to stop, or it dies of the signal mid-start.
            wait_for_log(tmp_path / "second.log", "gRPC serving", second)
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0, (tmp_path / "second.log").read_text()[-2000:]
        finally:
            if second.poll() is None:
                second.kill()
    finally:
        if first.poll() is None:
            first.kill()
        rewards.close()
        rollouts.close()
    finals = finals_by_request(seen, requests)
    assert set(finals) == set(requests)
    assert all(len(v) == 1 for v in finals.values()), {k: len(v) for k, v in finals.items() if len(v) != 1}

