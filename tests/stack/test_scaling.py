"""Issue 8: two Level-1 generator processes in one consumer group share the work of one run, and
stopping one hands its partitions to the other with nothing lost (real Kafka, real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict

import pytest
from kafka import KafkaAdminClient
from kafka.errors import KafkaError
from stackutil import Tail, spawn, submit

from strata.bus import topics
from strata.v1 import common_pb2
from strata_tools.task.suite import load_suite

pytestmark = pytest.mark.integration


def group_members(bootstrap: str, group: str) -> int:
    """Members of a group that finished rebalancing (0 while it is still balancing)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        description = admin.describe_groups([group])[group]
        return len(description["members"]) if description["group_state"] == "Stable" else 0
    except KafkaError:  # e.g. no coordinator yet for a group nobody joined
        return 0
    finally:
        admin.close()


def test_two_generators_share_a_group_and_failover_loses_nothing(infra, zoo, tmp_path) -> None:
    group = f"scale-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "STRATA_KAFKA_BOOTSTRAP": infra.kafka_address, "STRATA_REDIS_URL": infra.redis_address,
           "STRATA_CONSUMER_SESSION_TIMEOUT_MS": "6000", "STRATA_CONSUMER_HEARTBEAT_INTERVAL_MS": "1000"}
    argv = [sys.executable, "-m", "svc_generator", "--tier", "1", "--model", str(zoo.level1), "--device", "cpu",
            "--grpc-port", "0", "--max-new-tokens", "24", "--max-batch-size", "4", "--group-id", group,
            "--no-follow-policy-updates"]
    logs = [tmp_path / "replica-a.log", tmp_path / "replica-b.log"]
    replicas = [spawn(argv, env, log) for log in logs]
    rollouts = Tail(infra, topics.ROLLOUTS_GENERATED)
    try:
        deadline = time.monotonic() + 180
        while group_members(infra.kafka_address, group) < 2:
            assert all(r.poll() is None for r in replicas), logs[0].read_text()[-2000:]
            assert time.monotonic() < deadline, "the two replicas did not both join the group"
            time.sleep(0.5)
        texts = [r.text for r in load_suite("train") if not r.risk][:24]
        requests = submit(infra, texts, tier=common_pb2.TIER_LEVEL_1)
        seen = rollouts.read(lambda evs: sum(e.request_id in requests for e in evs) >= 6)
        # Stop one replica mid-run: SIGTERM drains its batch, commits and leaves the group.
        replicas[0].send_signal(signal.SIGTERM)
        assert replicas[0].wait(60) == 0, logs[0].read_text()[-2000:]

        def all_done(events: list) -> bool:
            return {e.request_id for e in seen + events if e.request_id in requests} == set(requests)

        seen += rollouts.read(all_done)
        seen += rollouts.drain(seconds=3)
    finally:
        for replica in replicas:
            if replica.poll() is None:
                replica.send_signal(signal.SIGTERM)
                try:
                    replica.wait(60)
                except subprocess.TimeoutExpired:
                    replica.kill()
        rollouts.close()
    responses: dict[str, set[str]] = defaultdict(set)
    for event in seen:
        if event.request_id in requests:
            responses[event.request_id].add(event.response_hash)
    assert set(responses) == set(requests), "a prompt was lost in the hand-over"
    assert all(len(r) == 1 for r in responses.values()), "a prompt was generated twice"
    produced = [log.read_text().count("rollout tier=1") for log in logs]
    assert all(n > 0 for n in produced), f"the work was not shared: {produced}"
