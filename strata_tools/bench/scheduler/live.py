"""``--live`` (part 8 of ``strata bench scheduler``): ``run_live`` sends a stream of whole paraphrase
families through the real scheduler, probe, generators and reward models (the ``--live-zoo`` preset, each
service in its own process, the learner training the policy with ``--live-learner``), batch by batch, and
reads the live scheduler's audit statistics into a ``LiveResult``; ``audit_error_by_rule`` scores each
audited skip by the rule that would have skipped it.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from strata import rpc
from strata.bus import topics
from strata.bus.admin import GroupLag
from strata.v1 import common_pb2, learner_pb2, learner_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.bench.scheduler.common import AUDITED, SYNC_TIMEOUT_S, rule_of, wait_for_stats
from strata_tools.tiering.arms import LiveTiers
from strata_tools.train import CPU_LEARNER_ARGS

if TYPE_CHECKING:
    from strata.v1.learner_pb2 import LearnerStatus
    from strata_tools.task.suite import PromptRecord
    from svc_scheduler.config import SchedulerSettings


_AUDIT_REASON = re.compile(r"would have skipped reusing (\S+); rolled out to check it\. (.*)\Z", re.DOTALL)


def audit_error_by_rule(requests: Sequence[Any], n_samples: int) -> dict[str, list[float]]:
    """Each audited skip's reuse error, by the rule that would have skipped it, as the scheduler scores its
    audit: |mean of the request's first ``n_samples`` fresh rewards - the reward it would have reused|, the
    fresh rewards in arrival order, one per response, provisional (awaiting annotation) ones left out, the
    reused reward as the reason prints it (3 decimals).
    ``requests``: ``strata_tools.train.Request``; an audit with fewer fresh rewards is not scored."""
    errors: dict[str, list[float]] = {}
    for request in requests:
        found = _AUDIT_REASON.search(request.reason) if rule_of(request.reason) == AUDITED else None
        if found is None:
            continue
        fresh: dict[str, float] = {}
        for event in request.events:
            if event.scorer != common_pb2.SCORER_REUSED and not event.awaiting_annotation:
                fresh.setdefault(event.response_hash, event.reward)
        if len(fresh) >= n_samples > 0:
            first = list(fresh.values())[:n_samples]
            errors.setdefault(rule_of(found.group(2)), []).append(abs(sum(first) / n_samples - float(found.group(1))))
    return errors


@dataclass
class LiveResult:
    """A stream through the real scheduler, probe, generators and reward models."""

    zoo: str
    submitted: int
    rollouts: int  # submissions rolled out (Level-1, Level-2, audited skips)
    skipped: int
    level2: int
    audits: int
    audits_scored: int
    audit_mae: float | None  # mean |fresh mean reward - reused reward| over the scored audits
    audit_precision: float | None
    marks: int
    wall_s: float
    audit_mae_ci95: float | None = None  # half-width of the audit MAE's 95 % interval
    audit_distrusts: int = 0  # audits that erred and took the neighbours they reused out of reuse
    audit_floors: int = 0  # per-neighbour similarity floors those audits raised
    policy_versions: tuple[int, ...] = ()  # --live-learner: the learner's version after each batch

    @property
    def trigger_rate(self) -> float:
        return self.rollouts / self.submitted if self.submitted else 0.0

    @property
    def skip_rate(self) -> float:
        return self.skipped / self.submitted if self.submitted else 0.0


def live_passes(args: argparse.Namespace) -> int:
    """Epochs of the live stream: ``--live-passes``, or ``--passes`` when that is 0."""
    return args.live_passes or args.passes


def live_families(records: Sequence[PromptRecord], n: int, seed: int) -> list[PromptRecord]:
    """Every prompt of ``n`` paraphrase families, risk families at their share (pure)."""
    by_family: dict[str, list[PromptRecord]] = {}
    for record in records:
        by_family.setdefault(record.family, []).append(record)
    rng = random.Random(seed + 7)
    names = sorted(by_family)
    risky = [f for f in names if by_family[f][0].risk]
    safe = [f for f in names if not by_family[f][0].risk]
    n_risky = min(len(risky), round(n * len(risky) / len(names))) if names else 0
    chosen = rng.sample(risky, n_risky) + rng.sample(safe, min(len(safe), n - n_risky))
    return [r for f in sorted(chosen) for r in by_family[f]]


def run_live(args: argparse.Namespace, settings: SchedulerSettings, run_id: str,
             stream: Sequence[PromptRecord]) -> LiveResult:
    """``stream`` through the real services (each its own process, the ``--live-zoo`` models), batch
    by batch: each batch's rewards are folded into the scheduler's statistics before the next."""

    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    zoo = ensure_zoo(ZooSettings(cache_dir=settings.cache_dir, zoo_preset=args.live_zoo))
    live_id = f"{run_id}-live"
    live = LiveTiers(settings, zoo, live_id, review_seconds=0.0, seed=args.seed,
                     scheduler_env={"STRATA_AUDIT_SHARE": repr(args.live_audit_share)},
                     learner_args=CPU_LEARNER_ARGS if args.live_learner else None)
    policy = "trained by the learner as it goes" if args.live_learner else "fixed"
    print(f"live: zoo {zoo.root.name} ({args.live_zoo}), {len(stream)} submissions, n_samples {args.n_samples}, "
          f"audit share {args.live_audit_share:g}, policy {policy}; each service in its own process", flush=True)
    versions: list[int] = []
    skipped = level2 = 0
    by_rule: Counter[str] = Counter()
    audit_errors: dict[str, list[float]] = {}
    started = time.perf_counter()
    n_batches = (len(stream) + args.batch - 1) // args.batch
    with live.started():
        lag = GroupLag(settings, f"bench-{live_id}-stats", [topics.REWARDS_SCORED])
        try:
            for b in range(n_batches):
                chunk = stream[b * args.batch : (b + 1) * args.batch]
                arm = live.run_arm(f"live batch {b + 1}", chunk, "scheduler", SYNC_TIMEOUT_S * 5,
                                   lambda line: print(line, flush=True), n_samples=args.n_samples,
                                   tag=f"{live_id}-{b}")
                skipped += sum(r.decision == "DECISION_SKIP" for r in arm.requests)
                by_rule.update(rule_of(r.reason) for r in arm.requests)
                for rule, errors in audit_error_by_rule(arm.requests, args.n_samples).items():
                    audit_errors.setdefault(rule, []).extend(errors)
                level2 += sum(r.decision == "DECISION_LEVEL_2" for r in arm.requests)
                wait_for_stats(lag, SYNC_TIMEOUT_S)
                at_version = ""
                if args.live_learner:
                    status = _learner_status(live.ports["learner"])
                    versions.append(status.policy_version)
                    at_version = (f", policy v{status.policy_version} (learner: {status.samples_accepted} samples "
                                  f"taken, {status.samples_dropped_stale} dropped as stale)")
                print(f"  live batch {b + 1}/{n_batches}: {(b + 1) * args.batch if b + 1 < n_batches else len(stream)} "
                      f"submitted, {skipped} skipped, {level2} Level-2{at_version}, "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
        finally:
            lag.close()
        print("live decisions by rule: " + ", ".join(f"{name} {count} ({count / len(stream):.1%})"
                                                    for name, count in by_rule.most_common()), flush=True)
        if audit_errors:
            print("live audit error by rule (the rule that would have skipped): " + ", ".join(
                f"{rule} {np.mean(errors):.3f} over {len(errors)} audits"
                for rule, errors in sorted(audit_errors.items(), key=lambda item: -len(item[1]))), flush=True)
        with rpc.channel(live.scheduler_address) as channel:
            stats = scheduler_pb2_grpc.SchedulerStub(channel).Stats(scheduler_pb2.StatsRequest(), timeout=30)
    return _live_result(zoo.root.name, len(stream), skipped, level2, stats, time.perf_counter() - started, versions)


def _live_result(zoo: str, submitted: int, skipped: int, level2: int, stats: scheduler_pb2.StatsResponse,
                 wall_s: float, versions: Sequence[int]) -> LiveResult:
    """The live run's figures: its own counts and the live scheduler's audit statistics."""
    def optional(name: str) -> float | None:
        return getattr(stats, name) if stats.HasField(name) else None

    return LiveResult(
        zoo=zoo, submitted=submitted, rollouts=submitted - skipped, skipped=skipped, level2=level2,
        audits=stats.audits, audits_scored=stats.audits_scored, audit_mae=optional("audit_reuse_mae"),
        audit_precision=optional("audit_precision"), marks=stats.high_uncertainty_marks, wall_s=wall_s,
        audit_mae_ci95=optional("audit_reuse_mae_ci95"), audit_distrusts=stats.audit_distrusts,
        audit_floors=stats.audit_similarity_floors, policy_versions=tuple(versions),
    )


def _learner_status(port: int) -> LearnerStatus:
    """The live learner's status: the policy version it has published (0: none yet), samples taken, dropped."""
    with rpc.channel(f"127.0.0.1:{port}") as channel:
        return learner_pb2_grpc.LearnerStub(channel).Status(learner_pb2.LearnerStatusRequest(), timeout=30)
