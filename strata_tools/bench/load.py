"""``strata bench load``: open-loop Submit at stepped offered rates: the knee, the first stage to saturate, overload.

The real services run as in ``strata bench edge`` (each its own process, the ``--zoo`` preset's models, on
the bench's own Kafka and Redis). One client submits open loop: each Submit (one prompt, ``n_samples=1``,
a request id of its own) leaves at the time a seeded schedule gives it (Poisson arrivals at the offered
rate, or evenly spaced with ``--arrivals even``), from a thread pool, however slowly earlier calls return,
so queueing shows instead of slowing the client down. A send the pool could not make on time is sent
late and its lateness recorded: the offered rate is what was offered. Every accepted request is followed
to its first final ``RewardScored`` on ``strata.rewards.scored``.

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
   when its final-reward p99 is within ``--p99-bound-ms`` and at least 90 % of the offered rate was
   accepted. **The bottleneck**: the service whose consumer group's lag grew most in the fresh mix's first
   step past its knee (the highest step when none missed); the service with the most CPU seconds per
   second there when no lag grew.
4. **Overload**: ``--overload-seconds`` at twice the fresh knee (the highest rate when there is none), then
   nothing: every accepted request should get exactly one final reward within the deadline, every refusal
   should be RESOURCE_EXHAUSTED or UNAVAILABLE, with a retry hint (``grpc-retry-pushback-ms`` or "retry in
   X s"), and the lag should drain once the offered rate drops.

Last line: ``load knee_skip=<rate> knee_fresh=<rate> p99_final_ms=<the fresh knee's final p99>
overload_lost=<accepted without a final within the deadline> overload_doubled=<requests with more
finals than samples> bottleneck=<service>`` (a knee of 0: no rate made the bound), then
``bottleneck_by=`` (lag or cpu), ``overload_refused=``, ``overload_bad_refusals=``, ``retry_hint_share=``,
``drained_s=`` (-1: not within ``--drain-timeout``), ``p99_bound_ms=`` and ``skip_mix_skipped=`` (the share
of the skip mix's accepted prompts the scheduler did skip: on a zoo whose rewards vary widely it routes
them to Level-2 instead, and the skip mix measures that). The exit status is 1 when
something accepted was lost or doubled, a refusal had another code, or the lag did not drain.

``--soak SECONDS`` replaces the steps and the overload: after the warm-up, the skip mix at
``--soak-rate`` for that long, ending with ``soak seconds= accepted= lost= doubled= rss_growth=
redis_growth=`` (growth from the start to the end as a fraction of the start: the largest over the
services for RSS).

Not covered yet: the learner (the policy stays fixed, also during the soak, so no training memory or
policy reloads are measured); more than one scheduler replica or client (the per-client Submit rate is
far above the offered rates); Kafka's own CPU and memory, and Redis' CPU; whether refusals come early
enough depends on the scheduler shedding load when the tiers fall behind: without it, overload shows as
growing lag and late finals instead of refusals.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from strata_tools.bench.edge import percentile

log = logging.getLogger(__name__)

MIXES = ("skip", "fresh")
REFUSALS_AT_THE_DOOR = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
MIN_ACCEPTED_SHARE = 0.9  # of the offered rate, for a step to count below the knee
WARMUP_PROMPTS_PER_FAMILY = 4  # served in the warm-up; the families' other members are the paraphrases
WARMUP_SAMPLES = 4  # rewards per warm-up prompt: at least the scheduler's min_samples_per_neighbour (3)
WARMUP_TIMEOUT_S = 1800.0
REPEAT_SHARE = 0.5  # of the skip mix; the rest are paraphrases
PUSHBACK_KEY = "grpc-retry-pushback-ms"  # gRPC's retry-throttling trailer: how long to wait before a retry
_RETRY_IN = re.compile(r"retry in (\d+(?:\.\d+)?) ?s")
# Consumer groups of LiveTiers (bench-<run>-<suffix>) by the service that owns them, so that lag and CPU
# name the same thing.
SERVICE_OF_GROUP = {"probe": "probe", "l1": "generator-l1", "l2": "generator-l2", "reward": "reward",
                    "stats": "scheduler", "learner": "learner"}


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
    parser.add_argument("--warmup-families", type=int, default=6,
                        help="paraphrase families whose prompts are served first (the skip mix's pool)")
    parser.add_argument("--workers", type=int, default=64, help="threads issuing Submit calls (calls in flight)")
    parser.add_argument("--submit-timeout", type=float, default=10.0, help="gRPC deadline of each Submit, seconds")
    parser.add_argument("--sample-interval", type=float, default=2.0,
                        help="seconds between readings of the consumer lags, RSS and Redis memory")
    parser.add_argument("--soak", type=float, default=0.0,
                        help="seconds at --soak-rate with the skip mix instead of the steps (0: no soak)")
    parser.add_argument("--soak-rate", type=float, default=1.0, help="offered rate of the soak, prompts/s")
    parser.add_argument("--zoo", default="ci", help="zoo preset whose models the tiers serve")
    parser.add_argument("--seed", type=int, default=0)


@dataclass(frozen=True)
class Plan:
    """The checked arguments."""

    rates: list[float]
    mixes: list[str]


def check_arguments(args: argparse.Namespace) -> Plan:
    """The plan the flags describe; CliError naming the flag that is wrong."""
    from strata.errors import CliError

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
                 "sample_interval", "soak_rate", "p99_bound_ms"):
        if getattr(args, flag) <= 0:
            raise CliError(f"--{flag.replace('_', '-')} must be above 0, got {getattr(args, flag):g}")
    if args.soak < 0:
        raise CliError(f"--soak must be 0 (no soak) or seconds above 0, got {args.soak:g}")
    if args.warmup_families < 1 or args.workers < 1:
        raise CliError("--warmup-families and --workers must be at least 1")
    if args.final_deadline * 1000 < args.p99_bound_ms:
        raise CliError(f"--final-deadline {args.final_deadline:g} s is shorter than --p99-bound-ms "
                       f"{args.p99_bound_ms:g}: a request could miss the deadline and still be within the bound")
    return Plan(sorted(set(rates)), mixes)


# -- the open-loop client ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    """What one Submit got."""

    code: str  # "OK" or the grpc.StatusCode name
    retry_hint_s: float | None = None  # a refusal's retry hint, seconds
    decision: str = ""  # accepted only: the Decision name (DECISION_SKIP, DECISION_LEVEL_1, ...)


@dataclass(frozen=True)
class Call:
    """One Submit as the open-loop client made it; times are ``time.monotonic()``."""

    request_id: str
    scheduled_at: float  # when the schedule said to send it
    sent_at: float  # when a worker sent it: later than scheduled when every worker was busy
    latency_ms: float
    reply: Reply

    @property
    def accepted(self) -> bool:
        return self.reply.code == "OK"


Submitter = Callable[[str, str], Reply]  # (request id, prompt) -> what the server answered


def send_offsets(rate: float, duration_s: float, seed: int, poisson: bool = True) -> list[float]:
    """Send times, in seconds from the start, of an offered ``rate`` over ``duration_s``: Poisson arrivals
    (exponential gaps, seeded) or evenly spaced from 0. Pure."""
    if not poisson:
        return [i / rate for i in range(round(rate * duration_s))]
    rng = random.Random(seed)
    offsets: list[float] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        offsets.append(at)
        at += rng.expovariate(rate)
    return offsets


def retry_hint_s(metadata: Sequence[tuple[str, Any]], details: str) -> float | None:
    """A refusal's retry hint in seconds: gRPC's ``grpc-retry-pushback-ms`` trailer, else "retry in X s"
    in the details; None without one (a negative pushback means "do not retry": no hint)."""
    for key, value in metadata:
        if key == PUSHBACK_KEY:
            try:
                millis = float(value.decode() if isinstance(value, bytes) else value)
            except ValueError:
                break
            return millis / 1000 if millis >= 0 else None
    found = _RETRY_IN.search(details)
    return float(found.group(1)) if found else None


def grpc_submitter(stub: Any, timeout_s: float) -> Submitter:
    """Submit one prompt with one sample through ``stub`` (a SchedulerStub); a refusal becomes its code."""
    import grpc

    from strata.v1 import common_pb2, scheduler_pb2

    def submit(request_id: str, prompt: str) -> Reply:
        request = scheduler_pb2.SubmitRequest(prompt=prompt, n_samples=1, request_id=request_id)
        try:
            response = stub.Submit(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            return Reply(exc.code().name, retry_hint_s(exc.trailing_metadata() or (), exc.details() or ""))
        return Reply("OK", decision=common_pb2.Decision.Name(response.decision))

    return submit


class OpenLoopClient:
    """Sends each request at its scheduled time from a pool of ``workers`` threads, whether or not earlier
    calls have returned. With every worker busy a send waits for one and goes out late; each call records
    its scheduled and actual send time, so the lateness shows instead of a silently lower rate."""

    def __init__(self, submit: Submitter, workers: int) -> None:
        self._submit = submit
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="load-submit")

    def run(self, offsets: Sequence[float], requests: Iterator[tuple[str, str]]) -> list[Call]:
        """One call per offset (seconds from now), each the next (request id, prompt) of ``requests``;
        returns when every call has returned."""
        start = time.monotonic()
        futures = []
        for offset in offsets:
            scheduled_at = start + offset
            wait_s = scheduled_at - time.monotonic()
            if wait_s > 0:
                time.sleep(wait_s)  # pacing to the schedule; never waits on a reply
            request_id, prompt = next(requests)
            futures.append(self._pool.submit(self._call, request_id, prompt, scheduled_at))
        return [f.result() for f in futures]

    def _call(self, request_id: str, prompt: str, scheduled_at: float) -> Call:
        sent_at = time.monotonic()
        reply = self._submit(request_id, prompt)
        return Call(request_id, scheduled_at, sent_at, 1000 * (time.monotonic() - sent_at), reply)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


# -- what the step did: pure figures -----------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """One reading of the stack: lag per service's consumer group, RSS per service, Redis memory."""

    at: float  # time.monotonic()
    lags: dict[str, int]
    rss_bytes: dict[str, int]
    redis_bytes: int


@dataclass(frozen=True)
class StepFigures:
    """One step's figures, as the table and the knee read them."""

    mix: str
    offered_rate: float
    sent_per_s: float
    accepted_per_s: float
    refused_per_s: dict[str, float]  # by status code
    skip_share: float  # of the accepted
    send_late_p99_ms: float  # actual minus scheduled send time
    submit_p50_ms: float
    submit_p99_ms: float
    final_p50_ms: float  # inf when over half the accepted had no final within the deadline
    final_p99_ms: float
    late: int  # accepted requests with no final within the deadline
    max_lag: dict[str, int] = field(default_factory=dict)  # by service, during the sending
    lag_growth: dict[str, int] = field(default_factory=dict)  # most lag during the sending minus lag before it
    cpu_per_s: dict[str, float] = field(default_factory=dict)  # CPU seconds per second while sending, by service
    rss_mb: dict[str, float] = field(default_factory=dict)  # most RSS while sending, by service
    redis_mb: float = 0.0  # most used_memory while sending
    decisions: dict[str, int] = field(default_factory=dict)  # the scheduler's decisions on the accepted, by name
    drained_s: float | None = None  # after sending stopped, until no group lagged; None: not in time


def final_latencies_ms(calls: Sequence[Call], arrivals: Mapping[str, Sequence[float]], deadline_s: float
                       ) -> list[float]:
    """Per accepted call, send to first final reward in ms; inf when none arrived within ``deadline_s``."""
    latencies = []
    for call in calls:
        if call.accepted:
            after_s = min(arrivals.get(call.request_id, ()), default=float("inf")) - call.sent_at
            latencies.append(1000 * after_s if after_s <= deadline_s else float("inf"))
    return latencies


def step_figures(mix: str, rate: float, started: float, duration_s: float, calls: Sequence[Call],
                 finals_ms: Sequence[float], during: Sequence[Sample], before: Sample | None) -> StepFigures:
    """The figures of one step that began at ``started`` from its calls, its final latencies and the samples
    taken while sending (``before``: the last one before). Pure."""
    accepted = [c for c in calls if c.accepted]
    refused: dict[str, float] = {}
    for call in calls:
        if not call.accepted:
            refused[call.reply.code] = refused.get(call.reply.code, 0.0) + 1 / duration_s
    sent_in_time = sum(1 for c in calls if c.sent_at - started <= duration_s)  # late sends do not count
    max_lag = {s: max(x.lags.get(s, 0) for x in during) for s in {s for x in during for s in x.lags}}
    growth = {s: lag - (before.lags.get(s, 0) if before else 0) for s, lag in max_lag.items()}
    return StepFigures(
        mix=mix, offered_rate=rate, sent_per_s=sent_in_time / duration_s, accepted_per_s=len(accepted) / duration_s,
        refused_per_s=refused,
        skip_share=sum(c.reply.decision == "DECISION_SKIP" for c in accepted) / len(accepted) if accepted else 0.0,
        send_late_p99_ms=_p(1000 * (c.sent_at - c.scheduled_at) for c in calls),
        submit_p50_ms=_p((c.latency_ms for c in calls), 50), submit_p99_ms=_p(c.latency_ms for c in calls),
        final_p50_ms=_p(finals_ms, 50), final_p99_ms=_p(finals_ms), late=sum(m == float("inf") for m in finals_ms),
        max_lag=max_lag, lag_growth=growth, rss_mb={s: max(x.rss_bytes.get(s, 0) for x in during) / 2**20
                                                    for s in {s for x in during for s in x.rss_bytes}},
        redis_mb=max((x.redis_bytes for x in during), default=0) / 2**20,
        decisions=dict(Counter(c.reply.decision for c in accepted)),
    )


def _p(values: Any, q: float = 99) -> float:
    listed = list(values)
    return percentile(listed, q) if listed else float("nan")


def within_bound(step: StepFigures, p99_bound_ms: float) -> bool:
    """Whether a step is below the knee: final p99 within the bound, and most of the offered rate accepted."""
    return step.final_p99_ms <= p99_bound_ms and step.accepted_per_s >= MIN_ACCEPTED_SHARE * step.offered_rate


def knee(steps: Sequence[StepFigures], p99_bound_ms: float) -> StepFigures | None:
    """The highest-rate step below a mix's first step that misses the bound (a rate that makes it again
    above a miss is noise, not capacity); None when the lowest rate misses already."""
    found = None
    for step in sorted(steps, key=lambda s: s.offered_rate):
        if not within_bound(step, p99_bound_ms):
            break
        found = step
    return found


def past_knee(steps: Sequence[StepFigures], p99_bound_ms: float) -> StepFigures | None:
    """The step the bottleneck is read from: the first that misses the bound, else the highest rate."""
    ordered = sorted(steps, key=lambda s: s.offered_rate)
    return next((s for s in ordered if not within_bound(s, p99_bound_ms)), ordered[-1] if ordered else None)


def bottleneck(step: StepFigures | None) -> tuple[str, str]:
    """(service, "lag" or "cpu"): the service whose consumer group's lag grew most in ``step``, else the one
    with the most CPU seconds per second; ("none", "") without a step."""
    if step is None:
        return "none", ""
    grown = {s: g for s, g in step.lag_growth.items() if g > 0}
    if grown:  # equal growth (a batch in flight each): the busier service
        return max(sorted(grown), key=lambda s: (grown[s], step.cpu_per_s.get(s, 0.0))), "lag"
    if step.cpu_per_s:
        return max(sorted(step.cpu_per_s), key=lambda s: step.cpu_per_s[s]), "cpu"
    return "none", ""


@dataclass(frozen=True)
class Accounting:
    """What became of the requests of one phase."""

    accepted: int
    refused: int
    lost: int  # accepted with no final reward within the deadline
    doubled: int  # request ids with more finals than samples asked
    bad_refusals: int  # refused with a code other than RESOURCE_EXHAUSTED or UNAVAILABLE
    with_hint: int  # refusals that said when to retry
    served_refused: int  # refused at the door, yet served: the door said no to something it took


def account(calls: Sequence[Call], arrivals: Mapping[str, Sequence[float]], deadline_s: float,
            n_samples: int = 1) -> Accounting:
    """Every accepted request should have ``n_samples`` finals within ``deadline_s`` of its Submit, no more;
    every refusal a code that says "later" and when. Pure."""
    accepted = [c for c in calls if c.accepted]
    refused = [c for c in calls if not c.accepted]
    return Accounting(
        accepted=len(accepted), refused=len(refused),
        lost=sum(1 for m in final_latencies_ms(accepted, arrivals, deadline_s) if m == float("inf")),
        doubled=sum(1 for c in accepted if len(arrivals.get(c.request_id, ())) > n_samples),
        bad_refusals=sum(1 for c in refused if c.reply.code not in REFUSALS_AT_THE_DOOR),
        with_hint=sum(1 for c in refused if c.reply.retry_hint_s is not None),
        served_refused=sum(1 for c in refused if arrivals.get(c.request_id)),
    )


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


# -- the stack: finals, lags, processes ---------------------------------------------------------------------

class Finals:
    """Arrival times (``time.monotonic()``) of the final rewards per request id with ``prefix``, read from
    ``strata.rewards.scored`` by a thread of its own from the end of the topic at construction."""

    def __init__(self, settings: Any, prefix: str) -> None:
        from strata.bus import topics
        from strata.bus.tail import TailReader

        self._reader = TailReader(settings, [topics.REWARDS_SCORED], client_id=f"load-{uuid.uuid4().hex[:6]}")
        self._reader.seek_to_end()
        self._prefix = prefix
        self._arrivals: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True, name="load-finals")
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self._stop.is_set():
                for _topic, event in self._reader.poll(0.25):
                    if event.final and event.request_id.startswith(self._prefix):
                        with self._lock:
                            self._arrivals.setdefault(event.request_id, []).append(time.monotonic())
        except Exception as exc:  # raised again by wait(): a dead reader must not look like lost finals
            self.error = exc

    def arrivals(self) -> dict[str, list[float]]:
        with self._lock:
            return {r: list(times) for r, times in self._arrivals.items()}

    def wait(self, calls: Sequence[Call], deadline_s: float) -> None:
        """Until every accepted call has a final or is ``deadline_s`` past its send."""
        pending = [c for c in calls if c.accepted]
        while pending:
            if self.error is not None:
                raise RuntimeError("the final-reward reader stopped") from self.error
            now = time.monotonic()
            arrived = self.arrivals()
            pending = [c for c in pending if c.request_id not in arrived and now - c.sent_at <= deadline_s]
            self._stop.wait(0.5)  # interval between checks of a real condition

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._reader.close()


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (/proc/<pid>/stat); 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)", which may hold spaces: state is fields[0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS in /proc/<pid>/status); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def service_pids(ports: Mapping[str, int], parent: int) -> dict[str, int]:
    """The pid of each service ``parent`` started, by name, found by the ``--grpc-port`` on its command line
    (LiveTiers keeps its processes to itself)."""
    from strata_tools.infra.process import process_cmdline

    by_port = {f"--grpc-port {port} ": name for name, port in ports.items()}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        cmdline = process_cmdline(int(entry.name)) + " "
        if ppid == parent:
            found.update({name: int(entry.name) for marker, name in by_port.items() if marker in cmdline})
    return found


def run_groups(cluster: Any, run_id: str) -> dict[str, str]:
    """This run's consumer groups (``bench-<run>-<suffix>``, as LiveTiers names them) by the service owning each."""
    from kafka.admin import KafkaAdminClient

    from strata.bus.security import kafka_connection

    prefix = f"bench-{run_id}-"
    admin = KafkaAdminClient(**kafka_connection(cluster), client_id="load-groups")
    try:
        groups = [g["group_id"] for g in admin.list_groups() if g["group_id"].startswith(prefix)]
    finally:
        admin.close()
    return {SERVICE_OF_GROUP.get(g[len(prefix):], g[len(prefix):]): g for g in sorted(groups)}


class Monitor:
    """Samples the groups' lag, the services' RSS and Redis' memory every ``interval_s`` in a thread."""

    def __init__(self, read: Callable[[], Sample], interval_s: float) -> None:
        self._read = read
        self._interval_s = interval_s
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="load-monitor")
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self._read()
                with self._lock:
                    self._samples.append(sample)
            except Exception as exc:  # a slow Kafka costs a reading, not the run
                log.warning("no reading of the stack this time: %s", exc)
            self._stop.wait(self._interval_s)

    def between(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self._samples if start <= s.at <= end]

    def last_before(self, at: float) -> Sample | None:
        with self._lock:
            return next((s for s in reversed(self._samples) if s.at <= at), None)

    def fresh(self, timeout_s: float) -> Sample | None:
        """The first reading taken after this call; None when none comes within ``timeout_s``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            latest = self.last_before(time.monotonic())
            if latest is not None and latest.at > start:
                return latest
            self._stop.wait(min(self._interval_s, 0.5))  # interval between checks of a real condition
        return None

    def wait_drained(self, timeout_s: float) -> float | None:
        """Seconds until a reading taken after this call shows no lag in any group; None after ``timeout_s``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            latest = self.last_before(time.monotonic())
            if latest is not None and latest.at > start and not any(latest.lags.values()):
                return latest.at - start
            self._stop.wait(min(self._interval_s, 0.5))  # interval between checks of a real condition
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def stack_reader(cluster: Any, groups: Mapping[str, str], pids: Mapping[str, int], redis: Any
                 ) -> Callable[[], Sample]:
    """A reading of the stack now: lag summed over each group's topics, each service's RSS, Redis memory."""
    from strata.bus.admin import consumer_lags

    service_of = {group: service for service, group in groups.items()}

    def read() -> Sample:
        lags = dict.fromkeys(groups, 0)
        for (group, _topic), lag in consumer_lags(cluster, list(groups.values()), client_id="load-lag").items():
            lags[service_of[group]] += lag
        return Sample(time.monotonic(), lags, {s: rss_bytes(p) for s, p in pids.items()},
                      int(redis.info("memory")["used_memory"]))

    return read


# -- the run ------------------------------------------------------------------------------------------------

@dataclass
class Rig:
    """The running pieces a phase needs."""

    client: OpenLoopClient
    finals: Finals
    monitor: Monitor
    pids: dict[str, int]
    prefix: str  # of every request id this run sends
    args: argparse.Namespace


def run(args: argparse.Namespace) -> int:
    from strata.config import StrataSettings
    from strata_tools.bench.infra import bench_infra
    from strata_tools.zoo.build import ZooSettings, ensure_zoo
    from strata_tools.zoo.suite import load_suite

    plan = check_arguments(args)
    pools = split_pools(load_suite("train"), args.warmup_families, args.seed)
    _check_fresh_enough(args, plan, pools)
    settings = StrataSettings()
    run_id = uuid.uuid4().hex[:8]
    zoo = ensure_zoo(ZooSettings(cache_dir=settings.cache_dir, zoo_preset=args.zoo))
    with bench_infra(settings, run_id, "load") as infra:
        return _run(args, plan, pools, infra, zoo, run_id)


def _check_fresh_enough(args: argparse.Namespace, plan: Plan, pools: Pools) -> None:
    """Refuse before starting anything when the fresh mix could run out of never-sent prompts."""
    from strata.errors import CliError

    if "fresh" not in plan.mixes or args.soak:
        return
    poisson = args.arrivals == "poisson"
    needed = sum(len(send_offsets(r, args.step_seconds, args.seed, poisson)) for r in plan.rates)
    needed += len(send_offsets(2 * max(plan.rates), args.overload_seconds, args.seed, poisson))
    if needed > len(pools.fresh):
        raise CliError(f"--rates {args.rates} over --step-seconds {args.step_seconds:g} (and the overload at twice "
                       f"the highest rate) need up to {needed} fresh prompts; the train split has {len(pools.fresh)}")


def _run(args: argparse.Namespace, plan: Plan, pools: Pools, infra: Any, zoo: Any, run_id: str) -> int:
    from strata import redis_client, rpc
    from strata.v1 import scheduler_pb2_grpc
    from strata_tools.tiering.arms import LiveTiers

    print(f"load bench: {args.zoo} zoo, open-loop Submit ({args.arrivals} arrivals, one sample each), "
          f"final-reward p99 bound {args.p99_bound_ms:g} ms, deadline {args.final_deadline:g} s", flush=True)
    live = LiveTiers(infra, zoo, run_id, review_seconds=0.0, seed=args.seed)
    with live.started():
        print(f"  warm-up: {len(pools.warmup)} prompts x {WARMUP_SAMPLES} samples ...", flush=True)
        live.run_arm("warm-up", [_Text(t) for t in pools.warmup], "scheduler", WARMUP_TIMEOUT_S,
                     lambda line: print(line, flush=True), n_samples=WARMUP_SAMPLES)
        groups = run_groups(infra, run_id)
        pids = service_pids(live.ports, os.getpid())
        with contextlib.ExitStack() as opened:  # closed in reverse: the client first, Redis last
            redis = redis_client.connect(infra.redis_address, socket_timeout=10)
            opened.callback(redis.close)
            channel = opened.enter_context(rpc.channel(live.scheduler_address))
            prefix = f"load-{run_id}"
            finals = Finals(infra, prefix)
            opened.callback(finals.close)
            monitor = Monitor(stack_reader(infra, groups, pids, redis), args.sample_interval)
            opened.callback(monitor.close)
            client = OpenLoopClient(grpc_submitter(scheduler_pb2_grpc.SchedulerStub(channel), args.submit_timeout),
                                    args.workers)
            opened.callback(client.close)
            rig = Rig(client, finals, monitor, pids, prefix, args)
            print(f"  watching consumer groups of {', '.join(groups)}; services {', '.join(pids)}", flush=True)
            return _soak(rig, pools) if args.soak else _steps_and_overload(rig, plan, pools)


@dataclass(frozen=True)
class _Text:
    """What ``ArmRunner.run_arm`` reads of a record: its text."""

    text: str


def run_phase(rig: Rig, mix: str, rate: float, duration_s: float, prompts: Iterator[str],
              seed: int) -> tuple[list[Call], StepFigures]:
    """Send ``prompts`` at ``rate`` for ``duration_s``, wait for the lag to drain and the finals to arrive
    (or their deadline to pass); the calls and the step's figures."""
    args = rig.args
    offsets = send_offsets(rate, duration_s, seed, args.arrivals == "poisson")
    before = rig.monitor.last_before(time.monotonic())
    cpu_before = {s: cpu_seconds(p) for s, p in rig.pids.items()}
    started = time.monotonic()
    calls = rig.client.run(offsets, requests_of(prompts, f"{rig.prefix}-{mix}-{rate:g}-{seed}"))
    ended = time.monotonic()
    cpu = {s: (cpu_seconds(p) - cpu_before[s]) / (ended - started) for s, p in rig.pids.items()}
    drained_s = rig.monitor.wait_drained(args.drain_timeout)
    rig.finals.wait(calls, args.final_deadline)
    finals_ms = final_latencies_ms(calls, rig.finals.arrivals(), args.final_deadline)
    figures = step_figures(mix, rate, started, duration_s, calls, finals_ms, rig.monitor.between(started, ended),
                           before)
    return calls, replace(figures, cpu_per_s=cpu, drained_s=drained_s)


def _steps_and_overload(rig: Rig, plan: Plan, pools: Pools) -> int:
    args = rig.args
    fresh = iter(pools.fresh)
    streams = {"skip": skip_prompts(pools, random.Random(args.seed)), "fresh": fresh}
    steps: dict[str, list[StepFigures]] = {mix: [] for mix in plan.mixes}
    print_header()
    for mix in plan.mixes:
        for i, rate in enumerate(plan.rates):
            print(f"  {mix} at {rate:g}/s: sending for {args.step_seconds:g} s, then draining ...", flush=True)
            _, figures = run_phase(rig, mix, rate, args.step_seconds, streams[mix], args.seed * 1000 + i)
            steps[mix].append(figures)
            print_step(figures)
            if not within_bound(figures, args.p99_bound_ms):
                print(f"  {mix}: {rate:g}/s misses the bound; higher rates are not stepped", flush=True)
                break
    fresh_knee = knee(steps.get("fresh", []), args.p99_bound_ms)
    overload_rate = 2 * (fresh_knee.offered_rate if fresh_knee else max(plan.rates))
    print(f"  overload: {overload_rate:g}/s for {args.overload_seconds:g} s, then nothing ...", flush=True)
    calls, overload = run_phase(rig, "overload", overload_rate, args.overload_seconds, fresh, args.seed * 1000 + 999)
    print_step(overload)
    accounting = account(calls, rig.finals.arrivals(), args.final_deadline)
    return report(steps, accounting, overload.drained_s, args.p99_bound_ms)


def _soak(rig: Rig, pools: Pools) -> int:
    args = rig.args
    print(f"  soak: skip mix at {args.soak_rate:g}/s for {args.soak:g} s ...", flush=True)
    reading_timeout_s = 10 * args.sample_interval + 30  # a reading costs a round of Kafka admin calls
    start = rig.monitor.fresh(reading_timeout_s)
    calls, figures = run_phase(rig, "soak", args.soak_rate, args.soak, skip_prompts(pools, random.Random(args.seed)),
                               args.seed)
    end = rig.monitor.fresh(reading_timeout_s)
    print_header()
    print_step(figures)
    accounting = account(calls, rig.finals.arrivals(), args.final_deadline)
    rss_growth = max((growth(start.rss_bytes.get(s, 0), end.rss_bytes.get(s, 0)) for s in rig.pids),
                     default=float("nan")) if start and end else float("nan")
    redis_growth = growth(start.redis_bytes, end.redis_bytes) if start and end else float("nan")
    print(f"soak seconds={args.soak:g} accepted={accounting.accepted} lost={accounting.lost} "
          f"doubled={accounting.doubled} rss_growth={rss_growth:.3f} redis_growth={redis_growth:.3f}")
    return 0 if not accounting.lost and not accounting.doubled else 1


def growth(start: float, end: float) -> float:
    """``end`` over ``start`` minus one; nan without a start."""
    return end / start - 1 if start > 0 else float("nan")


# -- the report -------------------------------------------------------------------------------------------------

def print_header() -> None:
    print(f"{'mix':<8} {'offered':>7} {'sent/s':>7} {'ok/s':>6} {'skip':>5} {'late send p99':>13} "
          f"{'submit p50/p99 ms':>18} {'final p50/p99 ms':>18} {'late':>5} {'drained':>8}  refused/s", flush=True)


def print_step(step: StepFigures) -> None:
    """One row of the table, then the stack's figures under it."""
    refused = ", ".join(f"{c} {r:.2f}" for c, r in sorted(step.refused_per_s.items())) or "-"
    drained = f"{step.drained_s:.0f} s" if step.drained_s is not None else "no"
    print(f"{step.mix:<8} {step.offered_rate:>7g} {step.sent_per_s:>7.2f} {step.accepted_per_s:>6.2f} "
          f"{step.skip_share:>5.0%} {step.send_late_p99_ms:>10.0f} ms "
          f"{_ms(step.submit_p50_ms):>8}/{_ms(step.submit_p99_ms):<9} {_ms(step.final_p50_ms):>8}/"
          f"{_ms(step.final_p99_ms):<9} {step.late:>5} {drained:>8}  {refused}", flush=True)
    print(f"{'':<8} lag max {_pairs(step.max_lag, '{:d}')}; CPU s/s {_pairs(step.cpu_per_s, '{:.2f}')}; "
          f"RSS MB {_pairs(step.rss_mb, '{:.0f}')}; Redis {step.redis_mb:.1f} MB; decisions "
          f"{_pairs({d.removeprefix('DECISION_').lower(): n for d, n in step.decisions.items()}, '{:d}')}",
          flush=True)


def _ms(value: float) -> str:
    return "late" if value == float("inf") else f"{value:.0f}"


def _pairs(values: Mapping[str, Any], fmt: str) -> str:
    return ", ".join(f"{k} {fmt.format(v)}" for k, v in sorted(values.items())) or "-"


def last_line(steps: Mapping[str, Sequence[StepFigures]], overload: Accounting, drained_s: float | None,
              p99_bound_ms: float) -> str:
    knees = {mix: knee(steps.get(mix, []), p99_bound_ms) for mix in MIXES}
    fresh_knee = knees["fresh"]
    service, by = bottleneck(past_knee(steps.get("fresh") or steps.get("skip") or [], p99_bound_ms))
    hint_share = overload.with_hint / overload.refused if overload.refused else float("nan")
    return (f"load knee_skip={_rate(knees['skip'])} knee_fresh={_rate(fresh_knee)} "
            f"p99_final_ms={fresh_knee.final_p99_ms if fresh_knee else float('nan'):.0f} "
            f"overload_lost={overload.lost} overload_doubled={overload.doubled} bottleneck={service} "
            f"bottleneck_by={by or '-'} overload_refused={overload.refused} "
            f"overload_bad_refusals={overload.bad_refusals} retry_hint_share={hint_share:.3f} "
            f"drained_s={drained_s if drained_s is not None else -1:.0f} p99_bound_ms={p99_bound_ms:g} "
            f"skip_mix_skipped={skipped_share(steps.get('skip', [])):.3f}")


def skipped_share(steps: Sequence[StepFigures]) -> float:
    """Of the accepted prompts of ``steps``, the share the scheduler skipped; nan without any."""
    accepted = sum(n for step in steps for n in step.decisions.values())
    skipped = sum(step.decisions.get("DECISION_SKIP", 0) for step in steps)
    return skipped / accepted if accepted else float("nan")


def _rate(step: StepFigures | None) -> str:
    return f"{step.offered_rate:g}" if step else "0"


def report(steps: Mapping[str, Sequence[StepFigures]], overload: Accounting, drained_s: float | None,
           p99_bound_ms: float) -> int:
    """The knees, the overload's verdict and the last line; 1 when the overload lost, doubled or mis-refused
    something, or its lag did not drain."""
    print()
    for mix, mix_steps in steps.items():
        found = knee(mix_steps, p99_bound_ms)
        print(f"{mix}: knee {_rate(found)}/s (final p99 within {p99_bound_ms:g} ms and >= "
              f"{MIN_ACCEPTED_SHARE:.0%} of the offered rate accepted); {skipped_share(mix_steps):.0%} of its "
              "accepted prompts skipped")
        if mix_steps and all(within_bound(step, p99_bound_ms) for step in mix_steps):
            print(f"{mix}: no step missed the bound, so the knee is at least {_rate(found)}/s and the bottleneck a "
                  "reading of an unsaturated stack: step higher rates to find them")
    print(f"overload: {overload.accepted} accepted, {overload.refused} refused ({overload.with_hint} with a retry "
          f"hint, {overload.bad_refusals} with another code, {overload.served_refused} served all the same); "
          f"{overload.lost} accepted without a final in time, {overload.doubled} with more than one")
    print(last_line(steps, overload, drained_s, p99_bound_ms))
    failed = overload.lost or overload.doubled or overload.bad_refusals or drained_s is None
    return 1 if failed else 0
