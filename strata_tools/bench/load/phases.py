"""The load bench's phases on a running stack: the prompt pools, one phase (send, drain, collect the
figures), the steps with the overload after them, and the soak."""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from strata_tools.bench.load.client import Call, OpenLoopClient, send_offsets
from strata_tools.bench.load.figures import (
    Sample,
    StepFigures,
    account,
    final_latencies_ms,
    knee,
    print_header,
    print_step,
    report,
    step_figures,
    within_bound,
)
from strata_tools.bench.load.stack import Finals, Monitor
from strata_tools.infra.process import cpu_seconds

WARMUP_PROMPTS_PER_FAMILY = 4  # served in the warm-up; the families' other members are the paraphrases
WARMUP_SAMPLES = 4  # rewards per warm-up prompt: at least the scheduler's min_samples_per_neighbour (3)
REPEAT_SHARE = 0.5  # of the skip mix; the rest are paraphrases


@dataclass(frozen=True)
class Plan:
    """The checked arguments."""

    rates: list[float]
    mixes: list[str]


# -- prompts -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pools:
    """The train split's prompts, cut for the mixes: no fresh prompt shares a family with the skip mix's."""

    warmup: list[str]  # served first with WARMUP_SAMPLES each; the skip mix repeats them
    paraphrases: list[str]  # the warm families' other members
    fresh: list[str]  # every other train prompt, in a seeded order, each sent at most once


def split_pools(records: Sequence[Any], families: int, seed: int) -> Pools:
    """``families`` non-risk families (risk prompts always go to Level-2, never skip) for the skip mix;
    the other families' prompts for the fresh mix. Pure: the order is ``seed``'s."""
    rng = random.Random(seed)
    by_family: dict[str, list[Any]] = {}
    for record in records:
        by_family.setdefault(record.family, []).append(record)
    safe = sorted(f for f, members in by_family.items() if not members[0].risk)
    warm = set(rng.sample(safe, min(families, len(safe))))
    warmup, paraphrases = [], []
    for family in sorted(warm):
        members = [r.text for r in by_family[family]]
        warmup += members[:WARMUP_PROMPTS_PER_FAMILY]
        paraphrases += members[WARMUP_PROMPTS_PER_FAMILY:]
    fresh = [r.text for r in records if r.family not in warm]
    rng.shuffle(fresh)
    return Pools(warmup, paraphrases, fresh)


def skip_prompts(pools: Pools, rng: random.Random) -> Iterator[str]:
    """Endless: a repeat of a warm-up prompt (REPEAT_SHARE of them), else a paraphrase of one."""
    while True:
        yield rng.choice(pools.warmup if rng.random() < REPEAT_SHARE or not pools.paraphrases else pools.paraphrases)


def requests_of(prompts: Iterator[str], prefix: str) -> Iterator[tuple[str, str]]:
    """(unique request id, prompt) for each prompt."""
    for i, prompt in enumerate(prompts):
        yield f"{prefix}-{i}", prompt


def step_seed(seed: int, index: int) -> int:
    """The send schedule's seed of each mix's ``index``-th rate: the mixes get the same arrivals."""
    return seed * 1000 + index


def overload_seed(seed: int) -> int:
    """The overload's send schedule's seed."""
    return seed * 1000 + 999


# -- the phases ------------------------------------------------------------------------------------------------

@dataclass
class Rig:
    """The running pieces a phase needs."""

    client: OpenLoopClient
    finals: Finals
    monitor: Monitor
    pids: dict[str, int]  # LiveTiers.pids itself: a restarted service's new pid shows here
    prefix: str  # of every request id this run sends
    args: argparse.Namespace
    restart: Callable[[str], float] | None = None  # LiveTiers.restart: the soak's crash halfway


def run_phase(rig: Rig, mix: str, rate: float, duration_s: float, prompts: Iterator[str],
              seed: int) -> tuple[list[Call], StepFigures]:
    """Send ``prompts`` at ``rate`` for ``duration_s``, wait for the lag to drain and the finals to arrive
    (or their deadline to pass); the calls and the step's figures."""
    args = rig.args
    offsets = send_offsets(rate, duration_s, seed, args.arrivals == "poisson")
    before = rig.monitor.last_before(time.monotonic())
    pids_before = dict(rig.pids)
    cpu_before = {s: cpu_seconds(p) for s, p in pids_before.items()}
    started = time.monotonic()
    calls = rig.client.run(offsets, requests_of(prompts, f"{rig.prefix}-{mix}-{rate:g}-{seed}"))
    ended = time.monotonic()
    # A service restarted meanwhile counts its new process only (the old one's seconds went with it).
    cpu = {s: max(0.0, cpu_seconds(p) - (cpu_before[s] if pids_before.get(s) == p else 0.0)) / (ended - started)
           for s, p in rig.pids.items()}
    drained_s = rig.monitor.wait_drained(args.drain_timeout)
    rig.finals.wait(calls, args.final_deadline)
    finals_ms = final_latencies_ms(calls, rig.finals.arrivals(), args.final_deadline)
    figures = step_figures(mix, rate, started, duration_s, calls, finals_ms, rig.monitor.between(started, ended),
                           before)
    return calls, replace(figures, cpu_per_s=cpu, drained_s=drained_s)


def steps_and_overload(rig: Rig, plan: Plan, pools: Pools) -> int:
    args = rig.args
    fresh = iter(pools.fresh)
    streams = {"skip": skip_prompts(pools, random.Random(args.seed)), "fresh": fresh}
    steps: dict[str, list[StepFigures]] = {mix: [] for mix in plan.mixes}
    print_header()
    for mix in plan.mixes:
        for i, rate in enumerate(plan.rates):
            print(f"  {mix} at {rate:g}/s: sending for {args.step_seconds:g} s, then draining ...", flush=True)
            _, figures = run_phase(rig, mix, rate, args.step_seconds, streams[mix], step_seed(args.seed, i))
            steps[mix].append(figures)
            print_step(figures)
            if not within_bound(figures, args.p99_bound_ms):
                print(f"  {mix}: {rate:g}/s misses the bound; higher rates are not stepped", flush=True)
                break
    fresh_knee = knee(steps.get("fresh", []), args.p99_bound_ms)
    overload_rate = 2 * (fresh_knee.offered_rate if fresh_knee else max(plan.rates))
    print(f"  overload: {overload_rate:g}/s for {args.overload_seconds:g} s, then nothing ...", flush=True)
    calls, overload = run_phase(rig, "overload", overload_rate, args.overload_seconds, fresh, overload_seed(args.seed))
    print_step(overload)
    accounting = account(calls, rig.finals.arrivals(), args.final_deadline)
    return report(steps, accounting, overload.drained_s, args.p99_bound_ms, args.shed_wait_s)


def soak(rig: Rig, pools: Pools) -> int:
    """The skip mix at ``--soak-rate`` for ``--soak`` seconds; with ``--restart SERVICE``, that service is killed
    and started again halfway. Accepted requests must each get one final; the services' RSS, threads and
    open files and Redis' memory are compared from start to end, and from halfway to the end (a pool that
    filled early is flat there, a leak is not); the restarted service's are not: it is a new process."""
    args = rig.args
    print(f"  soak: skip mix at {args.soak_rate:g}/s for {args.soak:g} s ...", flush=True)
    reading_timeout_s = 10 * args.sample_interval + 30  # a reading costs a round of Kafka admin calls
    start = rig.monitor.fresh(reading_timeout_s)
    restarts: list[float] = []
    crash = None
    if args.restart:
        if rig.restart is None:
            raise RuntimeError("--restart needs a stack that can restart its services")
        restart = rig.restart

        def kill_and_restart() -> None:
            print(f"  soak: killing {args.restart} halfway (SIGKILL) and starting it again ...", flush=True)
            restarts.append(restart(args.restart))
            print(f"  soak: {args.restart} answered again after {restarts[-1]:.1f} s", flush=True)

        crash = threading.Timer(args.soak / 2, kill_and_restart)
        crash.start()
    sending_from = time.monotonic()
    try:
        calls, figures = run_phase(rig, "soak", args.soak_rate, args.soak,
                                   skip_prompts(pools, random.Random(args.seed)), args.seed)
    finally:
        if crash is not None:
            crash.cancel()
            crash.join()
    end = rig.monitor.fresh(reading_timeout_s)
    print_header()
    print_step(figures)
    accounting = account(calls, rig.finals.arrivals(), args.final_deadline)
    kept = [s for s in rig.pids if s != args.restart]
    held = held_figures(start, end, kept)
    # Growth in the second half alone tells a pool that filled early (flat after) from a leak (still growing).
    mid = rig.monitor.last_before(sending_from + args.soak / 2)
    late = held_figures(mid, end, kept)
    readings = [r for r in (start, mid, end) if r is not None]
    for service in kept:
        print(f"  {service} (start -> halfway -> end): rss "
              + " -> ".join(f"{r.rss_bytes.get(service, 0) / 2**20:.0f}" for r in readings) + " MB, threads "
              + " -> ".join(str(r.threads.get(service, 0)) for r in readings) + ", open files "
              + " -> ".join(str(r.fds.get(service, 0)) for r in readings))
    restarted = (f" restarted={args.restart} restart_s={restarts[0]:.1f}" if restarts
                 else f" restarted={args.restart} restart_s=nan" if args.restart else "")
    print(f"soak seconds={args.soak:g} accepted={accounting.accepted} lost={accounting.lost} "
          f"doubled={accounting.doubled} rss_growth={held.rss_growth:.3f} redis_growth={held.redis_growth:.3f} "
          f"threads_added={held.threads_added} fds_added={held.fds_added} "
          f"second_half_threads_added={late.threads_added} second_half_fds_added={late.fds_added}{restarted}")
    return 0 if not accounting.lost and not accounting.doubled and (restarts or not args.restart) else 1


@dataclass(frozen=True)
class HeldFigures:
    """What a soak held from start to end: the largest growth over the services (RSS as a fraction, threads
    and open files as counts) and Redis' memory growth; nan / -1 without both readings."""

    rss_growth: float
    redis_growth: float
    threads_added: int
    fds_added: int


def held_figures(start: Sample | None, end: Sample | None, services: Sequence[str]) -> HeldFigures:
    if start is None or end is None:
        return HeldFigures(float("nan"), float("nan"), -1, -1)
    return HeldFigures(
        rss_growth=max((growth(start.rss_bytes.get(s, 0), end.rss_bytes.get(s, 0)) for s in services),
                       default=float("nan")),
        redis_growth=growth(start.redis_bytes, end.redis_bytes),
        threads_added=max((end.threads.get(s, 0) - start.threads.get(s, 0) for s in services), default=0),
        fds_added=max((end.fds.get(s, 0) - start.fds.get(s, 0) for s in services), default=0))


def growth(start: float, end: float) -> float:
    """``end`` over ``start`` minus one; nan without a start."""
    return end / start - 1 if start > 0 else float("nan")


