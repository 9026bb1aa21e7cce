"""``strata bench scheduler``: what embedding-based skipping (R10-R12) saves, and what it costs.

What runs. The scheduler, Kafka, Redis and the statistics worker are the real ones; the tiers behind
the scheduler (probe, generators, reward models) are simulated, because generating and scoring the
~11k rollouts of a run with real models does not fit on a CPU in reasonable time:

1. **Routing on the zoo's prompt suite, through the stack.** Kafka and Redis are the bench's own
   (free ports, a throw-away state dir, purged at the end) unless external clusters are configured;
   the scheduler service runs in this process as in deployment
   (gRPC server on a free local port, encoder, FAISS index, Redis, the Kafka statistics worker in a
   fresh consumer group, keys under a fresh Redis prefix, so a run never sees an earlier run's data).
   Every suite prompt but the sealed test split's (8 topics x subjects x intents, 7 paraphrases per family) is
   submitted ``--passes`` times in shuffled order, ``--batch`` prompts per ``SubmitBatch`` call, with
   ``n_samples=--n-samples``; each response gives the decision (skip with a reused reward, Level-1,
   Level-2).
2. **A simulated rollout tier** is a real Kafka worker on ``strata.prompts.level0`` and
   ``strata.prompts.level2``: for each routed prompt it writes ``n_samples`` responses with the
   simulated policy and publishes their **oracle judge** scores as final ``RewardScored`` events
   (``SCORER_HUMAN``, RM version ``oracle``), which the scheduler's statistics worker folds into
   Redis. The simulated policy: per paraphrase family a competence (mostly good, mostly bad with one
   consistent failure mode, or mixed), responses written by the zoo's corpus (``reference_response``
   / ``degrade``). Rewards are deterministic per (prompt, request id, policy version, sample), so a
   redelivered event republishes identical rewards and the statistics count them once. Request ids
   are ``--seed`` and the submission's place in the stream, not the run: two runs with one seed draw
   the same rollouts and audits, and the arms of one run (``--compare-*``) are paired, each submission
   drawn alike in every arm that rolls it out; ``--seed`` draws another stream of rollouts.
3. **Stream semantics without sleeps:** after each batch the bench waits until the tier has handled
   every routed prompt of the batch and the statistics group's committed offsets reach the end of
   ``strata.rewards.scored``, so a later batch sees every earlier reward.
4. **A moving policy** (``--policy-step-every N`` batches; 0: fixed): the policy version increments
   and every family's chance of a good answer closes 10% of its gap to 0.95. The simulated tier
   stamps its rewards with the new version, and the scheduler learns it from them as it does from a
   real generator's; statistics older than ``max_policy_lag`` versions stop being reused. Nothing is
   published to ``strata.policy.updated``: real generators replay that topic and would try to load a
   checkpoint that does not exist.
5. **Baselines in this process, on the same stream and the same rewards:** *no skipping* and the
   *GRESO-style* rule: skip a prompt only from its **own** reward history (at least
   ``min_samples_per_neighbour`` rewards with variance under ``low_variance_threshold``, restarted
   when the policy moved more than ``max_policy_lag`` versions). Risk prompts go to Level-2 under
   every rule, so the comparison isolates the reuse rule.
6. **Reuse error:** for every skipped prompt, |reused reward - oracle truth|, the truth being the
   mean oracle reward of ``--truth-samples`` rollouts of that prompt by the policy current at the skip.
7. **Decision latency** (encode + search + Redis + rules for one prompt, in process) with 10k and
   100k prompts indexed (synthetic clustered unit vectors; queries are real suite prompts), and
   **ANN recall@10** of the HNSW index against exact search (synthetic queries at 100k, and the suite).

8. **``--live``: the simulation checked against the real pipeline.** A smaller stream (every prompt
   of ``--live-families`` paraphrase families, ``--passes`` times) goes through the real scheduler,
   probe, generators and reward models (the ``--live-zoo`` preset's models, each service in its own
   process, run first on a quiet Kafka), batch by batch with each batch's rewards folded in before
   the next; the simulated tier then runs the *same* stream. The live scheduler audits
   ``--live-audit-share`` of its would-be skips, and its reuse error is the audits' (fresh RM rewards
   against the reused one, with its 95 % interval): real tiers have no oracle truth per policy version.
   ``--live-learner`` makes the stream training-shaped: the learner trains the Level-1 policy on the live
   rewards and the generator serves each version it publishes, so the passes meet a moving policy.

The bench refuses to run while another consumer group reads the prompt topics (a running stack's
probe would roll out the bench's prompts and its reward service would score them).
9. **R11's aim**: of the non-risk submissions, the share sent to Level-2, and the share of their bad
   rollouts (oracle < 1.5) that were in them; ``--compare-cluster-marking`` routes the same stream a
   second time with ``cluster_marking`` flipped (its own Redis prefix and statistics group).

10. ``--compare-encoder``: the encoder fine-tuned for "same reward" (issue 39): fine-tuned on this run's own
   history as ``strata encoder finetune`` does (paraphrase families held out together, to measure), or
   loaded from ``--compare-encoder DIR``; the same stream is routed with it at the floor its card
   re-measured, and with the off-the-shelf encoder at that floor (what the floor alone does).

Last line: ``scheduler trigger_reduction= reuse_mae= greso_trigger_reduction= r10_reference= live_skip_rate=
live_reuse_mae= live_audits= live_reuse_mae_lo= live_reuse_mae_hi=`` (the live fields ``nan`` without ``--live``;
``live_audits`` counts the scored audits; the bounds are the live error's 95 % interval, clustered by prompt)
``r11_reference= ... level2_share= bad_caught=``. ``r10_reference``/``r11_reference`` (once ``r10_ceiling``/
``r11_ceiling``) are the perfect chooser's reduction among prompts whose true variance is under R10's/R11's
bound: a reference, not a bound, since a rule whose variance estimate errs low may skip more. With
``--compare-cluster-marking`` it adds ``flipped_level2_share= flipped_bad_caught=``, with ``--compare-encoder``
``tuned_trigger_reduction= tuned_reuse_mae=``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from strata import rpc
from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata.v1 import common_pb2
from strata_tools.bench.reuse_ceiling import CeilingResult, ReuseHistory
from strata_tools.rm.onpolicy import BAD_THRESHOLD

if TYPE_CHECKING:
    import grpc
    import redis

    from strata.bus import Publisher, Topic
    from strata.bus.admin import GroupLag
    from strata.service import RunningService, ServiceParts
    from strata.v1 import scheduler_pb2, scheduler_pb2_grpc
    from strata.v1.learner_pb2 import LearnerStatus
    from strata_tools.bench.simulated_tier import SimulatedPolicy, SimulatedRolloutTier
    from strata_tools.encoder.finetune import FinetuneResult
    from strata_tools.zoo.suite import PromptRecord
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.encoder import Encoder
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.index import PromptIndex
    from svc_scheduler.stats import RewardStats

SYNC_TIMEOUT_S = 120.0  # one batch's rollouts or statistics taking longer means the stack is stuck
OFFSET_POLL_S = 0.02  # interval between reads of the statistics group's committed offsets
PROGRESS_EVERY = 20  # batches between progress lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--passes", type=int, default=2, help="times each suite prompt is submitted")
    parser.add_argument("--n-samples", type=int, default=4, help="rollouts per rolled-out prompt")
    parser.add_argument("--truth-samples", type=int, default=8, help="rollouts averaged for the oracle truth")
    parser.add_argument("--batch", type=int, default=32, help="prompts per SubmitBatch call")
    parser.add_argument("--policy-step-every", type=int, default=40,
                        help="batches between policy updates of the simulated policy (0: fixed policy)")
    parser.add_argument("--limit", type=int, default=0, help="use only this many suite prompts (0: all)")
    parser.add_argument("--latency-sizes", default="10000,100000,1000000", help="index sizes for the latency test")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the decision latency, memory and recall at each size (Redis only)")
    parser.add_argument("--latency-queries", type=int, default=200, help="single-prompt decisions timed per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse-budget", type=float, default=0.3,
                        help="reuse MAE at which the ceiling any rule could reach is measured")
    parser.add_argument("--compare-cluster-marking", action="store_true",
                        help="route the stream a second time with cluster_marking flipped (R11, one run, same "
                             "stream) and print both: Level-2 share and bad rollouts caught")
    parser.add_argument("--compare-encoder", nargs="?", const="finetune", default=None, metavar="DIR",
                        help="route the same stream a second time with another encoder and print both (issue 39): "
                             "a fine-tuned encoder's directory, or, bare, one fine-tuned for same reward on this "
                             "run's own history (strata encoder finetune, paraphrase families held out)")
    parser.add_argument("--error-anatomy", action="store_true",
                        help="split each skip rule's reuse error: against the expected reward (64 rollouts) "
                             "instead of the 8-rollout truth, the truth's own noise, and (own history) how far the "
                             "policy moved the expected reward since the reused rollout; slower")
    parser.add_argument("--live", action="store_true",
                        help="also run a smaller stream through the real probe, generators and reward models, "
                             "next to the simulated tier on the same stream")
    parser.add_argument("--live-families", type=int, default=8,
                        help="paraphrase families (7 prompts each, risk ones at their share) in the live stream")
    parser.add_argument("--live-passes", type=int, default=0,
                        help="epochs of the live families (0: --passes); a training-shaped stream revisits its "
                             "prompt set, and scored audits grow with the later epochs")
    parser.add_argument("--live-zoo", default="ci", help="zoo preset whose models the live tiers serve")
    parser.add_argument("--live-audit-share", type=float, default=0.25,
                        help="share of would-be skips the live scheduler rolls out anyway to measure reuse error")
    parser.add_argument("--live-learner", action="store_true",
                        help="a training-shaped live stream: the learner trains the Level-1 policy on the live "
                             "rewards and publishes each version to the generator while the passes go on")


# -- plumbing: Kafka offsets, a recorder in place of Kafka (latency part), an encoder cache -------------


def wait_for_stats(lag: GroupLag, timeout_s: float, running: RunningService | None = None) -> None:
    """Until the statistics worker's group has folded in everything published so far."""
    from strata.errors import CliError

    def check() -> None:
        if running is not None and running.failures:
            raise CliError(f"the scheduler service failed: {running.failures[0]!r}")

    try:
        lag.wait_caught_up(timeout_s, check, OFFSET_POLL_S)
    except TimeoutError as exc:
        raise CliError(f"timed out: the scheduler's statistics worker is behind ({exc})") from exc


class _Acked:
    def get(self, timeout: float | None = None) -> None:
        return None

    def add_errback(self, *_args: object, **_kwargs: object) -> _Acked:
        return self


class RecordingPublisher:
    """Stands in for ``strata.bus.Publisher`` in the latency part: every event is acknowledged and counted."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def publish(self, topic: Topic[Any], message: object) -> _Acked:
        self.sent[topic.name] = self.sent.get(topic.name, 0) + 1
        return _Acked()

    def close(self) -> None:
        pass


class CachedEncoder:
    """The real encoder, remembering vectors of texts it has seen (later passes cost no encoding)."""

    def __init__(self, encoder: Encoder) -> None:
        self._encoder = encoder
        self.dim = encoder.dim
        self.encoder_id = encoder.encoder_id
        self.n_params = encoder.n_params
        self.count_tokens = encoder.count_tokens
        self.clock = encoder.clock
        self.card = encoder.card  # a fine-tuned encoder's thresholds (build_parts applies them)
        self._cache: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vector in zip(missing, self._encoder.encode(missing), strict=True):
                self._cache[text] = vector
        return np.stack([self._cache[t] for t in texts]) if texts else self._encoder.encode([])

    def encode_counted(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        return self.encode(texts), self.count_tokens(texts)

    def adopt(self, encoder_id: str) -> bool:
        changed = self._encoder.adopt(encoder_id)
        if changed:  # another vector space: nothing remembered holds
            self._cache.clear()
            self.encoder_id = self._encoder.encoder_id
        return changed


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """The engine logs every decision at INFO; thousands of lines would bury the progress lines."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(max(logging.WARNING, level))
    try:
        yield
    finally:
        logger.setLevel(level)


# -- part 1-6: trigger rate and reuse error, through the stack ----------------------------------------


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


AUDITED = "audited skip -> Level-1"  # a would-be skip rolled out anyway (audit_share); a rollout
OWN_HISTORY = "own history -> skip"  # a skip on the prompt's own rewards (--error-anatomy: their policy's drift)
# The rule behind a decision, from the start of its reason (svc_scheduler/routing.py writes them).
_RULES = (("Level-2: high-risk topic", "risk topic -> Level-2"),
          ("Level-2: a response to this prompt was flagged unsafe", "flagged unsafe -> Level-2"),
          ("skip: this prompt has", OWN_HISTORY),
          ("Level-2 before generating", "Level-1's record -> Level-2"),
          ("Level-2:", "uncertain neighbourhood -> Level-2"),
          ("skip: close paraphrases", "close paraphrases -> skip"),
          ("skip:", "known neighbourhood -> skip"),
          ("Level-1 (audit", AUDITED),
          ("Level-1:", "too little known -> Level-1"))


def rule_of(reason: str) -> str:
    return next((name for prefix, name in _RULES if reason.startswith(prefix)), "other")


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
    from strata.bus import Publisher, topics
    from strata.bus.admin import GroupLag, start_group_at_end
    from strata.service import start_service
    from strata.v1 import scheduler_pb2_grpc
    from strata_tools.bench.simulated_tier import SimulatedPolicy, SimulatedRolloutTier
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
    from strata.bus.admin import delete_groups
    from strata.service import stop_service

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
    n_batches = _batches(args, len(stream))
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


def _batches(args: argparse.Namespace, submissions: int) -> int:
    """``SubmitBatch`` calls of a stream of ``submissions``."""
    return (submissions + args.batch - 1) // args.batch


def _submit_batch(stub: scheduler_pb2_grpc.SchedulerStub, chunk: Sequence[PromptRecord], request_ids: Sequence[str],
                  n_samples: int) -> Sequence[scheduler_pb2.SubmitBatchResult]:
    """The scheduler's results for one ``SubmitBatch`` call, or a CliError."""
    import grpc

    from strata.errors import CliError
    from strata.v1 import scheduler_pb2

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
    from strata.errors import CliError
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


# -- part 8: the same kind of stream through the real tiers ---------------------------------------------


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

    from strata.bus import topics
    from strata.bus.admin import GroupLag
    from strata.v1 import scheduler_pb2, scheduler_pb2_grpc
    from strata_tools.tiering.arms import LiveTiers
    from strata_tools.train import CPU_LEARNER_ARGS
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
    from strata.v1 import learner_pb2, learner_pb2_grpc

    with rpc.channel(f"127.0.0.1:{port}") as channel:
        return learner_pb2_grpc.LearnerStub(channel).Status(learner_pb2.LearnerStatusRequest(), timeout=30)


# -- part 7: latency and recall -----------------------------------------------------------------------


def synthetic(n: int, dim: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    """Clustered unit vectors: a centre plus noise (cosine to the centre ~0.8, like paraphrases)."""
    sigma = np.sqrt(0.5625 / dim)
    x = centres[rng.integers(0, len(centres), n)] + rng.normal(scale=sigma, size=(n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall_at_10(index: PromptIndex, queries: np.ndarray) -> float:
    approx, exact = index.search(queries, 10), index.exact_search(queries, 10)
    return float(np.mean([len({h for h, _ in a} & {h for h, _ in e}) / max(1, len(e))
                          for a, e in zip(approx, exact, strict=True)]))


@dataclass(frozen=True)
class LatencyRow:
    """One index size: a single prompt's decision against the stages it cannot avoid, timed in turns."""

    size: int
    kind: str  # the index stage: exact, hnsw, ivf
    build_s: float
    memory_mb: float  # the index's own bytes
    rss_mb: float  # growth of the process while the index was built
    p50: float  # decision (engine.route of one prompt: encode, search, Redis, rules), ms
    p99: float
    encoder_p99: float  # the encoder alone on the same prompt, ms
    search_p99: float  # FAISS search alone for its vector, ms
    redis_p99: float  # one Redis round trip (PING), ms
    limit_p99: float  # p99 of encoder + search + round trip, per prompt
    recall: float  # recall@10 against exact search
    repeat_p99: float = float("nan")  # the decision of the same prompts once indexed (their stored vectors), ms

    @property
    def over_limit(self) -> float:
        return self.p99 / self.limit_p99


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_latency(args: argparse.Namespace, settings: SchedulerSettings, encoder: Encoder,
                client: redis.Redis) -> list[LatencyRow]:
    """One row per ``--latency-sizes`` size, each printed as it is measured."""
    from strata_tools.zoo.suite import load_suite

    rng = np.random.default_rng(args.seed)
    centres = rng.normal(size=(max(100, 2000), encoder.dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    prompts = [r.text for r in random.Random(args.seed).sample(load_suite(), args.latency_queries)]
    rows = []
    for size in [int(s) for s in args.latency_sizes.split(",") if s.strip()]:
        # The engine lives in _latency_at alone: one index in memory at a time.
        rows.append(_latency_at(size, settings, encoder, client, prompts, rng, centres))
    return rows


def _latency_at(size: int, settings: SchedulerSettings, encoder: Encoder, client: redis.Redis,
                prompts: Sequence[str], rng: np.random.Generator, centres: np.ndarray) -> LatencyRow:
    """The latency row of an index of ``size`` synthetic prompts (printed; its Redis keys deleted after)."""
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.store import SchedulerStore

    prefix = f"{settings.redis_prefix}:lat{size}"
    sized = settings.model_copy(update={"redis_prefix": prefix})
    engine = SchedulerEngine(sized, encoder, SchedulerStore(client, sized),
                             ContentStore(client, 3600, sized.content_max_bytes), RecordingPublisher())
    engine.ensure_ready()
    rss_before = _rss_mb()
    built = time.perf_counter()
    for start in range(0, size, 20_000):
        n = min(20_000, size - start)
        vectors = synthetic(n, encoder.dim, rng, centres)
        engine.index.add([f"synthetic-{size}-{start + i}" for i in range(n)], vectors)
    build_s = time.perf_counter() - built
    rss_mb = _rss_mb() - rss_before
    engine.route(prompts[:5])  # warm-up
    stages = _time_stages(engine, encoder, client, sized.k, prompts)
    repeat_ms = _time_repeats(engine, prompts)
    recall = recall_at_10(engine.index, synthetic(300, encoder.dim, rng, centres)) if engine.index.kind != "exact" \
        else 1.0
    memory = getattr(engine.index, "memory_bytes", lambda: 0)() / 2**20
    p50, p99, enc99, search99, redis99, limit99 = (
        float(np.percentile(values, q)) for values, q in ((stages.decision, 50), (stages.decision, 99),
                                                            (stages.encoder, 99), (stages.search, 99),
                                                            (stages.round_trip, 99), (stages.limit, 99)))
    row = LatencyRow(size, engine.index.kind, build_s, memory, rss_mb, p50, p99, enc99, search99, redis99, limit99,
                     recall, float(np.percentile(repeat_ms, 99)))
    print(f"latency: {size} indexed ({row.kind}, built in {build_s:.1f} s, index {memory:.0f} MB, process "
          f"+{rss_mb:.0f} MB): decision p50 {p50:.1f} ms, p99 {p99:.1f} ms; alone p99: encoder {enc99:.1f} ms, "
          f"search {search99:.2f} ms, Redis round trip {redis99:.2f} ms; recall@10 {recall:.3f}; the same "
          f"prompts once indexed: decision p99 {row.repeat_p99:.1f} ms", flush=True)
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        client.delete(key)
    return row


@dataclass
class _StageTimes:
    """Per prompt, in ms: the whole decision and, timed alone just before it, each stage it cannot avoid."""

    decision: list[float] = field(default_factory=list)
    encoder: list[float] = field(default_factory=list)
    search: list[float] = field(default_factory=list)
    round_trip: list[float] = field(default_factory=list)  # one Redis round trip (PING)
    limit: list[float] = field(default_factory=list)  # encoder + search + round trip


def _time_stages(engine: SchedulerEngine, encoder: Encoder, client: redis.Redis, k: int,
                 prompts: Sequence[str]) -> _StageTimes:
    """Each stage alone, then the whole decision, on the same prompt, prompt by prompt."""
    times = _StageTimes()
    for prompt in prompts:
        t0 = time.perf_counter()
        vector, _ = encoder.encode_counted([prompt])
        t1 = time.perf_counter()
        engine.index.search(vector, k)
        t2 = time.perf_counter()
        client.ping()
        t3 = time.perf_counter()
        engine.route([prompt])
        t4 = time.perf_counter()
        times.encoder.append(1000 * (t1 - t0))
        times.search.append(1000 * (t2 - t1))
        times.round_trip.append(1000 * (t3 - t2))
        times.limit.append(1000 * (t3 - t0))
        times.decision.append(1000 * (t4 - t3))
    return times


def _time_repeats(engine: SchedulerEngine, prompts: Sequence[str]) -> list[float]:
    """The decision times (ms) of ``prompts`` once they are indexed."""
    # RLHF submits its prompts every epoch: decided on their stored vectors, with no encoder.
    routed = engine.route(prompts)
    engine.store.index_prompts([r.prompt_hash for r in routed], np.stack([r.vector for r in routed]))
    engine.index.add([r.prompt_hash for r in routed], np.stack([r.vector for r in routed]))
    repeat_ms = []
    for prompt in prompts:
        started = time.perf_counter()
        engine.route([prompt])
        repeat_ms.append(1000 * (time.perf_counter() - started))
    return repeat_ms


def suite_recall(settings: SchedulerSettings, encoder: CachedEncoder) -> float:
    """HNSW (the default parameters) against exact search over the suite's own embeddings."""
    from strata_tools.zoo.suite import load_suite
    from svc_scheduler.index import PromptIndex

    texts = [r.text for r in load_suite()]
    vectors = encoder.encode(texts)
    index = PromptIndex(encoder.dim, 0, settings.hnsw_m, settings.hnsw_ef_construction, settings.hnsw_ef_search)
    index.add([content_hash(t) for t in texts], vectors)
    return recall_at_10(index, vectors)


# -- entry point ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from strata.errors import CliError
    from svc_scheduler.config import SchedulerSettings

    if args.batch < 1 or args.n_samples < 1 or args.passes < 1 or args.policy_step_every < 0 or args.live_passes < 0:
        raise CliError("--batch, --n-samples and --passes must be >= 1, --policy-step-every and --live-passes >= 0")
    run_id = uuid.uuid4().hex[:8]
    settings = SchedulerSettings(
        grpc_port=0, redis_prefix=f"strata:bench:{run_id}", stats_group_id=f"bench-sched-stats-{run_id}",
        watch_lookback_s=0.0,  # Watch is not used: no history replay
        redis_timeout_s=10.0,  # a shared 2-core machine stalls; a bench is not testing fail-fast
    )
    if args.batch > settings.max_batch_size:
        raise CliError(f"--batch {args.batch} is over the scheduler's max_batch_size {settings.max_batch_size}")
    from strata_tools.bench.infra import bench_infra

    with bench_infra(settings, run_id, "scheduler") as settings:
        if args.latency_only:
            return run_latency_only(args, settings)
        return _run(args, settings, run_id)


# the --live subset's run, --compare-cluster-marking, --compare-encoder's arms
SIDE_RUNS = ("sub", "flip", "enc", "floor", "later-base", "later-enc")


def side_run(settings: SchedulerSettings, side: str, **changes: object) -> SchedulerSettings:
    """Settings for a second routing run in this process: its own Redis keys and statistics group."""
    return settings.model_copy(update={"redis_prefix": f"{settings.redis_prefix}-{side}",
                                       "stats_group_id": f"{settings.stats_group_id}-{side}", **changes})


def _run(args: argparse.Namespace, settings: SchedulerSettings, run_id: str) -> int:
    from strata_tools.zoo.suite import load_suite
    from svc_scheduler.encoder import Encoder

    client = checked_redis(settings)
    _print_header(args, settings)
    encoder = Encoder.from_settings(settings)
    suite = load_suite()
    records = random.Random(args.seed).sample(suite, args.limit) if args.limit else suite
    subset = live_families(suite, args.live_families, args.seed) if args.live else []  # whole families
    try:
        measured = _measure(args, settings, run_id, encoder, client, records, subset)
    finally:
        for prefix in (settings.redis_prefix, *(side_run(settings, side).redis_prefix for side in SIDE_RUNS)):
            for key in client.scan_iter(f"{prefix}:*", count=1000):
                client.delete(key)
        client.close()

    _print_rules(measured)
    _print_ceiling(args, settings, measured.ceiling)
    _print_r11(settings, measured)
    if measured.tuned is not None:
        _print_tuned(settings, measured)
    if measured.live is not None and measured.sim_subset is not None:
        _print_live(args, measured.live, measured.sim_subset)
    print()
    print_latency(measured.latency)
    print(f"HNSW recall@10 on the suite's own embeddings: {measured.recall_suite:.3f}")
    _print_last_line(args, settings, measured)
    return 0


def _print_header(args: argparse.Namespace, settings: SchedulerSettings) -> None:
    """The run's first line: where Kafka and Redis are, the skip rule's thresholds, the policy steps."""
    step = f"every {args.policy_step_every} batches" if args.policy_step_every else "never (fixed policy)"
    print(f"scheduler bench: Kafka {settings.kafka_address}, Redis {settings.redis_address_masked} (keys under "
          f"{settings.redis_prefix}:*), k={settings.k}, skip if >= {settings.min_low_variance_neighbours} neighbours "
          f"with variance < {settings.low_variance_threshold}, cosine floor {settings.min_similarity}; policy "
          f"update {step}", flush=True)


@dataclass
class _Measured:
    """Everything a full run's tables and last line quote."""

    everything: RuleResult
    greso: RuleResult
    knn: RuleResult
    ceiling: CeilingResult
    latency: list[LatencyRow]
    recall_suite: float
    live: LiveResult | None  # --live: the real tiers
    sim_subset: RuleResult | None  # --live: the simulated tier on the live stream
    flipped: RuleResult | None  # --compare-cluster-marking
    tuned: TunedRun | None = None  # --compare-encoder


def _measure(args: argparse.Namespace, settings: SchedulerSettings, run_id: str, encoder: Encoder,
             client: redis.Redis, records: Sequence[PromptRecord], subset: Sequence[PromptRecord]) -> _Measured:
    """The live run, the routing runs, the latency sizes and the suite's recall, in that order."""
    cached = CachedEncoder(encoder)
    subset_stream = make_stream(subset, live_passes(args), args.seed)
    live: LiveResult | None = None
    sim_subset: RuleResult | None = None
    if args.live:  # first, on a quiet Kafka: the simulated run's thousands of events come after
        live = run_live(args, settings, run_id, subset_stream)
    with _quiet("svc_scheduler.engine"):
        everything, greso, knn, ceiling = run_routing(args, settings, cached, run_id, records,
                                                      make_stream(records, args.passes, args.seed))
        if args.live:
            # the live scheduler's audit share, so the two skip rates are comparable
            sub_settings = side_run(settings, "sub", audit_share=args.live_audit_share)
            _, _, sim_subset, _ = run_routing(args, sub_settings, cached, f"{run_id}-sub", subset, subset_stream,
                                              quiet=True)
        tuned = None
        if args.compare_encoder is not None:
            try:
                tuned = run_tuned(args, settings, client, run_id, records, cached)
            except (ValueError, FileNotFoundError) as exc:  # too little history (--limit), a wrong directory
                print(f"--compare-encoder: no comparison: {exc}", flush=True)
        flipped: RuleResult | None = None
        if args.compare_cluster_marking:
            flip_settings = side_run(settings, "flip", cluster_marking=not settings.cluster_marking)
            _, _, flipped, _ = run_routing(args, flip_settings, cached, f"{run_id}-flip", records,
                                           make_stream(records, args.passes, args.seed), quiet=True)
        latency = run_latency(args, settings, encoder, client)
    recall_suite = suite_recall(settings, cached)
    return _Measured(everything, greso, knn, ceiling, latency, recall_suite, live, sim_subset, flipped, tuned)


def _print_rules(measured: _Measured) -> None:
    """The three rules' table, the knn decisions by the rule that made them and each skip rule's error."""
    from strata_tools.bench.simulated_tier import EXPECTED_SAMPLES

    knn = measured.knn
    print()
    print(f"{'rule':<34} {'submitted':>9} {'rollouts':>9} {'trigger':>8} {'level-2':>8} {'skipped':>8} "
          f"{'reuse MAE':>10}")
    for rule in (measured.everything, measured.greso, knn):
        skipped = rule.submitted - rule.rollouts
        print(f"{rule.name:<34} {rule.submitted:>9} {rule.rollouts:>9} {rule.trigger_rate:>8.3f} "
              f"{rule.level2:>8} {skipped:>8} {rule.mae:>10.3f}")
    print("knn decisions by rule: " + ", ".join(f"{name} {count} ({count / knn.submitted:.1%})"
                                               for name, count in knn.reasons.most_common()))
    print("knn reuse MAE by rule: " + ", ".join(f"{name} {np.mean(errors):.3f} over {len(errors)} skips"
                                              for name, errors in sorted(knn.errors_by_rule.items())))
    for name, parts in sorted(knn.anatomy.items()):
        against, truth_noise, drift = (np.array(column) for column in zip(*parts, strict=True))
        moved = f"; the policy moved it by {np.nanmean(drift):.3f} since the reused rollout" if name == OWN_HISTORY \
            else ""
        print(f"  error anatomy, {name}: {np.mean(knn.errors_by_rule[name]):.3f} against the truth "
              f"(--truth-samples rollouts), {np.mean(against):.3f} against the expected reward "
              f"({EXPECTED_SAMPLES} rollouts), which the truth itself misses by {np.mean(truth_noise):.3f}{moved}")


def _print_ceiling(args: argparse.Namespace, settings: SchedulerSettings, ceiling: CeilingResult) -> None:
    """The trigger reduction any rule could reach at the reuse budget, by history and variance bound."""
    print(f"ceiling at reuse MAE <= {args.reuse_budget:g} (any rule: the history of every earlier submission, "
          "a perfect choice of what to skip; docs/scheduler.md):")
    audit_kept = 1 - settings.audit_share
    for of_family, label in ((False, "own history (GRESO's information)"), (True, "paraphrase family")):
        for bound, which in ((None, ""), (settings.high_variance_threshold, "R11"),
                             (settings.low_variance_threshold, "R10")):
            most, mae = ceiling.reduction(of_family, args.reuse_budget, bound)
            name = label if bound is None else f"  prompts varying < {bound:g} ({which} ref.)"
            print(f"  {name:<34} trigger reduction {most:.3f} at reuse MAE {mae:.3f} "
                  f"({most * audit_kept:.3f} after auditing {settings.audit_share:.0%})")
    print("  (the R10/R11 rows are references, not bounds: they keep the prompts whose *true* variance is under "
          "the rule's bound, which no rule knows; a rule whose variance estimate errs low can skip more)")


def _print_r11(settings: SchedulerSettings, measured: _Measured) -> None:
    """R11's aim with cluster marking as configured (and flipped), then the audited skips."""
    knn, flipped, everything = measured.knn, measured.flipped, measured.everything
    arms = [(settings.cluster_marking, knn)] + ([] if flipped is None else [(not settings.cluster_marking, flipped)])
    for marking, rule in sorted(arms, key=lambda arm: not arm[0]):
        print(f"R11 with cluster marking {'on' if marking else 'off'}: {rule.nonrisk_level2} of {rule.nonrisk} "
              f"non-risk submissions to Level-2 ({rule.level2_share:.1%}); {rule.bad_level2} of {rule.bad_samples} "
              f"bad rollouts (oracle < {BAD_THRESHOLD:g}) in them ({rule.bad_caught:.1%}); trigger reduction "
              f"{1 - rule.trigger_rate / everything.trigger_rate:.3f}, reuse MAE {rule.mae:.3f}")
    print(f"knn rollouts include {knn.reasons[AUDITED]} audited skips (audit_share {settings.audit_share:g}: "
          "rolled out anyway to measure the reused reward, docs/scheduler.md)")


@dataclass(frozen=True)
class TunedRun:
    """The same stream routed with the other encoder (``--compare-encoder``)."""

    knn: RuleResult
    encoder_id: str
    min_similarity: float  # the floor it was served at (its card's, unless set explicitly)
    fit: FinetuneResult | None  # when fine-tuned in this run: its held-out figures
    base_at_floor: RuleResult | None  # the off-the-shelf encoder at that floor: what the floor alone does
    later_version: int  # the policy version the later epochs start at (the main run's last)
    later: tuple[RuleResult, RuleResult, RuleResult] | None  # (no skipping, off-the-shelf, fine-tuned) there


def run_tuned(args: argparse.Namespace, settings: SchedulerSettings, client: redis.Redis, run_id: str,
              records: Sequence[PromptRecord], base_encoder: CachedEncoder) -> TunedRun:
    """Fine-tune on the main run's history (or load ``--compare-encoder DIR``), then route with it: the same
    stream, the off-the-shelf encoder at its floor, and both encoders again from the policy the run ended at."""
    import dataclasses
    import tempfile

    from svc_scheduler.__main__ import with_card_thresholds
    from svc_scheduler.encoder import Encoder

    with tempfile.TemporaryDirectory(prefix="strata-bench-encoder-") as folder:
        path, fit = _tuned_encoder_path(args, settings, client, records, Path(folder))
        enc_settings = side_run(settings, "enc", encoder_path=path)
        encoder = Encoder.from_settings(enc_settings)
        served = with_card_thresholds(enc_settings, encoder.card)
        print(f"routing the same stream with {encoder.encoder_id} (cosine floor {served.min_similarity:g})",
              flush=True)
        tuned_encoder = CachedEncoder(encoder)
        stream = make_stream(records, args.passes, args.seed)
        _, _, knn, _ = run_routing(args, enc_settings, tuned_encoder, f"{run_id}-enc", records, stream, quiet=True)
        base_at_floor: RuleResult | None = None
        if served.min_similarity != settings.min_similarity:
            print(f"routing the same stream with the off-the-shelf encoder at cosine floor {served.min_similarity:g}",
                  flush=True)
            at_floor = side_run(settings, "floor", min_similarity=served.min_similarity)
            _, _, base_at_floor, _ = run_routing(args, at_floor, base_encoder, f"{run_id}-floor", records, stream,
                                                 quiet=True)
        later_version = 1 + (_batches(args, len(stream)) - 1) // max(args.policy_step_every, 1)
        later: tuple[RuleResult, RuleResult, RuleResult] | None = None
        if args.policy_step_every and later_version > 1:
            print(f"routing the stream again from policy v{later_version} (later epochs, a policy that moved since "
                  "the history the encoder learned from) with each encoder", flush=True)
            again = make_stream(records, args.passes, args.seed + 1)
            arms: list[tuple[str, CachedEncoder, dict[str, object]]] = [
                ("later-base", base_encoder, {}), ("later-enc", tuned_encoder, {"encoder_path": path})]
            runs = [run_routing(args, side_run(settings, side, **changes), use, f"{run_id}-{side}", records, again,
                                quiet=True, first_version=later_version) for side, use, changes in arms]
            later = (runs[0][0], runs[0][2], runs[1][2])
    return TunedRun(dataclasses.replace(knn, name="knn, fine-tuned encoder"), encoder.encoder_id,
                    served.min_similarity, fit, base_at_floor, later_version, later)


def _tuned_encoder_path(args: argparse.Namespace, settings: SchedulerSettings, client: redis.Redis,
                        records: Sequence[PromptRecord], folder: Path) -> tuple[str, FinetuneResult | None]:
    """``--compare-encoder DIR``, or an encoder fine-tuned on the main run's history (families held out)."""
    import dataclasses

    from strata_tools.encoder.finetune import (
        FinetuneConfig,
        describe,
        finetune_encoder,
        history_from_redis,
        serving_floor,
    )

    if args.compare_encoder != "finetune":
        return args.compare_encoder, None
    family_of = {content_hash(r.text): str(r.family) for r in records}
    history = [dataclasses.replace(p, group=family_of.get(p.prompt_hash, "")) for p in
               history_from_redis(settings, client)]
    print(f"\nfine-tuning the encoder for same reward on this run's history ({len(history)} scored prompts, "
          "paraphrase families held out together)", flush=True)
    config = FinetuneConfig(tolerance=settings.audit_tolerance, seed=args.seed)
    fit = finetune_encoder(history, settings.encoder_path, folder, serving_floor(settings, settings.encoder_path),
                           config, lambda line: print(f"  {line}", flush=True))
    for line in describe(fit):
        print(f"  {line}")
    return str(fit.path), fit


def _print_tuned(settings: SchedulerSettings, measured: _Measured) -> None:
    """Both encoders on the same stream: trigger reduction, reuse error, where the skips came from."""
    assert measured.tuned is not None
    everything, base, tuned = measured.everything, measured.knn, measured.tuned
    print(f"encoders on the same stream (issue 39): off-the-shelf at cosine floor {settings.min_similarity:g}, "
          f"{tuned.encoder_id} at {tuned.min_similarity:g}")
    arms = [("off-the-shelf", base), ("fine-tuned", tuned.knn)]
    if tuned.base_at_floor is not None:
        arms.insert(1, (f"off-the-shelf at {tuned.min_similarity:g}", tuned.base_at_floor))
    for name, rule in arms:
        skips = {reason: count for reason, count in rule.reasons.items() if reason.endswith("-> skip")}
        print(f"  {name:<26} trigger reduction {1 - rule.trigger_rate / everything.trigger_rate:.3f}, reuse MAE "
              f"{rule.mae:.3f}, Level-2 {rule.level2} (non-risk {rule.level2_share:.1%}, catching "
              f"{rule.bad_caught:.1%} of bad rollouts, risk {rule.reasons['risk topic -> Level-2']}); skips: "
              + ", ".join(f"{reason} {count}" for reason, count in sorted(skips.items())))
    if tuned.later is not None:
        everything_later = tuned.later[0]
        print(f"  the stream again from policy v{tuned.later_version} (later epochs; the encoder learned from "
              f"v1-v{tuned.later_version}):")
        for name, rule in (("off-the-shelf", tuned.later[1]), ("fine-tuned", tuned.later[2])):
            print(f"    {name:<24} trigger reduction {1 - rule.trigger_rate / everything_later.trigger_rate:.3f}, "
                  f"reuse MAE {rule.mae:.3f}, Level-2 {rule.level2}")
    if tuned.fit is not None:
        c = tuned.fit.comparison
        print(f"  AUC of the cosine for reward agreement, off-the-shelf -> fine-tuned: held-out families "
              f"{c.base_auc:.3f} -> {c.tuned_auc:.3f} ({c.eval_pairs} pairs), the prompts it trained on "
              f"{c.train_base_auc:.3f} -> {c.train_tuned_auc:.3f}")


def _print_live(args: argparse.Namespace, live: LiveResult, sim_subset: RuleResult) -> None:
    """The live stream through the simulated tier and the real tiers, side by side."""
    print(f"live stream: {args.live_families} families x 7 paraphrases x {live_passes(args)} passes; the simulated "
          f"tier's reuse MAE is against the oracle truth, the live one is the audit's (fresh light/strong-RM "
          f"rewards of {live.audits_scored} of {live.audits} audited skips)")
    sim_skipped = sim_subset.submitted - sim_subset.rollouts
    print(f"{'knn, simulated tier (same stream)':<34} {sim_subset.submitted:>9} {sim_subset.rollouts:>9} "
          f"{sim_subset.trigger_rate:>8.3f} {sim_subset.level2:>8} {sim_skipped:>8} {sim_subset.mae:>10.3f}")
    mae = "-" if live.audit_mae is None else f"{live.audit_mae:.3f}"
    print(f"{'knn, real tiers (zoo ' + live.zoo + ')':<34} {live.submitted:>9} {live.rollouts:>9} "
          f"{live.trigger_rate:>8.3f} {live.level2:>8} {live.skipped:>8} {mae:>10}")
    precision = "-" if live.audit_precision is None else f"{live.audit_precision:.1%}"
    interval = "" if live.audit_mae_ci95 is None else f" ± {live.audit_mae_ci95:.3f} (95 %)"
    if live.policy_versions:
        print(f"live policy: v{live.policy_versions[0]} after the first batch -> v{live.policy_versions[-1]} "
              "at the end (trained by the learner on the live rewards)")
    sim_rate = sim_skipped / sim_subset.submitted if sim_subset.submitted else 0.0
    ratio = f"{live.skip_rate / sim_rate:.2f}x" if sim_rate else "-"
    print(f"live trigger reduction {live.skip_rate:.3f} against the simulated tier's {sim_rate:.3f} on the same stream "
          f"and audit share: {ratio} (issue 39 asks >= 0.8x)")
    print(f"live: skip rate {live.skip_rate:.1%}, audit reuse error {mae}{interval}, audit precision {precision}, "
          f"{live.audit_distrusts} audits that erred distrusted the neighbours they reused and raised "
          f"{live.audit_floors} neighbours' similarity floors, high-uncertainty marks "
          f"{live.marks}, {live.wall_s:.0f} s")


def _print_last_line(args: argparse.Namespace, settings: SchedulerSettings, measured: _Measured) -> None:
    """The ``scheduler trigger_reduction=...`` line the docs quote."""
    everything, greso, knn, flipped, live = (measured.everything, measured.greso, measured.knn, measured.flipped,
                                              measured.live)
    audit_kept = 1 - settings.audit_share
    greso_reduction = 1 - greso.trigger_rate / everything.trigger_rate
    reduction = 1 - knn.trigger_rate / everything.trigger_rate
    live_rate = "nan" if live is None else f"{live.skip_rate:.3f}"
    live_mae = "nan" if live is None or live.audit_mae is None else f"{live.audit_mae:.3f}"
    live_audits = "nan" if live is None else str(live.audits_scored)
    r10_reference, _ = measured.ceiling.reduction(True, args.reuse_budget, settings.low_variance_threshold)
    r11_reference, _ = measured.ceiling.reduction(True, args.reuse_budget, settings.high_variance_threshold)
    live_bounds = ("nan", "nan") if live is None or live.audit_mae is None or live.audit_mae_ci95 is None else (
        f"{live.audit_mae - live.audit_mae_ci95:.3f}", f"{live.audit_mae + live.audit_mae_ci95:.3f}")
    print(f"scheduler trigger_reduction={reduction:.3f} reuse_mae={knn.mae:.3f} "
          f"greso_trigger_reduction={greso_reduction:.3f} r10_reference={r10_reference * audit_kept:.3f} "
          f"live_skip_rate={live_rate} live_reuse_mae={live_mae} live_audits={live_audits} "
          f"live_reuse_mae_lo={live_bounds[0]} live_reuse_mae_hi={live_bounds[1]} "
          f"r11_reference={r11_reference * audit_kept:.3f} "
          f"{latency_fields(measured.latency)} level2_share={knn.level2_share:.3f} "
          f"bad_caught={knn.bad_caught:.3f}"
          + ("" if flipped is None else f" flipped_level2_share={flipped.level2_share:.3f} "
                                        f"flipped_bad_caught={flipped.bad_caught:.3f}")
          + ("" if measured.tuned is None else
             f" tuned_trigger_reduction={1 - measured.tuned.knn.trigger_rate / everything.trigger_rate:.3f} "
             f"tuned_reuse_mae={measured.tuned.knn.mae:.3f}"))


def print_latency(latency: Sequence[LatencyRow]) -> None:
    print(f"{'indexed':>8} {'index':>6} {'build s':>8} {'index MB':>9} {'p50 ms':>7} {'p99 ms':>7} {'enc p99':>8} "
          f"{'search':>7} {'redis':>6} {'limit':>6} {'over':>5} {'recall@10':>10} {'repeat p99':>11}")
    for r in latency:
        print(f"{r.size:>8} {r.kind:>6} {r.build_s:>8.1f} {r.memory_mb:>9.0f} {r.p50:>7.2f} {r.p99:>7.2f} "
              f"{r.encoder_p99:>8.2f} {r.search_p99:>7.2f} {r.redis_p99:>6.2f} {r.limit_p99:>6.2f} "
              f"{r.over_limit:>5.2f} {r.recall:>10.3f} {r.repeat_p99:>11.2f}")


def latency_fields(latency: Sequence[LatencyRow]) -> str:
    """``decision_p99_ms`` and ``decision_over_limit`` at 100k (else the largest size), recall there, 1M."""
    if not latency:
        return ""
    main = next((r for r in latency if r.size == 100_000), max(latency, key=lambda r: r.size))
    fields = (f"decision_p99_ms={main.p99:.2f} decision_over_limit={main.over_limit:.2f} "
              f"recall_at_10={main.recall:.3f} repeat_p99_ms={main.repeat_p99:.2f}")
    million = next((r for r in latency if r.size == 1_000_000), None)
    if million is not None:
        fields += f" p99_ms_1m={million.p99:.2f} recall_at_10_1m={million.recall:.3f}"
    return fields


def checked_redis(settings: SchedulerSettings) -> redis.Redis:
    """The bench's Redis client (a long timeout: a shared 2-core machine stalls), or a CliError."""
    from strata.errors import CliError
    from svc_scheduler.store import connect

    client = connect(settings.model_copy(update={"redis_timeout_s": 30.0}))
    try:
        client.ping()
    except Exception as exc:
        raise CliError(f"Redis at {settings.redis_address_masked} does not answer: {exc}") from exc
    return client


def run_latency_only(args: argparse.Namespace, settings: SchedulerSettings) -> int:
    """``--latency-only``: the decision against its limits at each size (Redis only, no Kafka)."""
    from svc_scheduler.encoder import Encoder

    client = checked_redis(settings)
    encoder = Encoder.from_settings(settings)
    try:
        with _quiet("svc_scheduler.engine"):
            latency = run_latency(args, settings, encoder, client)
    finally:
        client.close()
    print()
    print_latency(latency)
    print(f"scheduler {latency_fields(latency)}")
    return 0


def main() -> int:  # python -m strata_tools.bench.scheduler (until `strata bench scheduler` is registered)
    parser = argparse.ArgumentParser(prog="strata bench scheduler", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
