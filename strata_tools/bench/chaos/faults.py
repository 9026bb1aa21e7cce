"""The faults of ``strata bench chaos``: what hits the stack and when (``schedule``, ``cluster_schedule``:
the services SIGKILLed and hung, Kafka and Redis restarted or paused, the poison events, or the cluster's
leader broker and Redis primary killed and restarted) and the ``Injector`` that carries each one out and
measures how long its target took to answer again (``FaultRecord``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from kafka import KafkaAdminClient

from strata import redis_client
from strata.bus import Publisher, topics
from strata.bus.security import kafka_connection
from strata.v1 import common_pb2, events_pb2
from strata_tools.infra import kafka_broker, redis_server
from strata_tools.stack.control import health
from strata_tools.stack.supervisor import state_file

SERVICES = ("scheduler", "probe", "generator-l1", "generator-l2", "reward", "learner")
POISONS = ("undecodable-prompt", "nan-reward", "forged-policy", "missing-content")


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the stream started
    kind: str    # sigkill | hang | kafka-restart | redis-restart | redis-pause | poison
    target: str  # a service, "kafka", "redis", or a poison kind


def schedule(seed: int, lead_in_s: float, spacing_s: float, hang_target: str | None = None) -> list[Fault]:
    """Every fault of a run, in an order shuffled by ``seed``: each service SIGKILLed once, one hung,
    Kafka and Redis restarted, Redis paused, and each kind of poison once (13 faults of 6 kinds)."""
    rng = random.Random(seed)
    faults = [("sigkill", name) for name in SERVICES]
    faults.append(("hang", hang_target or rng.choice([s for s in SERVICES if s != "learner"])))
    faults += [("kafka-restart", "kafka"), ("redis-restart", "redis"), ("redis-pause", "redis")]
    faults += [("poison", kind) for kind in POISONS]
    rng.shuffle(faults)
    return [Fault(lead_in_s + i * spacing_s, kind, target) for i, (kind, target) in enumerate(faults)]


CLUSTER_FAULTS = (("broker-kill", "leader"), ("broker-restart", "leader"),
                  ("primary-kill", "redis"), ("primary-restart", "redis"))


def cluster_schedule(lead_in_s: float, spacing_s: float, rounds: int = 2) -> list[Fault]:
    """The cluster faults in their only sensible order (a restart follows its kill), ``rounds`` times."""
    faults = [fault for _ in range(rounds) for fault in CLUSTER_FAULTS]
    return [Fault(lead_in_s + i * spacing_s, kind, target) for i, (kind, target) in enumerate(faults)]


@dataclass
class FaultRecord:
    fault: Fault
    started_s: float = 0.0
    recovered_s: float | None = None  # seconds until the target answered again (None: not measured)
    note: str = ""
    wall_at: float = 0.0  # time.time() at injection, to place it among the final rewards
    stall_s: float | None = None  # the longest gap between final rewards until the next fault


def _pids(state_dir: Path) -> dict[str, int | None]:
    services = json.loads(state_file(state_dir).read_text())["services"]
    return {name: state.get("pid") for name, state in services.items()}


class Injector:
    """Carries out one fault and measures how long its target took to answer again."""

    def __init__(self, infra: Any, specs: Sequence[Any], state_dir: Path, checkpoints: Path, pause_ms: int,
                 run_id: str) -> None:
        self.infra, self.state_dir, self.checkpoints, self.pause_ms = infra, state_dir, checkpoints, pause_ms
        self.ports = {s.name: s.port for s in specs}
        self.run_id = run_id
        self._publisher: Publisher | None = None
        self._killed_broker: int | None = None
        self._killed_redis: Any = None

    def publisher(self) -> Any:
        if self._publisher is None:
            self._publisher = Publisher(self.infra, client_id="chaos-poison")
        return self._publisher

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()

    def inject(self, record: FaultRecord, log: Callable[[str], None]) -> None:
        fault = record.fault
        started = time.monotonic()
        if fault.kind in ("sigkill", "hang"):
            pid = _pids(self.state_dir).get(fault.target)
            if pid is None:
                record.note = "not running at that moment (in backoff)"
                return
            os.kill(pid, signal.SIGKILL if fault.kind == "sigkill" else signal.SIGSTOP)
            record.note = f"pid {pid}"
            record.recovered_s = self._until(lambda: self._new_pid_serving(fault.target, pid), 600) - started
        elif fault.kind == "kafka-restart":
            kafka_broker.stop(self.infra)
            kafka_broker.start(self.infra)
            record.recovered_s = time.monotonic() - started
        elif fault.kind == "redis-restart":
            redis_server.stop(self.infra)
            redis_server.start(self.infra)
            record.recovered_s = time.monotonic() - started
        elif fault.kind == "redis-pause":

            client = redis_client.connect(self.infra.redis_address, socket_timeout=10)
            try:
                client.execute_command("CLIENT", "PAUSE", self.pause_ms, "ALL")
            finally:
                client.close()
            record.note = f"{self.pause_ms} ms"
        elif fault.kind == "poison":
            record.note = self._poison(fault.target)
        elif fault.kind in ("broker-kill", "broker-restart", "primary-kill", "primary-restart"):
            self._cluster_fault(record, started)
        log(f"  {time.strftime('%H:%M:%S')} {fault.kind:<13} {fault.target:<18} {record.note}"
            + ("" if record.recovered_s is None else f" back in {record.recovered_s:.1f} s"))

    def _cluster_fault(self, record: FaultRecord, started: float) -> None:
        """Kill or restart the leader broker or the Redis primary; ``recovered_s``: until the cluster
        serves again (every partition led by a live broker; a primary that takes writes; the
        restarted node back in sync)."""
        kind = record.fault.kind
        if kind == "broker-kill":
            node, led = _busiest_leader(self.infra)
            kafka_broker.stop_node(self.infra, node, kill=True)
            self._killed_broker = node
            record.note = f"broker {node} (led {led} partitions)"
            record.recovered_s = self._until(lambda: _leaders_live(self.infra, node), 120) - started
        elif kind == "broker-restart" and self._killed_broker is not None:
            node, self._killed_broker = self._killed_broker, None
            kafka_broker.start_node(self.infra, node)
            record.note = f"broker {node}"
            record.recovered_s = self._until(lambda: _in_sync(self.infra, node), 120) - started
        elif kind == "primary-kill":
            port = redis_server.current_primary_port(self.infra)
            node = next(n for n in redis_server.redis_nodes(self.infra) if n.port == port)
            redis_server.stop_node(self.infra, node, kill=True)
            self._killed_redis = node
            record.note = f"primary :{port}"
            record.recovered_s = self._until(lambda: _primary_writable(self.infra, port), 120) - started
            record.note += f", now :{redis_server.current_primary_port(self.infra)}"
        elif kind == "primary-restart" and self._killed_redis is not None:
            node, self._killed_redis = self._killed_redis, None
            redis_server.start_node(self.infra, node)
            record.note = f":{node.port} back as a replica"
            record.recovered_s = self._until(lambda: _replica_linked(self.infra, node), 120) - started
        else:
            record.note = "nothing to restart"

    def _new_pid_serving(self, name: str, old_pid: int) -> bool:
        pid = _pids(self.state_dir).get(name)
        return pid is not None and pid != old_pid and health(self.ports[name])

    @staticmethod
    def _until(condition: Callable[[], bool], timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.5)
        return time.monotonic()

    def _poison(self, kind: str) -> str:
        tag = f"poison-{self.run_id}-{kind}"
        fake = uuid.uuid4().hex * 2  # a sha256-shaped hash no content has
        publisher = self.publisher()
        if kind == "undecodable-prompt":
            publisher.publish_raw(topics.PROMPTS_LEVEL1.name, fake.encode(), b"\xff\xfe not a PromptRouted")
        elif kind == "nan-reward":
            publisher.publish_and_wait(topics.REWARDS_SCORED, events_pb2.RewardScored(
                prompt_hash=fake, response_hash=fake, tier=common_pb2.TIER_LEVEL_1, reward=float("nan"),
                final=True, scorer=common_pb2.SCORER_LIGHT, request_id=tag))
        elif kind == "forged-policy":
            publisher.publish_and_wait(topics.POLICY_UPDATED, events_pb2.PolicyUpdated(
                policy_version=2**62, checkpoint_path="/etc", checksum="0" * 64, lineage="forged"))
        elif kind == "missing-content":
            publisher.publish_and_wait(topics.ROLLOUTS_GENERATED, events_pb2.RolloutGenerated(
                prompt_hash=fake, response_hash=fake, tier=common_pb2.TIER_LEVEL_1, request_id=tag))
        else:
            raise ValueError(f"unknown poison {kind!r}")
        return f"published ({tag})"


def _strata_partitions(infra: Any) -> list[dict]:
    admin = KafkaAdminClient(**kafka_connection(infra), client_id="chaos-cluster", request_timeout_ms=5000)
    try:
        return [p for t in admin.describe_topics([t.name for t in topics.ALL_TOPICS]) for p in t["partitions"]]
    finally:
        admin.close()


def _busiest_leader(infra: Any) -> tuple[int, int]:
    """(the broker leading most of Strata's partitions, how many it leads)."""
    led = Counter(p["leader_id"] for p in _strata_partitions(infra) if p["leader_id"] >= 0)
    return led.most_common(1)[0]


def _leaders_live(infra: Any, dead: int) -> bool:
    try:
        return all(p["leader_id"] not in (-1, dead) for p in _strata_partitions(infra))
    except Exception:
        return False


def _in_sync(infra: Any, node: int) -> bool:
    try:
        return all(node in p["isr_nodes"] for p in _strata_partitions(infra))
    except Exception:
        return False


def _primary_writable(infra: Any, old_port: int) -> bool:
    """A write through the Sentinels lands on a primary other than the killed one."""
    if redis_server.current_primary_port(infra) in (None, old_port):
        return False
    try:
        client = redis_client.connect(infra.redis_address, socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(client.set("strata:chaos:probe", "1"))
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False


def _replica_linked(infra: Any, node: Any) -> bool:
    try:
        client = redis_client.connect(redis_server.node_url(infra, node), socket_timeout=2)
        try:
            info = client.info("replication")
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False
    return info.get("role") == "slave" and info.get("master_link_status") == "up"
