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
import logging
import random
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from strata import rpc
from strata.bus.admin import consumer_lags
from strata.config import StrataSettings
from strata.errors import CliError
from strata.v1 import scheduler_pb2, scheduler_pb2_grpc
from strata_tools.bench.chaos.faults import Fault, FaultRecord, Injector, cluster_schedule, schedule
from strata_tools.bench.chaos.outcomes import Outcomes, Stream, doubled_batches, report, rhythm, stalls, tally
from strata_tools.bench.infra import bench_infra
from strata_tools.infra.process import free_port
from strata_tools.stack.control import health
from strata_tools.stack.spec import ServiceSpec
from strata_tools.stack.supervisor import Supervisor
from strata_tools.task.suite import load_suite

__all__ = ["add_arguments", "run"]

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


def run(args: argparse.Namespace) -> int:
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


def _submit_stream(address: str, prompts: Sequence[str], run_id: str, pace_s: float, accept_timeout_s: float,
                   stream: Stream, stop: threading.Event) -> None:
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


def _say(line: str) -> None:
    """Print ``line`` at once: the fault log is read while the run goes on."""
    print(line, flush=True)


def _run(args: argparse.Namespace, infra: Any, zoo: Any, run_id: str) -> int:
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
