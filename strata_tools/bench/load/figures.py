"""The load bench's figures, all pure: a step's table row from its calls and the stack's readings, the
knee, the bottleneck, what became of the overload's requests, and the report with its last line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.rpc import RETRY_PUSHBACK_KEY
from strata_tools.bench.edge import percentile
from strata_tools.bench.load.client import Call

MIXES = ("skip", "fresh")
REFUSALS_AT_THE_DOOR = ("RESOURCE_EXHAUSTED", "UNAVAILABLE")
MIN_ACCEPTED_SHARE = 0.9  # of the requests a step offered, for it to count below the knee

@dataclass(frozen=True)
class Sample:
    """One reading of the stack: lag per service's consumer group; RSS, threads and open file descriptors per
    service; Redis memory."""

    at: float  # time.monotonic()
    lags: dict[str, int]
    rss_bytes: dict[str, int]
    redis_bytes: int
    fds: dict[str, int] = field(default_factory=dict)
    threads: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StepFigures:
    """One step's figures, as the table and the knee read them."""

    mix: str
    offered_rate: float
    sent_per_s: float
    accepted_per_s: float
    accepted_share: float  # of the requests offered in the step (not of rate x seconds: Poisson counts vary)
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
    """Per accepted call, scheduled send to first final reward in ms (a send the client made late counts its
    lateness: no coordinated omission); inf when none arrived within ``deadline_s``."""
    latencies = []
    for call in calls:
        if call.accepted:
            after_s = min(arrivals.get(call.request_id, ()), default=float("inf")) - call.scheduled_at
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
        accepted_share=len(accepted) / len(calls) if calls else 0.0, refused_per_s=refused,
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
    """Whether a step is below the knee: final p99 within the bound, and most of the requests it offered
    accepted. The share is of the requests the schedule made, not of rate x seconds: at 2/s a 20 s step
    offers 40 +- 6 Poisson arrivals, and 31 of them all accepted is no refusal."""
    return step.final_p99_ms <= p99_bound_ms and step.accepted_share >= MIN_ACCEPTED_SHARE


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
    with_hint: int  # refusals that said when to retry (the trailer, or "retry in X s" in the details)
    served_refused: int  # refused at the door, yet served: the door said no to something it took
    refused_by_code: dict[str, int] = field(default_factory=dict)
    pushback_by_code: dict[str, int] = field(default_factory=dict)  # refusals with the grpc-retry-pushback-ms trailer

    @property
    def with_pushback(self) -> int:
        return sum(self.pushback_by_code.values())


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
        refused_by_code=dict(Counter(c.reply.code for c in refused)),
        pushback_by_code=dict(Counter(c.reply.code for c in refused if c.reply.pushback)),
    )


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
              p99_bound_ms: float, shed_wait_s: float) -> str:
    knees = {mix: knee(steps.get(mix, []), p99_bound_ms) for mix in MIXES}
    fresh_knee = knees["fresh"]
    service, by = bottleneck(past_knee(steps.get("fresh") or steps.get("skip") or [], p99_bound_ms))
    hint_share = overload.with_hint / overload.refused if overload.refused else float("nan")
    pushback_share = overload.with_pushback / overload.refused if overload.refused else float("nan")
    by_code = ",".join(f"{c}:{n}" for c, n in sorted(overload.refused_by_code.items())) or "-"
    return (f"load knee_skip={_rate(knees['skip'])} knee_fresh={_rate(fresh_knee)} "
            f"p99_final_ms={fresh_knee.final_p99_ms if fresh_knee else float('nan'):.0f} "
            f"overload_lost={overload.lost} overload_doubled={overload.doubled} bottleneck={service} "
            f"shed_wait_s={shed_wait_s:g} bottleneck_by={by or '-'} overload_refused={overload.refused} "
            f"overload_refused_by={by_code} overload_bad_refusals={overload.bad_refusals} "
            f"retry_hint_share={hint_share:.3f} pushback_share={pushback_share:.3f} "
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
           p99_bound_ms: float, shed_wait_s: float) -> int:
    """The knees, the overload's verdict and the last line; 1 when the overload lost, doubled or mis-refused
    something, or its lag did not drain."""
    print()
    for mix, mix_steps in steps.items():
        found = knee(mix_steps, p99_bound_ms)
        print(f"{mix}: knee {_rate(found)}/s (final p99 within {p99_bound_ms:g} ms and >= "
              f"{MIN_ACCEPTED_SHARE:.0%} of the offered requests accepted); {skipped_share(mix_steps):.0%} of its "
              "accepted prompts skipped")
        if mix_steps and all(within_bound(step, p99_bound_ms) for step in mix_steps):
            print(f"{mix}: no step missed the bound, so the knee is at least {_rate(found)}/s and the bottleneck a "
                  "reading of an unsaturated stack: step higher rates to find them")
    codes = ", ".join(f"{c} {n} ({overload.pushback_by_code.get(c, 0)} with the {RETRY_PUSHBACK_KEY} trailer)"
                      for c, n in sorted(overload.refused_by_code.items())) or "none"
    print(f"overload: {overload.accepted} accepted, {overload.refused} refused ({overload.with_hint} with a retry "
          f"hint, {overload.bad_refusals} with another code, {overload.served_refused} served all the same); "
          f"{overload.lost} accepted without a final in time, {overload.doubled} with more than one")
    print(f"overload refusals by code: {codes}")
    print(last_line(steps, overload, drained_s, p99_bound_ms, shed_wait_s))
    failed = overload.lost or overload.doubled or overload.bad_refusals or drained_s is None
    return 1 if failed else 0
