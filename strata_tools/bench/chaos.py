"""``strata bench chaos``: a steady stream of prompts through the real stack while faults hit it;
afterwards every accepted prompt must have exactly one set of final rewards.

The six services run as ``strata up`` runs them: children of the stack supervisor
(``strata_tools.stack.supervisor``, here in-process), which restarts crashed and hung ones, on the bench's
own Kafka and Redis and the ``--zoo`` preset's models, the learner training and the generators
following its policy. One client submits an eval prompt every ``--pace`` seconds, each under a
request id of its own that a retry keeps (UNAVAILABLE while the scheduler or Kafka is down is
retried for up to ``--accept-timeout`` seconds; a prompt never answered is "not accepted").

Meanwhile a fault script, on ``--seed``, works through a shuffled schedule, one fault every
``--spacing`` seconds:

- ``sigkill``: SIGKILL each service in turn (scheduler, probe, each generator, reward, learner);
- ``hang``: SIGSTOP one service, which answers nothing until the supervisor's health checks kill it;
- ``kafka-restart`` and ``redis-restart``: stop the broker or server (graceful) and start it again;
- ``redis-pause``: ``CLIENT PAUSE`` for ``--pause-ms``;
- ``poison``: an undecodable prompt event, a NaN reward, a forged policy update (a path outside the
  checkpoint root) and a rollout whose texts are not in the content store.

Then it waits up to ``--settle-timeout`` seconds for every accepted prompt's final rewards and counts,
per accepted request: its distinct final rewards (one expected; a second one is *doubled*; the same
event delivered twice is a redelivery, counted apart), none (*lost* if it was dead-lettered or no
tier still has work queued, *stuck* if some tier's consumer group is still behind), and the
learner's applied batches (a batch id twice in the newest checkpoint is *doubled* too). The poison
events must land in the dead-letter topics, and nothing else. Last line:
``chaos faults=<n> accepted=<a> lost=<l> doubled=<d> stuck=<s>``.

``--cluster`` runs the same stream on three Kafka brokers (topics replicated 3 times, 2 in sync)
and a Redis primary with a replica and three Sentinels, and swaps the faults for those of a cluster,
twice over: SIGKILL the broker that leads most of Strata's partitions, restart it; SIGKILL the Redis
primary (the Sentinels promote the replica), restart it (it returns as a replica). Each fault's
*stall* is the longest gap between two final rewards from the fault to the next one, beside the
longest gap of the lead-in (the stream's own rhythm).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from strata import redis_client

SERVICES = ("scheduler", "probe", "generator-l1", "generator-l2", "reward", "learner")
POISONS = ("undecodable-prompt", "nan-reward", "forged-policy", "missing-content")
# Consumer groups whose work ends in a final reward: one behind at the end means work still queued.
WORK_GROUPS = ("svc-probe", "svc-generator-l1", "svc-generator-l2", "svc-reward")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zoo", default="ci", help="zoo preset whose models the services serve")
    parser.add_argument("--seed", type=int, default=0, help="orders the faults and picks the prompts")
    parser.add_argument("--pace", type=float, default=2.0, help="seconds between two submitted prompts")
    parser.add_argument("--spacing", type=float, default=20.0, help="seconds between two faults")
    parser.add_argument("--lead-in", type=float, default=20.0, help="seconds of stream before the first fault")
    parser.add_argument("--pause-ms", type=int, default=5000, help="how long CLIENT PAUSE holds Redis")
    parser.add_argument("--accept-timeout", type=float, default=90.0,
                        help="seconds a prompt is retried before it counts as not accepted")
    parser.add_argument("--settle-timeout", type=float, default=600.0,
                        help="seconds to wait, after the last fault, for every accepted prompt's final rewards")
    parser.add_argument("--health-grace", type=float, default=60.0,
                        help="seconds after a (re)start before the supervisor checks a service's health")
    parser.add_argument("--learner-batch", type=int, default=16, help="samples per PPO update")
    parser.add_argument("--out", type=Path, default=None, help="also write the fault log and figures here (JSON)")
    parser.add_argument("--cluster", action="store_true",
                        help="three brokers and Redis with Sentinel; kill and restart the leader broker and the "
                        "Redis primary (twice each)")


# -- the schedule and the tally (pure) ---------------------------------------------------------------


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


def stalls(final_times: Sequence[float], fault_times: Sequence[float], end_time: float) -> list[float]:
    """Per fault, the longest gap between final rewards from the last one before it until the next
    fault (or ``end_time``); a window with no final reward at all counts to its end."""
    times = sorted(final_times)
    result = []
    for i, start in enumerate(fault_times):
        stop = fault_times[i + 1] if i + 1 < len(fault_times) else end_time
        before = [t for t in times if t < start]
        inside = [t for t in times if start <= t < stop]
        points = ([before[-1]] if before else [start]) + inside
        if not inside:
            points.append(stop)
        result.append(max((b - a for a, b in pairwise(points)), default=0.0))
    return result


def rhythm(final_times: Sequence[float], first_fault: float) -> float:
    """The longest gap between final rewards before the first fault: the stream's own pace."""
    times = sorted(t for t in final_times if t < first_fault)
    return max((b - a for a, b in pairwise(times)), default=0.0)


@dataclass(frozen=True)
class FinalReward:
    sample_index: int
    response_hash: str
    scorer: int


@dataclass
class Tally:
    accepted: int
    served: int                 # accepted requests with exactly one final reward per sample
    lost: list[str]             # accepted, no final reward, dead-lettered or no work queued anywhere
    stuck: list[str]            # accepted, no final reward, some tier still behind
    doubled: list[str]          # accepted requests with two different final rewards for one sample
    redelivered: int            # the same final event seen again (at-least-once; consumers dedupe)
    served_unacknowledged: int  # finals for requests the client never saw accepted (a retry's twin)


def tally(accepted: Sequence[str], finals: dict[str, list[FinalReward]], dead: set[str],
          work_queued: bool, n_samples: int = 1) -> Tally:
    """What became of each accepted request, from the final reward events seen for it."""
    lost, stuck, doubled = [], [], []
    served = redelivered = 0
    for request in accepted:
        events = finals.get(request, [])
        distinct = set(events)
        redelivered += len(events) - len(distinct)
        per_sample = Counter(f.sample_index for f in distinct)
        if not distinct:
            (stuck if work_queued and request not in dead else lost).append(request)
        elif any(count > 1 for count in per_sample.values()) or len(per_sample) > n_samples:
            doubled.append(request)
        else:
            served += 1
    known = set(accepted)
    unacknowledged = sum(1 for request in finals if request not in known and not request.startswith("poison-"))
    return Tally(len(accepted), served, lost, stuck, doubled, redelivered, unacknowledged)


def doubled_batches(batch_ids: Sequence[str]) -> list[str]:
    """Batch ids a checkpoint lists more than once: a batch whose learning was applied twice."""
    return sorted(batch for batch, count in Counter(batch_ids).items() if count > 1)


# -- the run -----------------------------------------------------------------------------------------


@dataclass
class FaultRecord:
    fault: Fault
    started_s: float = 0.0
    recovered_s: float | None = None  # seconds until the target answered again (None: not measured)
    note: str = ""
    wall_at: float = 0.0  # time.time() at injection, to place it among the final rewards
    stall_s: float | None = None  # the longest gap between final rewards until the next fault


@dataclass
class Stream:
    accepted: list[str] = field(default_factory=list)
    not_accepted: list[str] = field(default_factory=list)
    retries: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Outcomes:
    """Final rewards per request id and the dead letters, read from Kafka from the run's start.

    Read again from the start at each look rather than tailed: a reader that lived through the
    broker's restart could skip events (its position reset to the end), which would count as lost.
    """

    def __init__(self, settings: Any, since_ms: int) -> None:
        self._settings = settings
        self._since_ms = since_ms
        self.finals: dict[str, list[FinalReward]] = {}
        self.final_times: list[float] = []  # scored_at of each distinct final reward, epoch seconds
        self.dead: set[str] = set()
        self.dead_letters: Counter = Counter()  # DLQ topic -> records

    def read(self) -> None:
        from strata.bus import topics
        from strata.bus.tail import TailReader

        watched = [topics.REWARDS_SCORED, topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2,
                   topics.ROLLOUTS_GENERATED, topics.POLICY_UPDATED]
        dlqs = {t.dlq for t in watched}
        dead_letter_topics = [topics.Topic(t.dlq, t.message_type, t.key_field) for t in watched]
        reader = TailReader(self._settings, [*watched, *dead_letter_topics], client_id=f"chaos-{uuid.uuid4().hex[:6]}")
        finals: dict[str, list[FinalReward]] = {}
        times: dict[tuple[str, int], float] = {}
        dead: set[str] = set()
        dead_letters: Counter = Counter()
        try:
            reader.seek_to_time(self._since_ms)
            ends = reader.end_offsets()
            for tp, end in ends.items():  # the bench's own Kafka: a DLQ holds this run's dead letters only
                if tp.topic in dlqs and end:
                    dead_letters[tp.topic] += end
            while not reader.reached(ends):
                for topic, event in reader.poll(1.0):
                    if topic.name in dlqs:
                        dead.add(getattr(event, "request_id", "") or getattr(event, "prompt_hash", ""))
                    elif topic is topics.REWARDS_SCORED and event.final:
                        finals.setdefault(event.request_id, []).append(
                            FinalReward(event.sample_index, event.response_hash, event.scorer))
                        times.setdefault((event.request_id, event.sample_index),
                                         event.scored_at.ToMilliseconds() / 1000.0)
        finally:
            reader.close()
        self.finals, self.dead, self.dead_letters = finals, dead, dead_letters
        self.final_times = list(times.values())

    def settle(self, requests: Sequence[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.read()
            if all(r in self.finals or r in self.dead for r in requests) or time.monotonic() > deadline:
                return
            time.sleep(5.0)


def run(args: argparse.Namespace) -> int:
    from strata.config import StrataSettings
    from strata.errors import CliError
    from strata_tools.bench.infra import bench_infra
    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    if args.pace <= 0 or args.spacing <= 0:
        raise CliError("--pace and --spacing must be positive")
    settings = StrataSettings()
    run_id = uuid.uuid4().hex[:8]
    zoo = ensure_zoo(ZooSettings(cache_dir=settings.cache_dir, zoo_preset=args.zoo))
    with bench_infra(settings, run_id, "chaos", cluster=args.cluster) as infra:
        if not (infra.kafka_managed and infra.redis_managed):
            raise CliError("the chaos bench restarts Kafka and Redis: it needs its own (unset STRATA_KAFKA_BOOTSTRAP "
                           "and STRATA_REDIS_URL)")
        return _run(args, infra, zoo, run_id)


def _specs(infra: Any, zoo_preset: str, checkpoints: Path, learner_batch: int) -> list[Any]:
    from strata_tools.infra.process import free_port
    from strata_tools.stack.spec import ServiceSpec

    common = {"STRATA_KAFKA_BOOTSTRAP": infra.kafka_address, "STRATA_REDIS_URL": infra.redis_address,
              "STRATA_STATE_DIR": str(infra.state_dir), "STRATA_ZOO_PRESET": zoo_preset, "STRATA_DEVICE": "cpu",
              "STRATA_LOG_LEVEL": "INFO", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "STRATA_CACHE_DIR": str(infra.cache_dir),
              # With a replica, a generator's claim waits until the replica has it (Redis WAIT).
              "STRATA_REDIS_WAIT_REPLICAS": str(min(1, infra.redis_replicas))}
    own: dict[str, tuple[str, tuple[str, ...], dict[str, str]]] = {
        "scheduler": ("svc_scheduler", (), {"STRATA_AUDIT_SHARE": "0",
                                            "STRATA_POLICY_CHECKPOINT_ROOT": str(checkpoints)}),
        "probe": ("svc_probe", (), {}),
        "generator-l1": ("svc_generator", ("--tier", "1"), {"STRATA_POLICY_CHECKPOINT_ROOT": str(checkpoints)}),
        "generator-l2": ("svc_generator", ("--tier", "2"), {}),
        "reward": ("svc_reward", (), {}),
        "learner": ("svc_learner", (), {"STRATA_CHECKPOINT_DIR": str(checkpoints),
                                        "STRATA_BATCH_SIZE": str(learner_batch)}),
    }
    ports: list[int] = []
    for _ in own:
        ports.append(free_port(avoid=ports))
    return [ServiceSpec(name, module, port, argv, env={**common, **env})
            for (name, (module, argv, env)), port in zip(own.items(), ports, strict=True)]


@contextmanager
def _supervised(specs: Sequence[Any], state_dir: Path, health_grace_s: float) -> Iterator[Any]:
    from strata_tools.stack.control import health
    from strata_tools.stack.supervisor import Supervisor

    supervisor = Supervisor(list(specs), state_dir, grace_s=20.0, health_interval_s=3.0,
                            health_grace_s=health_grace_s, health_timeout_s=3.0, health_failures_to_kill=3)
    thread = threading.Thread(target=supervisor.run, name="supervisor", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 600
        pending = {s.name: s.port for s in specs}
        while pending:
            pending = {name: port for name, port in pending.items() if not health(port)}
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"not healthy after 600 s: {', '.join(pending)}; logs in {state_dir / 'logs'}")
            time.sleep(1.0)
        yield supervisor
    finally:
        supervisor.stop()
        thread.join(timeout=120)


def _pids(state_dir: Path) -> dict[str, int | None]:
    from strata_tools.stack.supervisor import state_file

    services = json.loads(state_file(state_dir).read_text())["services"]
    return {name: state.get("pid") for name, state in services.items()}


def _submit_stream(address: str, prompts: Sequence[str], run_id: str, pace_s: float, accept_timeout_s: float,
                   stream: Stream, stop: threading.Event) -> None:
    import grpc

    from strata import rpc
    from strata.config import StrataSettings
    from strata.v1 import scheduler_pb2, scheduler_pb2_grpc

    retry = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
             grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
    channel = rpc.channel(address, StrataSettings())
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    try:
        for i, prompt in enumerate(prompts):
            if stop.is_set():
                return
            next_at = time.monotonic() + pace_s
            request_id = f"chaos-{run_id}-{i}"
            give_up = time.monotonic() + accept_timeout_s
            while True:
                try:
                    stub.Submit(scheduler_pb2.SubmitRequest(prompt=prompt, n_samples=1, request_id=request_id),
                                timeout=10.0)
                    with stream.lock:
                        stream.accepted.append(request_id)
                    break
                except grpc.RpcError as exc:
                    code = exc.code()  # type: ignore[attr-defined]
                    if code not in retry or time.monotonic() > give_up:
                        with stream.lock:
                            stream.not_accepted.append(f"{request_id} ({code.name})")
                        break
                    with stream.lock:
                        stream.retries[code.name] += 1
                    time.sleep(1.0)
            stop.wait(max(0.0, next_at - time.monotonic()))
    finally:
        channel.close()


class Injector:
    """Carries out one fault and measures how long its target took to answer again."""

    def __init__(self, infra: Any, specs: Sequence[Any], state_dir: Path, checkpoints: Path, pause_ms: int,
                 run_id: str) -> None:
        from strata.bus import Publisher

        self.infra, self.state_dir, self.checkpoints, self.pause_ms = infra, state_dir, checkpoints, pause_ms
        self.ports = {s.name: s.port for s in specs}
        self.run_id = run_id
        self._publisher: Publisher | None = None
        self._killed_broker: int | None = None
        self._killed_redis: Any = None

    def publisher(self) -> Any:
        from strata.bus import Publisher

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
            from strata_tools.infra import kafka_broker

            kafka_broker.stop(self.infra)
            kafka_broker.start(self.infra)
            record.recovered_s = time.monotonic() - started
        elif fault.kind == "redis-restart":
            from strata_tools.infra import redis_server

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
        from strata_tools.infra import kafka_broker, redis_server

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
        from strata_tools.stack.control import health

        pid = _pids(self.state_dir).get(name)
        return pid is not None and pid != old_pid and health(self.ports[name])

    @staticmethod
    def _until(condition: Callable[[], bool], timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.5)
        return time.monotonic()

    def _poison(self, kind: str) -> str:
        from strata.bus import topics
        from strata.v1 import common_pb2, events_pb2

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
    from kafka import KafkaAdminClient

    from strata.bus import topics
    from strata.bus.security import kafka_connection

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
    import redis

    from strata_tools.infra import redis_server

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
    import redis

    from strata_tools.infra import redis_server

    try:
        client = redis_client.connect(redis_server.node_url(infra, node), socket_timeout=2)
        try:
            info = client.info("replication")
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


def _say(line: str) -> None:
    """Print ``line`` at once: the fault log is read while the run goes on."""
    print(line, flush=True)


def _run(args: argparse.Namespace, infra: Any, zoo: Any, run_id: str) -> int:
    from strata.bus.admin import consumer_lags

    # The clients of this process see every restart of Kafka; the fault log says what happened.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    logging.getLogger("strata.supervisor").setLevel(logging.WARNING)

    state_dir = Path(infra.state_dir) / "stack"
    checkpoints = Path(infra.state_dir) / "checkpoints"
    specs = _specs(infra, args.zoo, checkpoints, args.learner_batch)
    faults = cluster_schedule(args.lead_in, args.spacing) if args.cluster else \
        schedule(args.seed, args.lead_in, args.spacing)
    stream_s = faults[-1].at_s + args.spacing
    prompts = _prompts(args.seed, int(stream_s / args.pace) + 1)
    _say(f"chaos bench: {args.zoo} zoo ({zoo.config.config_hash()}), seed {args.seed}, {len(faults)} faults of "
         f"{len({f.kind for f in faults})} kinds every {args.spacing:g} s, a prompt every {args.pace:g} s "
         f"for {stream_s:.0f} s")
    _say("starting the six services under the supervisor ...")
    started_at = time.monotonic()
    with _supervised(specs, state_dir, args.health_grace):
        _say(f"  healthy in {time.monotonic() - started_at:.0f} s; the fault log:")
        outcomes = Outcomes(infra, int(time.time() * 1000))
        injector = Injector(infra, specs, state_dir, checkpoints, args.pause_ms, run_id)
        stream, stop = Stream(), threading.Event()
        scheduler_address = f"127.0.0.1:{next(s.port for s in specs if s.name == 'scheduler')}"
        submitter = threading.Thread(target=_submit_stream, name="stream", daemon=True, args=(
            scheduler_address, prompts, run_id, args.pace, args.accept_timeout, stream, stop))
        stream_started = time.monotonic()
        submitter.start()
        try:
            fault_log = _inject_all(faults, injector, stream_started)
            submitter.join(timeout=max(0.0, stream_started + stream_s + args.accept_timeout - time.monotonic()))
            stop.set()
            submitter.join(timeout=30)
            _say(f"stream done: {len(stream.accepted)} accepted, {len(stream.not_accepted)} not accepted, "
                 f"retries {dict(stream.retries) or 'none'}; settling ...")
            stream_ended = time.time()
            settle_started = time.monotonic()
            outcomes.settle(stream.accepted, args.settle_timeout)
            for record, stall in zip(fault_log, stalls(outcomes.final_times, [r.wall_at for r in fault_log],
                                                       stream_ended), strict=True):
                record.stall_s = stall
            pace_gap = rhythm(outcomes.final_times, fault_log[0].wall_at) if fault_log else 0.0
            _say(f"  settled in {time.monotonic() - settle_started:.0f} s")
            lags = consumer_lags(infra, WORK_GROUPS)
        finally:
            stop.set()
            injector.close()
        batch_ids, learner_version = _learner_batches(checkpoints)
    behind = {f"{g}/{t}": lag for (g, t), lag in lags.items() if lag > 0}
    result = tally(stream.accepted, outcomes.finals, outcomes.dead, work_queued=bool(behind))
    twice = doubled_batches(batch_ids)
    return report(args, fault_log, stream, result, outcomes, behind, batch_ids, twice, learner_version, pace_gap)


def _prompts(seed: int, n: int) -> list[str]:
    """``n`` eval prompts (all of them if fewer), drawn by ``seed``."""
    from strata_tools.zoo.suite import load_suite

    records = load_suite("eval")
    rng = random.Random(seed)
    return [r.text for r in rng.sample(records, min(len(records), n))]


def _inject_all(faults: Sequence[Fault], injector: Injector, stream_started: float) -> list[FaultRecord]:
    """Each fault at its time after the stream started, logged as it happens; returns the fault log."""
    fault_log: list[FaultRecord] = []
    for fault in faults:
        wait = stream_started + fault.at_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        record = FaultRecord(fault, started_s=time.monotonic() - stream_started, wall_at=time.time())
        injector.inject(record, _say)
        fault_log.append(record)
    return fault_log


def _learner_batches(checkpoints: Path) -> tuple[list[str], int]:
    """(the batch ids applied, the policy version) of the learner's newest checkpoint; ([], 0) without one."""
    from svc_learner.checkpoint import latest_checkpoint, verify_checkpoint

    latest = latest_checkpoint(checkpoints)
    if latest is None:
        return [], 0
    info = verify_checkpoint(latest)
    return list(info.applied.batch_ids), info.version


def report(args: argparse.Namespace, fault_log: Sequence[FaultRecord], stream: Stream, result: Tally,
           outcomes: Outcomes, behind: dict[str, int], batch_ids: Sequence[str], twice: Sequence[str],
           learner_version: int, pace_gap: float = 0.0) -> int:
    print()
    print(f"{'at':>6}  {'fault':<14} {'target':<18} {'back in':>8} {'stall':>8}  note")
    for record in fault_log:
        back = "-" if record.recovered_s is None else f"{record.recovered_s:.1f} s"
        stall = "-" if record.stall_s is None else f"{record.stall_s:.1f} s"
        print(f"{record.started_s:>5.0f}s  {record.fault.kind:<14} {record.fault.target:<18} {back:>8} {stall:>8}  "
              f"{record.note}")
    print(f"stall: the longest gap between two final rewards from the fault to the next; before the first "
          f"fault the longest was {pace_gap:.1f} s")
    print()
    print(f"accepted {result.accepted}; served exactly once {result.served}; lost {len(result.lost)}; "
          f"doubled {len(result.doubled)}; stuck {len(result.stuck)}")
    print(f"not accepted (the client gave up): {len(stream.not_accepted)} {stream.not_accepted[:5] or ''}")
    print(f"final events delivered twice (deduped downstream): {result.redelivered}; "
          f"finals of requests never acknowledged to the client: {result.served_unacknowledged}")
    print(f"dead letters: {dict(outcomes.dead_letters) or 'none'}")
    print(f"learner: policy v{learner_version}, {len(batch_ids)} batches in its newest checkpoint, "
          f"{len(twice)} applied twice")
    if behind:
        print(f"consumer groups still behind: {behind}")
    for name, requests in (("lost", result.lost), ("doubled", result.doubled), ("stuck", result.stuck)):
        if requests:
            print(f"{name}: {', '.join(requests[:10])}")
    faults = len([r for r in fault_log if "not running" not in r.note])
    doubled = len(result.doubled) + len(twice)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "seed": args.seed, "zoo": args.zoo, "faults": [
                {"at_s": round(r.started_s, 1), "kind": r.fault.kind, "target": r.fault.target,
                 "recovered_s": None if r.recovered_s is None else round(r.recovered_s, 1),
                 "stall_s": None if r.stall_s is None else round(r.stall_s, 1), "note": r.note}
                for r in fault_log],
            "cluster": args.cluster, "lead_in_longest_gap_s": round(pace_gap, 1),
            "accepted": result.accepted, "served": result.served, "lost": result.lost, "doubled": result.doubled,
            "stuck": result.stuck, "not_accepted": stream.not_accepted, "redelivered": result.redelivered,
            "dead_letters": dict(outcomes.dead_letters), "learner_batches": len(batch_ids),
            "learner_batches_twice": list(twice), "learner_version": learner_version,
        }, indent=2) + "\n")
    print(f"chaos faults={faults} accepted={result.accepted} lost={len(result.lost)} doubled={doubled} "
          f"stuck={len(result.stuck)}")
    return 0 if not (result.lost or doubled or result.stuck) else 1
