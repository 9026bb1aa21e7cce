"""The scheduler's engine: encode, search, read Redis, decide (pure rules), store, publish, index.

No gRPC here (the servicer translates requests and errors) and no routing logic (``routing.decide``
holds the rules); this is the glue between the encoder, the FAISS index, Redis and Kafka, in the
order that keeps the guarantees:

1. encode the prompts (one batch) and search the index (k nearest each);
2. read the neighbours' statistics and marks and the current versions from Redis (one round trip;
   Redis down -> :class:`StoreUnavailableError` before anything was published);
3. decide (pure), then roll ``audit_share`` of the would-be skips out anyway (``routing.audit``);
4. store each prompt's text in the content store (consumers read it by hash) and each audited
   skip's reused reward in Redis, so that no fresh reward can arrive before its audit exists;
5. publish each decision and wait for Kafka's acknowledgement: a prompt is *accepted* only once
   its event is durable (skip -> a reused ``RewardScored``; Level-1 -> ``strata.prompts.level0``,
   the probe forwards it to Level-1; Level-2 -> ``strata.prompts.level2``);
6. index the accepted prompts that are rolled out (embedding to Redis, local FAISS, and a
   ``PromptIndexed`` announcement for the other replicas). Skipped prompts are *not* indexed: they
   never get rewards of their own and would only crowd useful neighbours out of the k nearest.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import faiss
import numpy as np
import redis
from kafka.producer.future import FutureRecordMetadata
from prometheus_client import Counter, Gauge, Histogram

from strata import ledger
from strata.bus import Publisher, PublishError, topics
from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata.telemetry import Sensitive
from strata.v1 import common_pb2, events_pb2
from strata.validation import PromptRequest, sampling_to_proto
from svc_scheduler.backlog import Shed
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.encoder import Encoder
from svc_scheduler.index import PromptIndex
from svc_scheduler.routing import (
    Decision,
    Neighbour,
    RiskMatch,
    Route,
    VersionState,
    audit,
    decide,
    detect_risk,
)
from svc_scheduler.store import AuditRecord, AuditSummary, SchedulerStore

log = logging.getLogger(__name__)

DECISIONS = Counter("strata_scheduler_decisions_total", "Routing decisions of this replica", ["route"])
DECISION_SECONDS = Histogram(
    "strata_scheduler_decision_seconds", "Encode + search + Redis + rules, per batch",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
INDEX_SIZE = Gauge("strata_scheduler_index_size", "Prompts in this replica's FAISS index")
SHED = Counter("strata_scheduler_shed_total",
               "Prompts refused at the door because a rollout tier was too far behind", ["group"])
RECORD_LABELS = Histogram(
    "strata_scheduler_level1_record_labels",
    "People's labels (aged weight) in the Level-1 record sent with each Level-1 route: under ~3 the escalation "
    "rule's record_bad is mostly its prior",
    buckets=(0.5, 1, 2, 3, 5, 10, 20, 50),
)
VECTORS_REUSED = Counter("strata_scheduler_vectors_reused_total",
                         "Prompts decided on their stored vector (already indexed) instead of the encoder")

SHED_LOG_EVERY_S = 10.0

_DECISION_PROTO = {
    Route.SKIP: common_pb2.DECISION_SKIP,
    Route.LEVEL_1: common_pb2.DECISION_LEVEL_1,
    Route.LEVEL_2: common_pb2.DECISION_LEVEL_2,
}


class NotAcceptedError(Exception):
    """Kafka did not acknowledge this prompt's event: it was not accepted (the client should retry)."""


class PromptShedError(Exception):
    """The prompt needs a rollout and the tiers are too far behind (svc_scheduler/backlog.py): refused,
    nothing published; the client should retry after ``shed.retry_after_s``."""

    def __init__(self, shed: Shed) -> None:
        super().__init__(shed.message())
        self.shed = shed


class RequestGoneError(Exception):
    """The caller cancelled or passed its deadline before anything was published."""


@dataclass(frozen=True)
class Routed:
    """One prompt's decision, before anything was published."""

    prompt_hash: str
    vector: np.ndarray  # (D,) its embedding
    decision: Decision
    versions: VersionState  # policy / RM versions current when it was decided
    encoder_charge: ledger.Charge  # its share of the batch's encoding (R4)


@dataclass(frozen=True)
class Accepted:
    """One accepted prompt: its decision is durable on Kafka."""

    prompt_hash: str
    decision: Decision
    request_id: str


@dataclass(frozen=True)
class SchedulerStats:
    decisions: dict[str, int]  # route name -> count, over all replicas (Redis counters)
    submitted: int
    skip_rate: float
    index_size: int  # this replica's FAISS index
    high_uncertainty_marks: int
    audits: AuditSummary  # would-be skips rolled out anyway, against their fresh rewards
    audit_distrusts: int = 0  # audits that erred and made the neighbours they reused unusable for a while
    audit_similarity_floors: int = 0  # per-neighbour similarity floors those audits raised


def encode_exemplars(settings: SchedulerSettings, encoder: Encoder) -> dict[str, np.ndarray]:
    """Topic -> (E, D) vectors of its risk exemplars (R3), in the encoder's current vector space."""
    exemplars = {"medical": settings.risk_exemplars_medical, "legal": settings.risk_exemplars_legal}
    return {topic: encoder.encode(list(texts)) for topic, texts in exemplars.items() if texts}


def exemplar_similarity(exemplars: dict[str, np.ndarray], vector: np.ndarray) -> dict[str, float]:
    """Topic -> the prompt's highest cosine with that topic's exemplars (vectors are unit length)."""
    return {topic: float((matrix @ vector).max()) for topic, matrix in exemplars.items()}


class SchedulerEngine:
    def __init__(
        self,
        settings: SchedulerSettings,
        encoder: Encoder,
        store: SchedulerStore,
        content: ContentStore,
        publisher: Publisher,
        clock: Callable[[], float] = time.time,
        shed: Callable[[], Shed | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.shed = shed  # whether the tiers are too far behind for new rollouts (backlog.BacklogGauge.shed)
        self._jitter = random.Random()  # spreads shed clients' retries; not the audit draw, which is the request's
        self._shed_logged_at = -SHED_LOG_EVERY_S
        self.encoder = encoder
        self.store = store
        self.content = content
        self.publisher = publisher
        self.clock = clock
        if settings.faiss_threads is not None:
            faiss.omp_set_num_threads(settings.faiss_threads)  # process-wide: the scheduler is its only user
        self.index = PromptIndex(
            encoder.dim, settings.exact_index_max_size, settings.hnsw_m, settings.hnsw_ef_construction,
            settings.hnsw_ef_search, ivf_min_size=settings.ivf_min_size, ivf_nlist=settings.ivf_nlist,
            ivf_nprobe=settings.ivf_nprobe, ivf_train_size=settings.ivf_train_size,
        )
        self._exemplars = self._encode_exemplars()
        self._ready = False
        self._ready_lock = threading.Lock()
        self._pending: set[str] = set()  # announced by other replicas, not yet read from Redis
        self._pending_lock = threading.Lock()

    def _encode_exemplars(self) -> dict[str, np.ndarray]:
        return encode_exemplars(self.settings, self.encoder)

    # -- index life cycle ------------------------------------------------------------------------------

    def ensure_ready(self) -> None:
        """Rebuild the index from Redis once (at the first request if Redis was down at start)."""
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            started = time.perf_counter()
            claimed = self.store.claimed_encoder()
            if claimed is not None and self.encoder.adopt(claimed):  # auto: serve the state in its own vector space
                self._exemplars = self._encode_exemplars()
            self.store.claim_encoder(self.encoder.encoder_id)
            for hashes, vectors in self.store.iter_index():
                self.index.add(hashes, vectors)
            self._ready = True
            INDEX_SIZE.set(len(self.index))
            log.info("index rebuilt from Redis: %d prompts (%s) in %.2f s",
                     len(self.index), self.index.kind, time.perf_counter() - started)
        self.add_indexed(())

    def add_indexed(self, hashes: Iterable[str]) -> int:
        """Add prompts another replica indexed (their vectors are read from Redis). Idempotent."""
        with self._pending_lock:
            self._pending.update(h for h in hashes if h not in self.index)
            if not self._ready or not self._pending:
                return 0
            wanted = sorted(self._pending)
            vectors = self.store.get_embeddings(wanted)  # StoreUnavailableError: stay pending, retried later
            self._pending.difference_update(wanted)
        found = [(h, v) for h, v in zip(wanted, vectors, strict=True) if v is not None]
        for h, v in zip(wanted, vectors, strict=True):
            if v is None:
                log.warning("prompt %s announced as indexed but has no embedding in Redis", h[:12])
        added = self.index.add([h for h, _ in found], np.stack([v for _, v in found])) if found else 0
        INDEX_SIZE.set(len(self.index))
        return added

    # -- decisions -------------------------------------------------------------------------------------

    def _risk(self, text: str, vector: np.ndarray) -> RiskMatch | None:
        return detect_risk(text, exemplar_similarity(self._exemplars, vector), self.settings)

    def route(self, prompts: Sequence[str]) -> list[Routed]:
        """Decide for ``prompts`` (steps 1-3); publishes nothing."""
        self.ensure_ready()
        started = time.perf_counter()
        hashes = [content_hash(p) for p in prompts]
        vectors, tokens, shares = self._vectors(prompts, hashes)
        found = self.index.search(vectors, self.settings.k)
        wanted = sorted({h for row in found for h, _ in row})
        state = self.store.neighbour_state(wanted)
        now = self.clock()
        routed = []
        for text, digest, vector, row, n, share in zip(prompts, hashes, vectors, found, tokens, shares, strict=True):
            neighbours = [Neighbour(h, sim, state.stats.get(h), state.marks.get(h), state.clusters.get(h),
                                    state.cluster_marks.get(h), state.distrusts.get(h),
                                    state.similarity_floors.get(h)) for h, sim in row]
            decision = decide(digest, neighbours, self._risk(text, vector), now, state.versions, self.settings)
            charge = ledger.Charge("encoder", 0, n, share, float(self.encoder.n_params) * n,
                                   params=float(self.encoder.n_params))
            routed.append(Routed(digest, vector, decision, state.versions, charge))
        DECISION_SECONDS.observe(time.perf_counter() - started)
        return routed

    def _vectors(self, prompts: Sequence[str], hashes: Sequence[str]) -> tuple[np.ndarray, list[int], list[float]]:
        """(N, D) vectors, encoder tokens and encoder seconds of each prompt.

        A prompt already in the index (RLHF submits its prompts again every epoch) reuses its stored
        vector: one Redis read instead of the encoder, at no encoder cost. The rest are encoded.
        """
        stored = [i for i, h in enumerate(hashes) if h in self.index]
        vectors = np.zeros((len(prompts), self.encoder.dim), dtype=np.float32)
        tokens, shares = [0] * len(prompts), [0.0] * len(prompts)
        found = self.store.get_embeddings([hashes[i] for i in stored]) if stored else []
        reused: set[int] = set()
        for i, vector in zip(stored, found, strict=True):
            if vector is not None:  # None: its embedding left Redis; encode it like a new prompt
                vectors[i] = vector
                reused.add(i)
        fresh = [i for i in range(len(prompts)) if i not in reused]
        if fresh:
            encode_started = self.encoder.clock()
            encoded, counted = self.encoder.encode_counted([prompts[i] for i in fresh])  # (F, D)
            seconds = ledger.split_by_tokens(self.encoder.clock() - encode_started, counted)
            for row, i in enumerate(fresh):
                vectors[i], tokens[i], shares[i] = encoded[row], counted[row], seconds[row]
        VECTORS_REUSED.inc(len(reused))
        return vectors, tokens, shares

    # -- submission ------------------------------------------------------------------------------------

    def submit(self, requests: Sequence[PromptRequest], still_wanted: Callable[[], bool] = lambda: True,
               ) -> list[Accepted | NotAcceptedError | PromptShedError]:
        """Decide, store, publish and index (steps 1-6). Per prompt: accepted, not (Kafka), or shed.

        While the tiers are too far behind (``shed``), prompts that need a rollout are shed and skips are
        served; an audited skip is a rollout and is shed with them (its draw is the request's, so a retry
        audits the same way).

        Raises :class:`StoreUnavailableError` when Redis is down, and :class:`RequestGoneError` when
        ``still_wanted`` turns false before publishing (the caller left): then nothing was published.
        """
        if not requests:
            return []
        if not still_wanted():
            raise RequestGoneError
        submitted_at = self.clock()
        shed = self.shed()
        routed = [
            replace(item, decision=audit(item.decision, item.prompt_hash, request.request_id,
                                         self.settings.audit_share))
            for request, item in zip(requests, self.route([r.prompt for r in requests]), strict=True)
        ]
        if not still_wanted():  # routing (the encoder) is the slow step: check again before any write
            raise RequestGoneError
        if shed is None:
            return self._accept(requests, routed, submitted_at)
        served = [i for i, item in enumerate(routed) if item.decision.route is Route.SKIP]
        if len(served) < len(routed):
            SHED.labels(group=shed.stage.group).inc(len(routed) - len(served))
            if submitted_at - self._shed_logged_at >= SHED_LOG_EVERY_S:  # one line per stretch, not per call
                self._shed_logged_at = submitted_at
                log.warning("shedding prompts that need a rollout: %s", shed.detail())
        shed = shed.jittered(self._jitter.uniform(0.0, self.settings.shed_retry_jitter))
        outcomes = iter(self._accept([requests[i] for i in served], [routed[i] for i in served], submitted_at))
        refused = PromptShedError(shed)
        return [next(outcomes) if item.decision.route is Route.SKIP else refused for item in routed]

    def _accept(self, requests: Sequence[PromptRequest], routed: Sequence[Routed], submitted_at: float,
                ) -> list[Accepted | NotAcceptedError]:
        """Store, publish and index decided prompts; per prompt accepted, or not (Kafka)."""
        if not requests:
            return []
        for request in requests:
            self.content.put(request.prompt)  # before publishing: consumers read the text by hash
        self.store.record_audits([AuditRecord(item.prompt_hash, request.request_id, item.decision.audited_reward,
                                              request.n_samples, item.decision.reused_from,
                                              item.decision.reused_similarity)
                                  for request, item in zip(requests, routed, strict=True)
                                  if item.decision.audited_reward is not None], submitted_at)
        futures = [
            self._publish(request, item, submitted_at) for request, item in zip(requests, routed, strict=True)
        ]
        results: list[Accepted | NotAcceptedError] = []
        accepted: list[Routed] = []
        booked: list[tuple[PromptRequest, Routed]] = []
        for request, item, future in zip(requests, routed, futures, strict=True):
            try:
                Publisher.wait([future], self.settings.publish_timeout_s)
            except PublishError as exc:
                log.warning("prompt %s not accepted: %s", item.prompt_hash[:12], exc)
                results.append(NotAcceptedError(f"Kafka did not acknowledge the prompt; it was not accepted: {exc}"))
                continue
            DECISIONS.labels(route=item.decision.route.value).inc()
            log.info("prompt %s (%s) -> %s: %s", item.prompt_hash[:12], Sensitive(request.prompt),
                     item.decision.route.value, item.decision.reason)
            accepted.append(item)
            booked.append((request, item))
            results.append(Accepted(item.prompt_hash, item.decision, request.request_id))
        self._after_accept(accepted)
        self._book(booked)
        return results

    def _publish(self, request: PromptRequest, item: Routed, submitted_at: float) -> FutureRecordMetadata:
        decision, versions = item.decision, item.versions
        now = self.clock()
        if decision.route is Route.SKIP:
            reward = events_pb2.RewardScored(
                prompt_hash=item.prompt_hash, tier=common_pb2.TIER_UNSPECIFIED,
                policy_version=versions.policy_version, rm_version=decision.reused_rm_version or "",
                reward=decision.reused_reward or 0.0, reward_std=decision.reused_reward_std or 0.0,
                scorer=common_pb2.SCORER_REUSED, final=True, request_id=request.request_id,
            )
            reward.scored_at.FromNanoseconds(int(now * 1e9))
            return self.publisher.publish(topics.REWARDS_SCORED, reward)
        level2 = decision.route is Route.LEVEL_2
        event = events_pb2.PromptRouted(
            prompt_hash=item.prompt_hash,
            tier=common_pb2.TIER_LEVEL_2 if level2 else common_pb2.TIER_LEVEL_0,
            decision=_DECISION_PROTO[decision.route],
            reason=decision.reason,
            sampling=sampling_to_proto(request.sampling),
            n_samples=request.n_samples,
            caution=decision.caution,
            policy_version=versions.policy_version,
            request_id=request.request_id,
            level1_only=not self.settings.tiering,
        )
        if decision.level1_record is not None and decision.route is Route.LEVEL_1:
            event.level1_record.labelled = decision.level1_record.labelled
            event.level1_record.bad = decision.level1_record.bad
            RECORD_LABELS.observe(decision.level1_record.labelled)
        event.submitted_at.FromNanoseconds(int(submitted_at * 1e9))
        event.routed_at.FromNanoseconds(int(now * 1e9))
        return self.publisher.publish(topics.PROMPTS_LEVEL2 if level2 else topics.PROMPTS_LEVEL0, event)

    def _after_accept(self, accepted: Sequence[Routed]) -> None:
        """Index rolled-out prompts and count decisions. The prompts are accepted already: a Redis
        failure here is logged, not returned (a retrying client would submit the prompt twice)."""
        if not accepted:
            return
        new: dict[str, np.ndarray] = {}
        clusters: dict[str, str | None] = {}
        for item in accepted:
            if item.decision.route is not Route.SKIP and item.prompt_hash not in self.index:
                new.setdefault(item.prompt_hash, item.vector)
                clusters.setdefault(item.prompt_hash, item.decision.cluster)
        counts: dict[str, int] = {"submitted": len(accepted)}
        for item in accepted:
            key = f"decision:{item.decision.route.value}"
            counts[key] = counts.get(key, 0) + 1
            if item.decision.audited_reward is not None:
                counts["audits"] = counts.get("audits", 0) + 1
        hashes = list(new)
        vectors = np.stack(list(new.values())) if new else np.zeros((0, self.encoder.dim), dtype=np.float32)
        try:
            self.store.index_prompts(hashes, vectors, [clusters[h] for h in hashes])
            self.store.count(counts)
        except ConnectionError as exc:
            log.warning("accepted prompts not recorded in Redis (%s); other replicas will miss them", exc)
            return
        self.index.add(hashes, vectors)
        INDEX_SIZE.set(len(self.index))
        now = self.clock()
        for digest in hashes:
            message = events_pb2.PromptIndexed(prompt_hash=digest, encoder_id=self.encoder.encoder_id)
            message.indexed_at.FromNanoseconds(int(now * 1e9))
            future = self.publisher.publish(topics.PROMPTS_INDEXED, message)
            future.add_errback(lambda exc, d=digest: log.warning("PromptIndexed %s not published: %s", d[:12], exc))

    def _book(self, accepted: Sequence[tuple[PromptRequest, Routed]]) -> None:
        """The encoder's cost of accepted prompts, in the ledger; a Redis failure is logged (as above)."""
        client = self.store.client
        try:
            with client.pipeline(transaction=True) as pipe:
                for request, item in accepted:
                    ledger.book(client, item.prompt_hash, request.request_id, [item.encoder_charge],
                                self.settings.content_ttl_s, pipe=pipe)
                pipe.execute()
        except (OSError, redis.RedisError) as exc:
            log.warning("encoder cost of %d prompts not booked (%s)", len(accepted), exc)

    # -- stats -----------------------------------------------------------------------------------------

    def stats(self) -> SchedulerStats:
        # Audits before counters: the transaction that scores an audit also counts its verdict, so reading
        # the counters second never shows a scored audit without the distrust it caused.
        audits = self.store.audit_summary()
        summary = self.store.summary()
        counters = summary.counters
        return SchedulerStats(
            decisions={r.value: counters.get(f"decision:{r.value}", 0) for r in Route},
            submitted=summary.submitted,
            skip_rate=summary.skip_rate,
            index_size=len(self.index),
            high_uncertainty_marks=counters.get("high_uncertainty_marks", 0),
            audits=audits,
            audit_distrusts=counters.get("audit_distrusts", 0),
            audit_similarity_floors=counters.get("audit_similarity_floors", 0),
        )
