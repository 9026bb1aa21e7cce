"""``strata bench edge``: the front door under abuse: Submit and health latency with 64 Watch streams
open and one client flooding Submit, against the same calls with no load, in one run.

The real services run as in ``strata bench tiers`` (each its own process, the ``--zoo`` preset's
models), on the bench's own Kafka and Redis, with bearer tokens on at the scheduler and its limits
as configured (``--flood-rate`` / ``--flood-burst`` are the per-client Submit rate and burst). After
a warm-up whose prompts are served first, one measuring client alternates a Submit (a fresh eval
prompt, one sample) and a health check, one pair every ``--pace`` seconds (under its own rate):

1. **idle**: nothing else happens;
2. **load**: four clients hold 16 Watch streams each (64, the replica's default cap) on hashes no
   one submits, while a fifth floods Submit with valid prompts from ``--flood-threads`` threads as
   fast as the server answers.

Afterwards every prompt the scheduler accepted (the measurer's and the flooder's) is followed to its
final rewards; one that was dead-lettered instead was "refused late" (the door should have refused
it). Last line: ``edge submit_p99_ratio=<load p99 / idle p99> health_ok=<fraction of health checks
under load answered SERVING within --health-timeout> refused_late=<n>``.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata import rpc
from strata.bus import topics
from strata.bus.tail import TailReader
from strata.config import StrataSettings
from strata.errors import CliError
from strata.hashing import content_hash
from strata.rpc_auth import new_token, token_line
from strata.v1 import scheduler_pb2, scheduler_pb2_grpc
from strata_tools.bench.infra import bench_infra
from strata_tools.task.suite import load_suite
from strata_tools.tiering.arms import LiveTiers

WATCHERS = 4
STREAMS_PER_WATCHER = 16


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=40, help="measured Submit calls per phase")
    parser.add_argument("--warmup", type=int, default=20,
                        help="Submit calls before measuring, served first (the first ~10 s after start stall once)")
    parser.add_argument("--pace", type=float, default=0.4, help="seconds between the measuring client's calls")
    parser.add_argument("--zoo", default="ci", help="zoo preset whose models the tiers serve")
    parser.add_argument("--flood-rate", type=float, default=3.0, help="per-client Submit rate (prompts/s)")
    parser.add_argument("--flood-burst", type=int, default=10, help="per-client Submit burst")
    parser.add_argument("--flood-threads", type=int, default=8, help="concurrent Submit calls of the flooding client")
    parser.add_argument("--health-timeout", type=float, default=1.0, help="seconds a health check may take")
    parser.add_argument("--serve-timeout", type=float, default=900.0,
                        help="seconds to wait for every accepted prompt's final rewards")
    parser.add_argument("--seed", type=int, default=0)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


class Outcomes:
    """What became of submitted prompts: final rewards per request id, and the request ids (or
    hashes) of events dead-lettered on the tiers' topics."""

    WATCHED = (topics.REWARDS_SCORED, topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2,
               topics.ROLLOUTS_GENERATED)

    def __init__(self, settings: Any) -> None:
        dead_letters = [topics.Topic(t.dlq, t.message_type) for t in self.WATCHED]
        self.reader = TailReader(settings, [*self.WATCHED, *dead_letters], client_id=f"edge-{uuid.uuid4().hex[:6]}")
        self.reader.seek_to_end()
        self.finals: dict[str, int] = {}
        self.dead: set[str] = set()
        self.routed: set[str] = set()

    def poll(self, timeout_s: float = 0.5) -> None:
        prompt_topics = (topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2)
        for topic, event in self.reader.poll(timeout_s):
            request_id = getattr(event, "request_id", "")
            if topic.name.endswith(topics.DLQ_SUFFIX):
                self.dead.add(request_id or getattr(event, "prompt_hash", ""))
            elif topic is topics.REWARDS_SCORED and event.final:
                self.finals[request_id] = self.finals.get(request_id, 0) + 1
            elif topic in prompt_topics:
                self.routed.add(request_id)

    def settle(self, request_ids: Sequence[str], timeout_s: float) -> tuple[list[str], list[str]]:
        """Wait until each request is served or dead-lettered; returns (dead-lettered, neither in time)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not all(r in self.finals or r in self.dead for r in request_ids):
            self.poll()
        dead = [r for r in request_ids if r in self.dead]
        return dead, [r for r in request_ids if r not in self.finals and r not in self.dead]

    def close(self) -> None:
        self.reader.close()


@dataclass
class Phase:
    name: str
    submit_ms: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    health_ok: int = 0
    refused: dict[str, int] = field(default_factory=dict)


@dataclass
class Flood:
    accepted: list[str] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _measure(phase: Phase, scheduler: Any, health: Any, prompts: Sequence[str], accepted: list[str],
             health_timeout_s: float, pace_s: float) -> None:
    next_at = time.monotonic()
    for text in prompts:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at = time.monotonic() + pace_s
        request_id = f"edge-{phase.name}-{uuid.uuid4().hex[:12]}"
        started = time.perf_counter()
        try:
            scheduler.Submit(scheduler_pb2.SubmitRequest(prompt=text, n_samples=1, request_id=request_id), timeout=60)
            accepted.append(request_id)
        except grpc.RpcError as exc:
            phase.refused[exc.code().name] = phase.refused.get(exc.code().name, 0) + 1
        phase.submit_ms.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=health_timeout_s)
            phase.health_ok += reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            pass
        phase.health_ms.append(1000 * (time.perf_counter() - started))


def _flood(stub: Any, prompts: Sequence[str], flood: Flood, stop: threading.Event, thread: int) -> None:
    i = 0
    while not stop.is_set():
        request_id = f"edge-flood-{uuid.uuid4().hex[:12]}"
        text = f"{prompts[(thread * 7919 + i) % len(prompts)]} (#{thread}.{i})"
        try:
            stub.Submit(scheduler_pb2.SubmitRequest(prompt=text, n_samples=1, request_id=request_id), timeout=60)
            with flood.lock:
                flood.calls += 1
                flood.accepted.append(request_id)
        except grpc.RpcError as exc:
            with flood.lock:
                flood.calls += 1
                flood.refused[exc.code().name] = flood.refused.get(exc.code().name, 0) + 1
        i += 1


class Watches:
    """WATCHERS clients holding STREAMS_PER_WATCHER Watch streams each, on hashes no one submits."""

    def __init__(self, stubs: Sequence[Any]) -> None:
        self.streams: list[Any] = []
        self.errors: list[str] = []
        self.threads: list[threading.Thread] = []
        for w, stub in enumerate(stubs):
            for s in range(STREAMS_PER_WATCHER):
                stream = stub.Watch(scheduler_pb2.WatchRequest(prompt_hash=content_hash(f"idle {w}/{s}")),
                                    timeout=3600)

                def drain(stream: Any = stream) -> None:
                    try:
                        for _ in stream:
                            pass
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.CANCELLED:
                            self.errors.append(exc.code().name)

                thread = threading.Thread(target=drain, daemon=True, name=f"watch-{w}-{s}")
                thread.start()
                self.streams.append(stream)
                self.threads.append(thread)

    def close(self) -> None:
        for stream in self.streams:
            stream.cancel()
        for thread in self.threads:
            thread.join(timeout=10)


def run(args: argparse.Namespace) -> int:
    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    if args.prompts < 2:
        raise CliError("--prompts must be at least 2")
    if args.pace * args.flood_rate < 1:
        raise CliError(f"--pace {args.pace:g} s is faster than the per-client rate {args.flood_rate:g}/s: the "
                       "measuring client would be limited itself")
    settings = StrataSettings()
    run_id = uuid.uuid4().hex[:8]
    zoo = ensure_zoo(ZooSettings(cache_dir=settings.cache_dir, zoo_preset=args.zoo))
    with bench_infra(settings, run_id, "edge") as infra:
        return _run(args, infra, zoo, run_id)


def _run(args: argparse.Namespace, infra: Any, zoo: Any, run_id: str) -> int:
    tokens_file = Path(infra.state_dir) / "edge-tokens"
    tokens = _write_tokens(tokens_file)
    prompts = _split_prompts(args.warmup, args.prompts)
    print(f"edge bench: {args.zoo} zoo, tokens on, Submit limit {args.flood_rate:g}/s burst {args.flood_burst} per "
          f"client, {WATCHERS * STREAMS_PER_WATCHER} Watch streams under load", flush=True)
    accepted: list[str] = []
    flood = Flood()
    phases = [Phase("idle"), Phase("load")]
    live = LiveTiers(infra, zoo, run_id, review_seconds=0.0, seed=args.seed,
                     scheduler_env=_scheduler_env(args, tokens_file))
    with live.started():
        outcomes = Outcomes(infra)
        channels = {n: rpc.channel(live.scheduler_address, StrataSettings(grpc_token=t)) for n, t in tokens.items()}
        try:
            stubs = {n: scheduler_pb2_grpc.SchedulerStub(c) for n, c in channels.items()}
            health = health_pb2_grpc.HealthStub(channels["measure"])
            warm: list[str] = []
            _measure(Phase("warmup"), stubs["measure"], health, prompts.warmup, warm, args.health_timeout, args.pace)
            outcomes.settle(warm, args.serve_timeout)  # first calls (connections, the encoder) are not measured
            _measure(phases[0], stubs["measure"], health, prompts.idle, accepted, args.health_timeout, args.pace)
            print(f"  idle: submit p99 {percentile(phases[0].submit_ms, 99):.1f} ms", flush=True)
            watch_errors = _under_load(args, stubs, health, phases[1], prompts, accepted, flood)
            print(f"  load: submit p99 {percentile(phases[1].submit_ms, 99):.1f} ms; flood {flood.calls} calls, "
                  f"{len(flood.accepted)} accepted, refused {flood.refused}; Watch errors {watch_errors or 'none'}",
                  flush=True)
            dead, unsettled = _follow(outcomes, accepted + flood.accepted, args.serve_timeout)
        finally:
            outcomes.close()
            for channel in channels.values():
                channel.close()
    return report(phases, flood, dead, unsettled)


def _write_tokens(tokens_file: Path) -> dict[str, str]:
    """A fresh bearer token per client (the measurer, the flooder, each watcher), written to ``tokens_file``."""
    names = ["measure", "flood", *(f"watch{w}" for w in range(WATCHERS))]
    tokens = {name: new_token() for name in names}
    tokens_file.parent.mkdir(parents=True, exist_ok=True)
    tokens_file.write_text("".join(token_line(n, t) + "\n" for n, t in tokens.items()))
    return tokens


def _scheduler_env(args: argparse.Namespace, tokens_file: Path) -> dict[str, str]:
    """The scheduler's environment: tokens on, the Watch caps, the Submit limits under test, no audits."""
    return {
        "STRATA_GRPC_TOKENS_FILE": str(tokens_file),
        "STRATA_MAX_WATCH_STREAMS": str(WATCHERS * STREAMS_PER_WATCHER),
        "STRATA_MAX_WATCH_STREAMS_PER_CLIENT": str(STREAMS_PER_WATCHER),
        "STRATA_SUBMIT_RATE_PER_CLIENT": str(args.flood_rate),
        "STRATA_SUBMIT_BURST_PER_CLIENT": str(args.flood_burst),
        "STRATA_AUDIT_SHARE": "0",
    }


@dataclass(frozen=True)
class _Prompts:
    """The eval suite's texts, cut into disjoint slices: no phase resubmits another's prompt."""

    warmup: list[str]
    idle: list[str]
    load: list[str]
    flood: list[str]


def _split_prompts(warmup: int, per_phase: int) -> _Prompts:
    """``warmup`` prompts, ``per_phase`` for idle and for load, the rest for the flooder."""
    texts = [r.text for r in load_suite("eval")]
    return _Prompts(warmup=texts[:warmup], idle=texts[warmup: warmup + per_phase],
                    load=texts[warmup + per_phase: warmup + 2 * per_phase], flood=texts[warmup + 2 * per_phase:])


def _under_load(args: argparse.Namespace, stubs: dict[str, Any], health: Any, phase: Phase, prompts: _Prompts,
                accepted: list[str], flood: Flood) -> list[str]:
    """Measure ``phase`` with the Watch streams open and the flooder running; returns the Watch errors."""
    watches = Watches([stubs[f"watch{w}"] for w in range(WATCHERS)])
    stop = threading.Event()
    flooders = [threading.Thread(target=_flood, args=(stubs["flood"], prompts.flood, flood, stop, t),
                                 daemon=True, name=f"flood-{t}") for t in range(args.flood_threads)]
    for flooder in flooders:
        flooder.start()
    try:
        _measure(phase, stubs["measure"], health, prompts.load, accepted, args.health_timeout, args.pace)
    finally:
        stop.set()
        for flooder in flooders:
            flooder.join(timeout=60)
        watch_errors = list(watches.errors)
        watches.close()
    return watch_errors


def _follow(outcomes: Outcomes, everyone: Sequence[str], timeout_s: float) -> tuple[list[str], list[str]]:
    """Follow every accepted prompt to its final rewards: (dead-lettered, neither in time)."""
    print(f"  following {len(everyone)} accepted prompts to their final rewards ...", flush=True)
    started = time.monotonic()
    dead, unsettled = outcomes.settle(everyone, timeout_s)
    print(f"  settled in {time.monotonic() - started:.0f} s", flush=True)
    return dead, unsettled


def report(phases: Sequence[Phase], flood: Flood, dead: Sequence[str], unsettled: Sequence[str]) -> int:
    idle, load = phases
    print()
    print(f"{'phase':<6} {'submit p50':>11} {'submit p99':>11} {'health p99':>11} {'health ok':>10} refused")
    for phase in phases:
        print(f"{phase.name:<6} {percentile(phase.submit_ms, 50):>8.1f} ms {percentile(phase.submit_ms, 99):>8.1f} ms "
              f"{percentile(phase.health_ms, 99):>8.1f} ms {phase.health_ok:>4}/{len(phase.health_ms):<5} "
              f"{phase.refused or '-'}")
    for phase in phases:
        slowest = sorted(range(len(phase.submit_ms)), key=lambda i: -phase.submit_ms[i])[:3]
        print(f"{phase.name}: slowest Submit calls " + ", ".join(f"#{i} {phase.submit_ms[i]:.0f} ms" for i in slowest))
    print(f"flood: {flood.calls} Submit calls, {len(flood.accepted)} accepted, refused {flood.refused or '-'}")
    if unsettled:
        print(f"{len(unsettled)} accepted prompts neither served nor dead-lettered within the timeout")
    ratio = percentile(load.submit_ms, 99) / percentile(idle.submit_ms, 99)
    health_ok = load.health_ok / len(load.health_ms)
    print(f"edge submit_p99_ratio={ratio:.2f} health_ok={health_ok:.3f} refused_late={len(dead)}")
    return 0 if not dead and not unsettled else 1
