"""The simulated stream (parts 1-6 and 9 of ``strata bench scheduler``): ``run_routing`` submits a stream of
suite prompts batch by batch to the scheduler service in this process, the simulated rollout tier behind it
on Kafka, and counts each submission under Strata's knn rule, the GRESO-style baseline and no skipping
(``RuleResult``, with R11's Level-2 share and bad rollouts caught) and for the ceiling any rule could reach.
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc
import numpy as np

from strata import rpc
from strata.bus import Publisher, topics
from strata.bus.admin import GroupLag, delete_groups, start_group_at_end
from strata.errors import CliError
from strata.hashing import content_hash
from strata.service import start_service, stop_service
from strata.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.bench.reuse_ceiling import CeilingResult, ReuseHistory
from strata_tools.bench.scheduler.common import OWN_HISTORY, SYNC_TIMEOUT_S, CachedEncoder, rule_of, wait_for_stats
from strata_tools.bench.simulated_tier import SimulatedPolicy, SimulatedRolloutTier
from strata_tools.rm.onpolicy import BAD_THRESHOLD

if TYPE_CHECKING:
    from strata.service import RunningService, ServiceParts
    from strata_tools.task.suite import PromptRecord
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.stats import RewardStats

PROGRESS_EVERY = 20  # batches between progress lines


@dataclass
class RuleResult:
    name: str
    submitted: int = 0
    rollouts: int = 0  # submissions that triggered a rollout (Level-1 or Level-2)
    level2: int = 0
    reuse_errors: list[float] | None = None
    reasons: Counter[str] = field(default_factory=Counter)  # decisions by the rule that made them
    errors_by_rule: dict[str, list[float]] = field(default_factory=dict)  # each skip's reuse error, by rule
    # --error-anatomy, by rule: (error against the expected reward, the truth's own error, the policy's drift
    # since the prompt's last rollout: own history only, else nan)
    anatomy: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    nonrisk: int = 0  # submissions not on a risk topic (risk goes to Level-2 under every rule)
    nonrisk_level2: int = 0  # of those, sent to Level-2 (R11: uncertain neighbourhood or marked cluster)
    bad_samples: int = 0  # their rollouts the oracle scores under BAD_THRESHOLD, wherever routed
    bad_level2: int = 0  # of those, in submissions sent to Level-2: the bad cases R11 caught

    @property
    def level2_share(self) -> float:
        return self.nonrisk_level2 / self.nonrisk if self.nonrisk else float("nan")

    @property
    def bad_caught(self) -> float:
        return self.bad_level2 / self.bad_samples if self.bad_samples else float("nan")

    @property
    def trigger_rate(self) -> float:
        return self.rollouts / self.submitted if self.submitted else 0.0

    @property
    def mae(self) -> float:
        return float(np.mean(self.reuse_errors)) if self.reuse_errors else float("nan")


def greso_usable(mine: RewardStats | None, version: int, settings: SchedulerSettings) -> bool:
    """GRESO-style: the prompt's own statistics alone, with the scheduler's thresholds and staleness."""
    return (mine is not None and mine.count >= settings.min_samples_per_neighbour
            and mine.variance < settings.low_variance_threshold
            and version - mine.policy_version <= settings.max_policy_lag)


def make_stream(records: Sequence[PromptRecord], passes: int, seed: int) -> list[PromptRecord]:
    """Every record ``passes`` times, each pass in its own shuffled order."""
    stream: list[PromptRecord] = []
    order_rng = random.Random(seed + 2)
    for _ in range(passes):
        batch = list(records)
        order_rng.shuffle(batch)
        stream.extend(batch)
    return stream


@dataclass
class _RoutingRig:
    """The stack one routing run streams through: the scheduler in process, the simulated tier beside it."""

    policy: SimulatedPolicy
    tier_group: str
    publisher: Publisher
    tier: SimulatedRolloutTier
    lag: GroupLag
    parts: ServiceParts
    engine: SchedulerEngine
    running: RunningService
    channel: grpc.Channel
    stub: scheduler_pb2_grpc.SchedulerStub
    stop_tier: threading.Event
    tier_thread: threading.Thread


def _start_routing(args: argparse.Namespace, settings: SchedulerSettings, encoder: CachedEncoder, run_id: str,
                   records: Sequence[PromptRecord]) -> _RoutingRig:
    """The scheduler service, its statistics group and the simulated tier, started on fresh consumer groups."""
    from svc_scheduler.__main__ import build_parts

    policy = SimulatedPolicy(records, args.seed, args.truth_samples)
    by_hash = {content_hash(r.text): r for r in records}  # the scheduler's prompt hash

    tier_group = f"bench-sched-tier-{run_id}"
    stats_topics = [topics.REWARDS_SCORED, topics.POLICY_UPDATED, topics.RM_UPDATED]
    # All of the statistics worker's topics: replayed policy / RM versions of other runs would
    # make this run's statistics look stale or of the wrong reward model.
    start_group_at_end(settings, settings.stats_group_id, stats_topics)
    start_group_at_end(settings, tier_group, [topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL2])
    publisher = Publisher(settings, client_id=tier_group)
    tier = SimulatedRolloutTier(settings, tier_group, policy, by_hash, publisher)
    lag = GroupLag(settings, settings.stats_group_id, [topics.REWARDS_SCORED])
    parts, engine = build_parts(settings, encoder)
    running = start_service(parts)
    channel = rpc.channel(f"127.0.0.1:{running.port}")
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    stop_tier = threading.Event()
    tier_thread = threading.Thread(target=tier.run, args=(stop_tier,), name="bench-rollout-tier")
    tier_thread.start()
    return _RoutingRig(policy, tier_group, publisher, tier, lag, parts, engine, running, channel, stub, stop_tier,
                       tier_thread)


def _stop_routing(settings: SchedulerSettings, rig: _RoutingRig) -> None:
    """Stop the tier and the service, then delete the run's consumer groups."""
    rig.stop_tier.set()
    rig.tier_thread.join()
    rig.channel.close()
    stop_service(rig.parts, rig.running, grace_s=1.0)
    rig.lag.close()
    rig.publisher.close()
    delete_groups(settings, [rig.tier_group, settings.stats_group_id], "bench-scheduler-cleanup")


@dataclass
class _Tally:
    """What a routing run accumulates: the three rules' results and what the baselines and ceiling remember."""

    knn: RuleResult
    greso: RuleResult
    everything: RuleResult
    own: dict[str, RewardStats]  # GRESO: each prompt's own statistics
    history: ReuseHistory  # the ceiling's: every submission rolled out
    ceiling: CeilingResult
    version: int = 1  # the simulated policy's
    rolled: dict[str, int] = field(default_factory=dict)  # prompt text -> version of Strata's latest rollout of it

    @classmethod
    def fresh(cls, settings: SchedulerSettings) -> _Tally:
        """Empty results for the three rules, the policy at version 1."""
        return cls(RuleResult("knn (Strata)", reuse_errors=[]), RuleResult("GRESO same-prompt", reuse_errors=[]),
                   RuleResult("no skipping"), {}, ReuseHistory(settings.max_policy_lag), CeilingResult())


@dataclass(frozen=True)
class _Streamed:
    """What the routing summary reads from the stack before it stops."""

    elapsed_s: float
    index_size: int
    marks: int


def run_routing(args: argparse.Namespace, settings: SchedulerSettings, encoder: CachedEncoder, run_id: str,
                records: Sequence[PromptRecord], stream: Sequence[PromptRecord], quiet: bool = False,
                first_version: int = 1) -> tuple[RuleResult, RuleResult, RuleResult, CeilingResult]:
    """``stream`` through the scheduler and the simulated tier, the policy starting at ``first_version``:
    (no skipping, GRESO, knn, the ceiling)."""
    rig = _start_routing(args, settings, encoder, run_id, records)
    tally = _Tally.fresh(settings)
    tally.version = rig.tier.version = first_version
    try:
        streamed = _stream_batches(rig, tally, args, settings, stream, quiet)
    finally:
        _stop_routing(settings, rig)
    if not quiet:
        _print_routing(args, settings, records, len(stream), streamed, rig.tier, tally.version)
    return tally.everything, tally.greso, tally.knn, tally.ceiling


def _stream_batches(rig: _RoutingRig, tally: _Tally, args: argparse.Namespace, settings: SchedulerSettings,
                    stream: Sequence[PromptRecord], quiet: bool) -> _Streamed:
    """Submit ``stream`` batch by batch, each batch's rollouts and statistics folded in before the next."""
    knn = tally.knn
    n_batches = submit_calls(args, len(stream))
    started = time.perf_counter()
    for b in range(n_batches):
        if args.policy_step_every and b and b % args.policy_step_every == 0:
            tally.version += 1  # between batches, as a generator loads new weights between batches
            rig.tier.version = tally.version
        chunk = stream[b * args.batch : (b + 1) * args.batch]
        request_ids = [submission_id(args.seed, b * args.batch + i, record) for i, record in enumerate(chunk)]
        results = _submit_batch(rig.stub, chunk, request_ids, args.n_samples)
        routed = [rid for record, rid, result in zip(chunk, request_ids, results, strict=True)
                  if _record_submission(tally, settings, rig.policy, record, rid, result, args.n_samples,
                                        args.error_anatomy)]
        rig.tier.wait_for(routed, SYNC_TIMEOUT_S)
        wait_for_stats(rig.lag, SYNC_TIMEOUT_S, rig.running)
        if not quiet and ((b + 1) % PROGRESS_EVERY == 0 or b + 1 == n_batches):
            print(f"  batch {b + 1}/{n_batches}: {knn.submitted} submitted, {knn.submitted - knn.rollouts} "
                  f"skipped, {knn.level2} Level-2, policy v{tally.version}, {time.perf_counter() - started:.0f} s",
                  flush=True)
    elapsed = time.perf_counter() - started
    marks = rig.engine.store.summary().counters.get("high_uncertainty_marks", 0)
    return _Streamed(elapsed, len(rig.engine.index), marks)


def submission_id(seed: int, position: int, record: PromptRecord) -> str:
    """The request id of the stream's ``position``-th submission: the simulated rollouts and the audit draw
    follow it, so it names the seed and the submission, never the run (arms and reruns are paired)."""
    return f"bench-s{seed}-{position}-{content_hash(record.text)[:12]}"


def submit_calls(args: argparse.Namespace, submissions: int) -> int:
    """``SubmitBatch`` calls of a stream of ``submissions``."""
    return (submissions + args.batch - 1) // args.batch


def _submit_batch(stub: scheduler_pb2_grpc.SchedulerStub, chunk: Sequence[PromptRecord], request_ids: Sequence[str],
                  n_samples: int) -> Sequence[scheduler_pb2.SubmitBatchResult]:
    """The scheduler's results for one ``SubmitBatch`` call, or a CliError."""
    request = scheduler_pb2.SubmitBatchRequest(requests=[
        scheduler_pb2.SubmitRequest(prompt=r.text, n_samples=n_samples, request_id=rid)
        for r, rid in zip(chunk, request_ids, strict=True)
    ])
    try:
        return stub.SubmitBatch(request, timeout=SYNC_TIMEOUT_S).results
    except grpc.RpcError as exc:
        raise CliError(f"SubmitBatch failed: {exc.code().name} {exc.details()}") from exc


def _record_submission(tally: _Tally, settings: SchedulerSettings, policy: SimulatedPolicy, record: PromptRecord,
                       rid: str, result: scheduler_pb2.SubmitBatchResult, n_samples: int, anatomy: bool) -> bool:
    """Count one submission under every rule; True when the scheduler routed it to the tier."""
    from svc_scheduler.routing import detect_risk

    if result.WhichOneof("result") == "error":
        raise CliError(f"the scheduler refused a suite prompt: {result.error}")
    decision = result.response.decision
    routed = _record_knn(tally.knn, policy, record, result.response, tally.version)
    if routed:
        tally.rolled[record.text] = tally.version
    elif anatomy:
        _record_anatomy(tally, policy, record, result.response)
    tally.everything.submitted += 1
    tally.everything.rollouts += 1
    tally.greso.submitted += 1
    risky = detect_risk(record.text, {}, settings) is not None
    _record_ceiling(tally, policy, record, risky)
    # The tier and both baselines see the same rollouts: a pure function of (request, version).
    rewards = policy.rewards(record, rid, tally.version, n_samples)
    tally.history.add(record.text, record.family, rewards, tally.version)
    if not risky:  # what R11 is for: the rollouts that would have been bad at Level-1
        _record_r11(tally.knn, rewards, decision)
    _record_greso(tally, settings, policy, record, risky, rewards)
    return routed


def _record_anatomy(tally: _Tally, policy: SimulatedPolicy, record: PromptRecord,
                    response: scheduler_pb2.SubmitResponse) -> None:
    """Split one skip's reuse error (``--error-anatomy``): what the reused reward misses of the expected
    reward, what the 8-rollout truth misses of it, and how far the policy moved it since the prompt's last
    rollout (own-history skips: the reused rewards are that rollout's)."""
    rule, version = rule_of(response.reason), tally.version
    expected = policy.expected(record, version)
    then = tally.rolled.get(record.text) if rule == OWN_HISTORY else None
    drift = abs(expected - policy.expected(record, then)) if then is not None else float("nan")
    tally.knn.anatomy.setdefault(rule, []).append(
        (abs(response.reused_reward - expected), abs(policy.truth(record, version) - expected), drift))


def _record_knn(knn: RuleResult, policy: SimulatedPolicy, record: PromptRecord, response: scheduler_pb2.SubmitResponse,
                version: int) -> bool:
    """Strata: a skip reuses a reward, a rollout goes through the tier; True for a rollout."""
    knn.submitted += 1
    rule = rule_of(response.reason)
    knn.reasons[rule] += 1
    if response.decision == common_pb2.DECISION_SKIP:
        error = abs(response.reused_reward - policy.truth(record, version))
        knn.reuse_errors.append(error)
        knn.errors_by_rule.setdefault(rule, []).append(error)
        return False
    knn.rollouts += 1
    knn.level2 += response.decision == common_pb2.DECISION_LEVEL_2
    return True


def _record_ceiling(tally: _Tally, policy: SimulatedPolicy, record: PromptRecord, risky: bool) -> None:
    """The ceiling: what any rule could reuse here, from the history of every earlier submission."""
    tally.ceiling.submitted += 1
    if risky:
        return
    truth = policy.truth(record, tally.version)
    for of_family in (False, True):
        key = record.family if of_family else record.text
        if (known := tally.history.mean(key, tally.version, of_family)) is not None:
            tally.ceiling.add(of_family, abs(known - truth), policy.variance(record, tally.version))


def _record_r11(knn: RuleResult, rewards: Sequence[float], decision: int) -> None:
    """Count a non-risk submission's bad rollouts, and those of them sent to Level-2."""
    bad = sum(value < BAD_THRESHOLD for value in rewards)
    knn.nonrisk += 1
    knn.bad_samples += bad
    if decision == common_pb2.DECISION_LEVEL_2:
        knn.nonrisk_level2 += 1
        knn.bad_level2 += bad


def _record_greso(tally: _Tally, settings: SchedulerSettings, policy: SimulatedPolicy, record: PromptRecord,
                  risky: bool, rewards: Sequence[float]) -> None:
    """GRESO-style: the prompt's own history only (same rewards as the tier's); the same risk rule."""
    from svc_scheduler.stats import RewardObservation, apply_reward

    greso, version = tally.greso, tally.version
    mine = tally.own.get(record.text)
    if not risky and greso_usable(mine, version, settings):
        greso.reuse_errors.append(abs(mine.mean - policy.truth(record, version)))
        return
    greso.rollouts += 1
    greso.level2 += risky
    now = time.time()
    for value in rewards:
        mine = apply_reward(mine, RewardObservation(value, version, "oracle", now),
                            settings.stats_ttl_s, settings.max_policy_lag)
    tally.own[record.text] = mine


def _print_routing(args: argparse.Namespace, settings: SchedulerSettings, records: Sequence[PromptRecord],
                   submissions: int, streamed: _Streamed, tier: SimulatedRolloutTier, version: int) -> None:
    """The routing run's two summary lines: the stream, the risk keywords, the simulated tier."""
    from svc_scheduler.routing import detect_risk

    risk_recall = np.mean([detect_risk(r.text, {}, settings) is not None for r in records if r.risk])
    risk_false = np.mean([detect_risk(r.text, {}, settings) is not None for r in records if not r.risk])
    print(f"routing: {submissions} submissions ({len(records)} prompts x {args.passes} passes, batches of "
          f"{args.batch}) through gRPC + Kafka in {streamed.elapsed_s:.1f} s; index {streamed.index_size} prompts; "
          f"risk keywords: recall {risk_recall:.3f}, false positives {risk_false:.3f}; marks {streamed.marks}")
    print(f"simulated rollout tier: {len(tier.handled)} routed prompts, {tier.rollouts} oracle-scored rollouts; "
          f"policy v1 -> v{version}", flush=True)
