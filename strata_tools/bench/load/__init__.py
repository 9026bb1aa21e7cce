"""``strata bench load``: open-loop Submit at stepped offered rates: the knee, the first stage to saturate, overload.

The real services run as in ``strata bench edge`` (each its own process, the ``--zoo`` preset's models, on
the bench's own Kafka and Redis). One client submits open loop: each Submit (one prompt, ``n_samples=1``,
a request id of its own) leaves at the time a seeded schedule gives it (Poisson arrivals at the offered
rate, or evenly spaced with ``--arrivals even``), from a thread pool, however slowly earlier calls return,
so queueing shows instead of slowing the client down. A send the pool could not make on time is sent
late and its lateness recorded: the offered rate is what was offered. Every accepted request is followed
to its first final ``RewardScored`` on ``strata.rewards.scored``.

The scheduler sheds at the door (docs/scheduler.md, *Shedding when the tiers fall behind*) by the bench's
flags: past ``--shed-wait-s`` (10 s) of queued work in a tier with at least ``--shed-min-backlog`` (16)
events queued, its drain rate measured over ``--backlog-window-s`` (10 s), prompts that need a rollout
are refused with RESOURCE_EXHAUSTED and a retry hint, and skips are still served. The production
defaults (60 s, 1 024 events, 30 s) would let the final-reward p99 pass the bound long before the door
shut, and on a 2-core CPU a tier never queues 1 024 events in a step.

1. **Warm-up**: ``--warmup-families`` paraphrase families of the suite's train split (no risk topics),
   four prompts of each served with four samples, so that they have rewards the scheduler can reuse.
2. **Steps**, per mix (``--mixes``) and per rate (``--rates``), ``--step-seconds`` each: ``skip`` sends
   repeats of the warm-up's prompts and paraphrases of them (their families' other members), half and
   half; ``fresh`` sends train-split prompts never sent before. After each step the bench waits until
   every accepted request has its final reward or is past ``--final-deadline``, and until the consumer
   groups of the tiers have no lag (or ``--drain-timeout`` passed), so steps do not bleed into each other.
   Per step: offered and achieved send rate, accepted and refused per second (by status code), Submit
   p50/p99, time to final reward p50/p99 (a request with none within the deadline counts as infinitely
   late), the most lag each consumer group had, each service's CPU seconds per second and RSS, and
   Redis' ``used_memory``. A mix stops stepping after its first step that misses the bound: higher rates
   would only queue longer.
3. **The knee** of a mix: the highest offered rate below its first step that misses, where a step makes it
   when its final-reward p99 is within ``--p99-bound-ms`` and at least 90 % of the requests it offered were
   accepted (of those its schedule made: a 20 s Poisson step at 2/s offers 40 +- 6). **The bottleneck**:
   the service whose consumer group's lag grew most in the fresh mix's first step past its knee (the
   highest step when none missed); the service with the most CPU seconds per second there when no lag
   grew.
4. **Overload**: ``--overload-seconds`` at twice the fresh knee (the highest rate when there is none), then
   nothing: every accepted request should get exactly one final reward within the deadline, every refusal
   should be RESOURCE_EXHAUSTED or UNAVAILABLE, with a retry hint (``grpc-retry-pushback-ms`` or "retry in
   X s"), and the lag should drain once the offered rate drops. The refusals are counted by code, and
   with the share that carried the ``grpc-retry-pushback-ms`` trailer (which a gRPC retry policy honours).

Last line: ``load knee_skip=<rate> knee_fresh=<rate> p99_final_ms=<the fresh knee's final p99>
overload_lost=<accepted without a final within the deadline> overload_doubled=<requests with more
finals than samples> bottleneck=<service>`` (a knee of 0: no rate made the bound), then
``shed_wait_s=``, ``bottleneck_by=`` (lag or cpu), ``overload_refused=``, ``overload_refused_by=``
(``CODE:count,...``), ``overload_bad_refusals=``, ``retry_hint_share=`` (any hint), ``pushback_share=``
(the trailer), ``drained_s=`` (-1: not within ``--drain-timeout``), ``p99_bound_ms=`` and
``skip_mix_skipped=`` (the share of the skip mix's accepted prompts the scheduler did skip: on a zoo whose
rewards vary widely it routes them to Level-2 instead, and the skip mix measures that). The exit status
is 1 when something accepted was lost or doubled, a refusal had another code, or the lag did not drain.

``--soak SECONDS`` replaces the steps and the overload: the learner runs too (training the zoo's policy
on the soak's rewards, its checkpoints followed by the Level-1 generator, as in training), and after the
warm-up the skip mix goes at ``--soak-rate`` for that long, ending with ``soak seconds= accepted= lost=
doubled= rss_growth= redis_growth= threads_added= fds_added=`` (growth from the start to the end: as a
fraction of the start for memory, the largest over the services for RSS; the most threads and open file
descriptors any service gained, then the same over the second half alone, ``second_half_threads_added=
second_half_fds_added=``: a pool that filled early is flat there, a leak is not). ``--restart SERVICE``
kills that service (SIGKILL) halfway and starts it again on its port and group, adding ``restarted=
restart_s=`` (seconds until it answered again); accepted requests must still get exactly one final each,
and the restarted service is left out of the growth figures.

Not covered yet: the learner during the steps (the policy stays fixed there);
more than one scheduler replica or client (the per-client Submit rate is
far above the offered rates); Kafka's own CPU and memory, and Redis' CPU. With ``--shed-wait-s 0`` the
door never sheds, and overload shows as growing lag and late finals instead of refusals.
"""

from __future__ import annotations

import argparse
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

from strata import redis_client, rpc
from strata.bus.admin import LagReader
from strata.config import StrataSettings
from strata.errors import CliError
from strata.v1 import scheduler_pb2_grpc
from strata_tools.bench.infra import bench_infra
from strata_tools.bench.load.client import OpenLoopClient, grpc_submitter, send_offsets
from strata_tools.bench.load.figures import MIXES
from strata_tools.bench.load.phases import (
    WARMUP_SAMPLES,
    Plan,
    Pools,
    Rig,
    overload_seed,
    soak,
    split_pools,
    step_seed,
    steps_and_overload,
)
from strata_tools.bench.load.stack import Finals, Monitor, stack_reader
from strata_tools.task.suite import load_suite
from strata_tools.tiering.arms import LiveTiers
from strata_tools.train import CPU_LEARNER_ARGS

WARMUP_TIMEOUT_S = 1800.0
# Services --restart may crash: every one LiveTiers starts for the soak (the learner trains there).
RESTARTABLE = ("probe", "generator-l1", "generator-l2", "reward", "scheduler", "learner")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rates", default="1,2,4,8,16", help="offered rates to step through, prompts/s (comma list)")
    parser.add_argument("--step-seconds", type=float, default=20.0, help="seconds of sending per step")
    parser.add_argument("--mixes", default="skip,fresh", help=f"prompt mixes to step ({', '.join(MIXES)})")
    parser.add_argument("--arrivals", choices=("poisson", "even"), default="poisson",
                        help="send times: Poisson arrivals at the rate, or evenly spaced")
    parser.add_argument("--p99-bound-ms", type=float, default=30_000.0,
                        help="a step is below the knee when its time-to-final-reward p99 is within this")
    parser.add_argument("--final-deadline", type=float, default=120.0,
                        help="seconds after its Submit within which a request's final reward must arrive")
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="seconds to wait for the consumer groups' lag to reach 0 after sending stops")
    parser.add_argument("--overload-seconds", type=float, default=20.0, help="seconds of sending at twice the knee")
    parser.add_argument("--shed-wait-s", type=float, default=10.0,
                        help="the scheduler's shed_backlog_wait_s for the bench's stack: the door refuses prompts that "
                        "need a rollout (RESOURCE_EXHAUSTED, with a retry hint) while a tier's queue would keep one "
                        "waiting longer than this. Well under --p99-bound-ms, so that under overload the door "
                        "refuses instead of accepting prompts whose final reward would come past the bound (the "
                        "production 60 s is past the default bound of 30 s); 0: never shed")
    parser.add_argument("--shed-min-backlog", type=int, default=16,
                        help="events a tier must have queued before the door sheds (the scheduler's shed_min_backlog): "
                        "the ci zoo on 2 CPU cores drains a handful of events a second, so the production 1024 "
                        "would never be reached in a step")
    parser.add_argument("--backlog-window-s", type=float, default=10.0,
                        help="seconds over which the scheduler measures a tier's drain rate (backlog_window_s; "
                        "production 30): half a step, so that the rate follows the step's load rather than the "
                        "idle drain before it")
    parser.add_argument("--warmup-families", type=int, default=6,
                        help="paraphrase families whose prompts are served first (the skip mix's pool)")
    parser.add_argument("--workers", type=int, default=64, help="threads issuing Submit calls (calls in flight)")
    parser.add_argument("--submit-timeout", type=float, default=10.0, help="gRPC deadline of each Submit, seconds")
    parser.add_argument("--sample-interval", type=float, default=2.0,
                        help="seconds between readings of the consumer lags, RSS and Redis memory")
    parser.add_argument("--soak", type=float, default=0.0,
                        help="seconds at --soak-rate with the skip mix and the learner training, instead of the "
                        "steps (0: no soak)")
    parser.add_argument("--soak-rate", type=float, default=1.0, help="offered rate of the soak, prompts/s")
    parser.add_argument("--restart", default="", choices=("", *RESTARTABLE),
                        help="with --soak: kill this service (SIGKILL) halfway and start it again")
    parser.add_argument("--zoo", default="ci", help="zoo preset whose models the tiers serve")
    parser.add_argument("--seed", type=int, default=0)


def check_arguments(args: argparse.Namespace) -> Plan:
    """The plan the flags describe; CliError naming the flag that is wrong."""
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()]
    except ValueError as exc:
        raise CliError(f"--rates must be a comma list of prompts/s, got {args.rates!r}") from exc
    if not rates or any(r <= 0 for r in rates):
        raise CliError(f"--rates must list at least one rate, each above 0 prompts/s, got {args.rates!r}")
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    if not mixes or any(m not in MIXES for m in mixes):
        raise CliError(f"--mixes must name some of {', '.join(MIXES)}, got {args.mixes!r}")
    for flag in ("step_seconds", "final_deadline", "drain_timeout", "overload_seconds", "submit_timeout",
                 "sample_interval", "soak_rate", "p99_bound_ms", "backlog_window_s"):
        if getattr(args, flag) <= 0:
            raise CliError(f"--{flag.replace('_', '-')} must be above 0, got {getattr(args, flag):g}")
    if args.soak < 0:
        raise CliError(f"--soak must be 0 (no soak) or seconds above 0, got {args.soak:g}")
    if args.restart and not args.soak:
        raise CliError("--restart restarts a service halfway through the soak: give --soak SECONDS too")
    if args.shed_wait_s < 0:
        raise CliError(f"--shed-wait-s must be 0 (never shed) or seconds above 0, got {args.shed_wait_s:g}")
    if args.shed_min_backlog < 1:
        raise CliError(f"--shed-min-backlog must be at least 1 event, got {args.shed_min_backlog}")
    if args.warmup_families < 1 or args.workers < 1:
        raise CliError("--warmup-families and --workers must be at least 1")
    if args.final_deadline * 1000 < args.p99_bound_ms:
        raise CliError(f"--final-deadline {args.final_deadline:g} s is shorter than --p99-bound-ms "
                       f"{args.p99_bound_ms:g}: a request could miss the deadline and still be within the bound")
    return Plan(sorted(set(rates)), mixes)


def scheduler_env(args: argparse.Namespace) -> dict[str, str]:
    """The scheduler's settings (``STRATA_*``) for the bench's stack: its door sheds by the bench's flags."""
    return {"STRATA_SHED_BACKLOG_WAIT_S": repr(float(args.shed_wait_s)),
            "STRATA_SHED_MIN_BACKLOG": str(int(args.shed_min_backlog)),
            "STRATA_BACKLOG_WINDOW_S": repr(float(args.backlog_window_s))}


def run(args: argparse.Namespace) -> int:
    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    plan = check_arguments(args)
    pools = split_pools(load_suite("train"), args.warmup_families, args.seed)
    _check_fresh_enough(args, plan, pools)
    settings = StrataSettings()
    run_id = uuid.uuid4().hex[:8]
    zoo = ensure_zoo(ZooSettings(cache_dir=settings.cache_dir, zoo_preset=args.zoo))
    with bench_infra(settings, run_id, "load") as infra:
        return _run(args, plan, pools, infra, zoo, run_id)


def _check_fresh_enough(args: argparse.Namespace, plan: Plan, pools: Pools) -> None:
    """Refuse before starting anything when the fresh prompts could run out: the fresh mix's every step (the
    most it can take), then the overload at twice the highest rate (fresh prompts whatever the mixes),
    counted with the seeds the phases send with."""
    if args.soak:
        return
    poisson = args.arrivals == "poisson"
    needed = 0 if "fresh" not in plan.mixes else sum(
        len(send_offsets(r, args.step_seconds, step_seed(args.seed, i), poisson)) for i, r in enumerate(plan.rates))
    needed += len(send_offsets(2 * max(plan.rates), args.overload_seconds, overload_seed(args.seed), poisson))
    if needed > len(pools.fresh):
        raise CliError(f"--rates {args.rates} over --step-seconds {args.step_seconds:g} (and the overload at twice "
                       f"the highest rate) need up to {needed} fresh prompts; the train split has {len(pools.fresh)}")


def _run(args: argparse.Namespace, plan: Plan, pools: Pools, infra: Any, zoo: Any, run_id: str) -> int:
    print(f"load bench: {args.zoo} zoo, open-loop Submit ({args.arrivals} arrivals, one sample each), "
          f"final-reward p99 bound {args.p99_bound_ms:g} ms, deadline {args.final_deadline:g} s", flush=True)
    print(f"  the door sheds past {args.shed_wait_s:g} s of queued work in a tier with at least "
          f"{args.shed_min_backlog} events queued, its drain rate measured over {args.backlog_window_s:g} s "
          f"(shed_wait_s={args.shed_wait_s:g} shed_min_backlog={args.shed_min_backlog} "
          f"backlog_window_s={args.backlog_window_s:g})", flush=True)
    # The soak trains as a run would (the learner's memory and the generators' policy reloads are what it
    # watches); the steps keep the policy fixed, so that their rates compare.
    live = LiveTiers(infra, zoo, run_id, review_seconds=0.0, seed=args.seed, scheduler_env=scheduler_env(args),
                     learner_args=CPU_LEARNER_ARGS if args.soak else None)
    with live.started():
        print(f"  warm-up: {len(pools.warmup)} prompts x {WARMUP_SAMPLES} samples ...", flush=True)
        live.run_arm("warm-up", [_Text(t) for t in pools.warmup], "scheduler", WARMUP_TIMEOUT_S,
                     lambda line: print(line, flush=True), n_samples=WARMUP_SAMPLES)
        pids, groups = live.pids, live.consumer_groups  # the same dicts: a restart shows in them
        with contextlib.ExitStack() as opened:  # closed in reverse: the client first, Redis last
            redis = redis_client.connect(infra.redis_address, socket_timeout=10)
            opened.callback(redis.close)
            lag_reader = LagReader(infra, client_id="load-lag")  # one for the run, read by the monitor alone
            opened.callback(lag_reader.close)
            channel = opened.enter_context(rpc.channel(live.scheduler_address))
            prefix = f"load-{run_id}"
            finals = Finals(infra, prefix)
            opened.callback(finals.close)
            monitor = Monitor(stack_reader(lag_reader, groups, pids, redis), args.sample_interval)
            opened.callback(monitor.close)
            client = OpenLoopClient(grpc_submitter(scheduler_pb2_grpc.SchedulerStub(channel), args.submit_timeout),
                                    args.workers)
            opened.callback(client.close)
            rig = Rig(client, finals, monitor, pids, prefix, args, restart=live.restart)
            print(f"  watching consumer groups of {', '.join(groups)}; services {', '.join(pids)}", flush=True)
            return soak(rig, pools) if args.soak else steps_and_overload(rig, plan, pools)


@dataclass(frozen=True)
class _Text:
    """What ``ArmRunner.run_arm`` reads of a record: its text."""

    text: str
