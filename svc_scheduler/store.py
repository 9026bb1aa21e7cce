"""The scheduler's state in Redis: embeddings, reward statistics, high-uncertainty marks, versions.

Everything a scheduler replica needs to make its decisions lives here, so a restarted replica
rebuilds its FAISS index from Redis and decides exactly as before, and replicas share one state.
Keys (``<p>`` is ``redis_prefix``, ``<h>`` a prompt hash):

    <p>:encoder          the encoder id the stored vectors belong to (vectors of two encoders never mix)
    <p>:emb:<h>          embedding, float32 little-endian bytes (no TTL: the index keeps all history)
    <p>:indexed          sorted set of indexed prompt hashes, scored by insertion time (rebuild order)
    <p>:stats:<h>        reward statistics (JSON), expire stats_ttl_s after the last update (R12)
    <p>:mark:<h>         high-uncertainty mark: unix seconds it was set, expires after mark_ttl_s (R11)
    <p>:cluster:<h>      the cluster of an indexed prompt: its leader's hash (its own when it leads one)
    <p>:cmark:<c>        high-uncertainty mark of cluster c (a member's variance went over the threshold)
    <p>:seen:<h>:<r>:<v> a processed reward event (prompt, response, RM version): idempotent updates
    <p>:label:<h>:<r>:<a> a processed label (prompt, response, annotator) in the Level-1 record: idempotent
    <p>:audit:<h>:<req>  an audited skip: reused reward, the fresh rewards' count and sum so far, the count
                         that completes it (n_samples), the neighbours whose rewards it reused and their
                         similarities to the prompt
    <p>:distrust:<h>     an audit of a skip that reused h's rewards erred: unix seconds, expires after
                         audit_distrust_ttl_s; h is not reused meanwhile
    <p>:simfloor:<h>     h's own similarity floor: the highest cosine at which an erring audit reused h's
                         rewards for another prompt; expires audit_similarity_floor_ttl_s after it last rose
    <p>:audits           sorted set of audit keys by time (the report's window)
    <p>:versions         hash: policy_version (newest seen), rm_version (currently promoted)
    <p>:counters         hash: submitted, decision:<route>, high_uncertainty_marks, audits, audit_distrusts,
                         audit_similarity_floors (floors an erring audit raised)

Redis errors surface as :class:`StoreUnavailableError` (a ``ConnectionError``): the servicer answers
UNAVAILABLE, the Kafka worker retries without dead-lettering. Timeouts are short
(``redis_timeout_s``) so Submit fails fast while Redis is down, and the connection pool reconnects
on its own when it is back.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from strata import redis_client
from strata.content_store import StoreUnavailableError
from strata.intervals import clustered_se
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.routing import VersionState, audit_erred
from svc_scheduler.stats import (
    Aging,
    LabelObservation,
    RewardObservation,
    RewardStats,
    apply_label,
    apply_reward,
    marks_high_uncertainty,
)

T = TypeVar("T")

# Versions only move forward: the newest policy version, and the RM version of the latest promotion.
_UPDATE_VERSIONS = """
local policy = tonumber(ARGV[1])
if policy and policy >= 0 and policy > tonumber(redis.call('HGET', KEYS[1], 'policy_version') or '-1') then
  redis.call('HSET', KEYS[1], 'policy_version', policy)
end
if ARGV[2] ~= '' and tonumber(ARGV[3]) >= tonumber(redis.call('HGET', KEYS[1], 'rm_at') or '-1') then
  redis.call('HSET', KEYS[1], 'rm_version', ARGV[2], 'rm_at', ARGV[3])
end
return 1
"""


@dataclass(frozen=True)
class NeighbourState:
    """What the rules need of the neighbours, read in one round trip."""

    stats: dict[str, RewardStats | None]
    marks: dict[str, float | None]  # the neighbour's own high-uncertainty mark
    clusters: dict[str, str | None]  # the neighbour's cluster (its leader's hash)
    cluster_marks: dict[str, float | None]  # for a neighbour that leads a cluster: that cluster's mark
    versions: VersionState
    distrusts: dict[str, float | None] = field(default_factory=dict)  # an audit caught its reuse erring
    similarity_floors: dict[str, float | None] = field(default_factory=dict)  # its own, raised by erring audits


@dataclass(frozen=True)
class RewardUpdate:
    """What folding one reward event into Redis did."""

    applied: bool  # False: this (prompt, response, RM version) was processed before
    stats: RewardStats | None  # the prompt's statistics afterwards
    newly_marked: bool  # this update marked the prompt's neighbourhood high-uncertainty
    distrusted: tuple[str, ...] = ()  # this update completed an audit that erred: the neighbours it distrusted
    floors: Mapping[str, float] = field(default_factory=dict)  # and the similarity floors it raised, by neighbour


@dataclass(frozen=True)
class AuditSummary:
    """Audited skips (rolled out anyway) against their fresh rewards."""

    audits: int  # audited skips in the window
    scored: int  # of those, with at least one fresh reward
    reuse_mae: float | None  # mean |fresh mean reward - reused reward| over the scored audits
    precision: float | None  # share of scored audits within the tolerance
    tolerance: float
    reuse_mae_ci95: float | None = None  # half-width of the MAE's 95 % interval (clustered by prompt; >= 2)

    def describe(self) -> str:
        """One line for reports: how many skips were audited and how right their reused rewards were."""
        if self.reuse_mae is None or self.precision is None:
            return f"skip audit: {self.audits} audited skips, none scored yet"
        interval = "" if self.reuse_mae_ci95 is None else f" ± {self.reuse_mae_ci95:.3f} (95 %)"
        return (f"skip audit: {self.scored} of {self.audits} audited skips scored; reuse error (MAE) "
                f"{self.reuse_mae:.3f}{interval}, precision {self.precision:.1%} (within {self.tolerance:g})")


def mean_ci95(values: Sequence[float], clusters: Sequence[str] | None = None) -> float | None:
    """Half-width of the normal 95 % interval of ``values``' mean; with ``clusters`` (one per value), the
    cluster-robust one: audits of one prompt share its neighbours and its policy, so they count as one piece
    of evidence, not several. None below two values (or two clusters). Pure."""
    if len(values) < 2:
        return None
    if clusters is None:
        return 1.96 * statistics.stdev(values) / math.sqrt(len(values))
    se = clustered_se(values, clusters)
    return None if math.isnan(se) else 1.96 * se


def summarise_audits(records: Sequence[tuple[str, float, int, float]], tolerance: float) -> AuditSummary:
    """(prompt hash, reused, fresh count, fresh sum) per audit -> the summary, its interval clustered by prompt.
    Pure."""
    scored = [(prompt, abs(total / n - reused)) for prompt, reused, n, total in records if n > 0]
    errors = [e for _, e in scored]
    return AuditSummary(
        audits=len(records), scored=len(errors),
        reuse_mae=sum(errors) / len(errors) if errors else None,
        precision=sum(e <= tolerance for e in errors) / len(errors) if errors else None,
        tolerance=tolerance,
        reuse_mae_ci95=mean_ci95(errors, [prompt for prompt, _ in scored]),
    )


@dataclass(frozen=True)
class AuditRecord:
    """An audited skip, written before its prompt is published."""

    prompt_hash: str
    request_id: str
    reused: float  # the reward the skip would have reused
    expected: int = 0  # fresh rewards that complete the audit (the request's n_samples); 0: never judged
    donors: tuple[str, ...] = ()  # the neighbours whose rewards made ``reused``
    similarities: tuple[float, ...] = ()  # each donor's cosine similarity to the prompt, in the same order


@dataclass(frozen=True)
class StoreSummary:
    counters: Mapping[str, int]
    indexed: int

    @property
    def submitted(self) -> int:
        return self.counters.get("submitted", 0)

    @property
    def skip_rate(self) -> float:
        """Skipped / submitted over all replicas (0 before any submission)."""
        return self.counters.get("decision:skip", 0) / self.submitted if self.submitted else 0.0


def connect(settings: SchedulerSettings) -> redis.Redis:
    """A client with short timeouts and one immediate retry (a stale pooled connection after a
    Redis restart fails once and is replaced); no long backoff: callers must fail fast."""
    timeout = settings.redis_timeout_s
    return redis_client.connect(
        settings.redis_address, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1), health_check_interval=30,
    )


@contextmanager
def _available() -> Iterator[None]:
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise StoreUnavailableError(f"the scheduler's Redis is unavailable: {exc}") from exc


def _stats_to_json(stats: RewardStats) -> bytes:
    return json.dumps(stats.to_dict(), separators=(",", ":")).encode()


def _stats_from_json(raw: bytes | None) -> RewardStats | None:
    return None if raw is None else RewardStats.from_dict(json.loads(raw))


def _float32_bytes(vector: np.ndarray) -> bytes:
    data = np.ascontiguousarray(vector, dtype="<f4")
    return data.tobytes()


def _vector(raw: bytes) -> np.ndarray:
    vector = np.frombuffer(raw, dtype="<f4")
    return vector.astype(np.float32) if sys.byteorder != "little" else vector


class SchedulerStore:
    def __init__(self, client: redis.Redis, settings: SchedulerSettings) -> None:
        self.client = client
        self._s = settings
        p = settings.redis_prefix
        self._encoder_key = f"{p}:encoder"
        self._indexed_key = f"{p}:indexed"
        self._versions_key = f"{p}:versions"
        self._counters_key = f"{p}:counters"
        self._audits_key = f"{p}:audits"
        self._aging = Aging(settings.policy_decay, settings.rm_decay)
        self._update_versions = client.register_script(_UPDATE_VERSIONS)

    def _key(self, kind: str, prompt_hash: str) -> str:
        return f"{self._s.redis_prefix}:{kind}:{prompt_hash}"

    def _call(self, fn: Callable[[], T]) -> T:
        with _available():
            return fn()

    def ping(self) -> None:
        self._call(self.client.ping)

    # -- embeddings ------------------------------------------------------------------------------------

    def claimed_encoder(self) -> str | None:
        """The encoder_id the stored vectors were made by (None: a fresh state)."""
        with _available():
            stored = self.client.get(self._encoder_key)
        return None if stored is None else stored.decode()

    def claim_encoder(self, encoder_id: str) -> None:
        """Tie the stored vectors to one encoder; refuse to mix vector spaces."""
        with _available():
            self.client.set(self._encoder_key, encoder_id, nx=True)
        stored = self.claimed_encoder()
        if stored is not None and stored != encoder_id:
            raise RuntimeError(
                f"Redis prefix {self._s.redis_prefix!r} holds vectors of encoder {stored!r}, not "
                f"{encoder_id!r}; use another --redis-prefix or the same encoder"
            )

    def index_prompts(self, hashes: Sequence[str], vectors: np.ndarray,
                      clusters: Sequence[str | None] | None = None) -> None:
        """Persist embeddings (and each prompt's cluster, first one wins) and add the hashes to the
        ordered set of indexed prompts."""
        if not hashes:
            return
        now_us = time.time() * 1e6
        with _available(), self.client.pipeline(transaction=False) as pipe:
            for i, (digest, vector) in enumerate(zip(hashes, vectors, strict=True)):
                pipe.set(self._key("emb", digest), _float32_bytes(vector))
                pipe.zadd(self._indexed_key, {digest: now_us + i}, nx=True)
                if clusters is not None and clusters[i] is not None:
                    pipe.set(self._key("cluster", digest), clusters[i], nx=True)
            pipe.execute()

    def get_embeddings(self, hashes: Sequence[str]) -> list[np.ndarray | None]:
        with _available():
            raws = self.client.mget([self._key("emb", h) for h in hashes]) if hashes else []
        return [None if raw is None else _vector(raw) for raw in raws]

    def indexed_hashes(self) -> list[str]:
        """Every indexed prompt's hash, in insertion order."""
        with _available():
            return [m.decode() for m in self.client.zrange(self._indexed_key, 0, -1)]

    def iter_index(self, chunk: int = 2000) -> Iterator[tuple[list[str], np.ndarray]]:
        """Every indexed prompt in insertion order, as (hashes, (n, D) vectors) chunks."""
        members = self.indexed_hashes()
        for start in range(0, len(members), chunk):
            part = members[start : start + chunk]
            vectors = self.get_embeddings(part)
            kept = [(h, v) for h, v in zip(part, vectors, strict=True) if v is not None]
            if kept:
                yield [h for h, _ in kept], np.stack([v for _, v in kept])

    # -- what a decision reads -------------------------------------------------------------------------

    def neighbour_state(self, hashes: Sequence[str]) -> NeighbourState:
        """Statistics, marks and clusters of ``hashes`` and the current versions, in one round trip."""
        with _available(), self.client.pipeline(transaction=False) as pipe:
            for kind in ("stats", "mark", "cluster", "cmark", "distrust", "simfloor"):
                pipe.mget([self._key(kind, h) for h in hashes] or [self._key(kind, "-")])
            pipe.hgetall(self._versions_key)
            raw_stats, raw_marks, raw_clusters, raw_cmarks, raw_distrusts, raw_floors, raw_versions = pipe.execute()

        def seconds(raw: list[bytes | None]) -> dict[str, float | None]:
            return {h: None if value is None else float(value) for h, value in zip(hashes, raw, strict=False)}

        return NeighbourState(
            stats={h: _stats_from_json(raw) for h, raw in zip(hashes, raw_stats, strict=False)},
            marks=seconds(raw_marks),
            clusters={h: None if raw is None else raw.decode() for h, raw in zip(hashes, raw_clusters, strict=False)},
            cluster_marks=seconds(raw_cmarks),
            versions=_versions(raw_versions),
            distrusts=seconds(raw_distrusts),
            similarity_floors=seconds(raw_floors),
        )

    def versions(self) -> VersionState:
        return _versions(self._call(lambda: self.client.hgetall(self._versions_key)))

    def get_stats(self, prompt_hash: str) -> RewardStats | None:
        return _stats_from_json(self._call(lambda: self.client.get(self._key("stats", prompt_hash))))

    def get_stats_many(self, hashes: Sequence[str]) -> list[RewardStats | None]:
        """Statistics of each of ``hashes``, in one round trip."""
        if not hashes:
            return []
        raws = self._call(lambda: self.client.mget([self._key("stats", h) for h in hashes]))
        return [_stats_from_json(raw) for raw in raws]

    def get_mark(self, prompt_hash: str) -> float | None:
        raw = self._call(lambda: self.client.get(self._key("mark", prompt_hash)))
        return None if raw is None else float(raw)

    # -- what the stats worker writes ------------------------------------------------------------------

    def apply_reward(
        self, prompt_hash: str, response_hash: str, obs: RewardObservation, now: float, request_id: str = ""
    ) -> RewardUpdate:
        """Fold one reward into the prompt's statistics, once per (prompt, response, RM version); when
        ``request_id`` is an audited skip's, add the reward to that audit too, and when it completes an
        audit that erred (``routing.audit_erred``), mark the neighbours the skip reused as distrusted and
        raise their similarity floors to their similarity to this prompt.

        Optimistic transaction (WATCH/MULTI): the dedupe key, the statistics, the mark, the audit and its
        verdict change together or not at all, and a concurrent update of the same prompt retries.
        """
        s = self._s
        stats_key, mark_key = self._key("stats", prompt_hash), self._key("mark", prompt_hash)
        seen_key = f"{s.redis_prefix}:seen:{prompt_hash}:{response_hash}:{obs.rm_version}"
        audit_key = self._audit_key(prompt_hash, request_id) if request_id else None
        with _available(), self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(stats_key, seen_key, *([audit_key] if audit_key else []))
                    if pipe.exists(seen_key):
                        current = _stats_from_json(pipe.get(stats_key))  # before unwatch: then it buffers
                        pipe.unwatch()
                        return RewardUpdate(False, current, False)
                    old = _stats_from_json(pipe.get(stats_key))
                    new = apply_reward(old, obs, s.stats_ttl_s, s.max_policy_lag, self._aging)
                    mark = marks_high_uncertainty(new, s.min_samples_per_neighbour, s.high_variance_threshold)
                    newly_marked = mark and not pipe.exists(mark_key)
                    audit = (pipe.hmget(audit_key, "reused", "n", "sum", "expected", "donors", "sims")
                             if audit_key else None)
                    audited = audit is not None and audit[0] is not None
                    erred = self._erred_donors(audit, obs.reward) if audit is not None else {}
                    distrusted = tuple(erred) if s.audit_distrust_ttl_s > 0 else ()
                    floors = self._raised_floors(pipe, prompt_hash, erred)
                    cluster = pipe.get(self._key("cluster", prompt_hash)) if mark and s.cluster_marking else None
                    pipe.multi()
                    pipe.set(stats_key, _stats_to_json(new), ex=s.stats_ttl_s)
                    pipe.set(seen_key, b"1", ex=s.dedupe_ttl_s)
                    if mark:
                        pipe.set(mark_key, repr(now), ex=s.mark_ttl_s)
                    if cluster is not None:
                        pipe.set(self._key("cmark", cluster.decode()), repr(now), ex=s.mark_ttl_s)
                    if newly_marked:
                        pipe.hincrby(self._counters_key, "high_uncertainty_marks", 1)
                    if audited:
                        pipe.hincrby(audit_key, "n", 1)
                        pipe.hincrbyfloat(audit_key, "sum", obs.reward)
                    for donor in distrusted:
                        pipe.set(self._key("distrust", donor), repr(now), ex=s.audit_distrust_ttl_s)
                    if distrusted:
                        pipe.hincrby(self._counters_key, "audit_distrusts", 1)
                    for donor, floor in floors.items():
                        pipe.set(self._key("simfloor", donor), repr(floor), ex=s.audit_similarity_floor_ttl_s)
                    if floors:
                        pipe.hincrby(self._counters_key, "audit_similarity_floors", len(floors))
                    pipe.execute()
                    return RewardUpdate(True, new, newly_marked, distrusted, floors)
                except redis.WatchError:
                    continue

    def apply_label(self, prompt_hash: str, response_hash: str, annotator: str, obs: LabelObservation) -> bool:
        """Add one person's label of a Level-1 answer to the prompt's record, once per (prompt, response,
        annotator); True when it changed the statistics (False: seen before, or no live statistics to add to)."""
        s = self._s
        stats_key = self._key("stats", prompt_hash)
        seen_key = f"{s.redis_prefix}:label:{prompt_hash}:{response_hash}:{annotator}"
        with _available(), self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(stats_key, seen_key)
                    if pipe.exists(seen_key):
                        pipe.unwatch()
                        return False
                    new = apply_label(_stats_from_json(pipe.get(stats_key)), obs, s.stats_ttl_s, self._aging)
                    ttl = pipe.ttl(stats_key)
                    pipe.multi()
                    if new is not None:  # keeps the statistics' expiry: a label is no reward and renews nothing
                        pipe.set(stats_key, _stats_to_json(new), ex=ttl if ttl > 0 else s.stats_ttl_s)
                    pipe.set(seen_key, b"1", ex=s.dedupe_ttl_s)
                    pipe.execute()
                    return new is not None
                except redis.WatchError:
                    continue

    # -- audited skips ---------------------------------------------------------------------------------

    def _audit_key(self, prompt_hash: str, request_id: str) -> str:
        return f"{self._s.redis_prefix}:audit:{prompt_hash}:{request_id}"

    def _audited_prompt(self, key: str | bytes) -> str:
        """The prompt hash of an audit's key (the prefix may hold colons; a hash and a request id do not)."""
        text = key.decode() if isinstance(key, bytes) else key
        return text[len(f"{self._s.redis_prefix}:audit:"):].split(":", 1)[0]

    def _erred_donors(self, audit: Sequence[Any], reward: float) -> dict[str, float | None]:
        """When ``reward`` completes this audit (its raw hash fields) and it erred: the neighbours it reused,
        each with its similarity to the prompt (None: an audit recorded without them); else nothing."""
        reused, n, total, expected, donors, sims = audit
        if reused is None or not donors:
            return {}
        if not audit_erred(float(reused), int(n or 0) + 1, float(total or 0.0) + reward, int(expected or 0),
                           self._s.audit_tolerance):
            return {}
        names = donors.decode().split(",")
        values: list[float | None] = [float(v) for v in sims.decode().split(",")] if sims else []
        if len(values) != len(names):
            values = [None] * len(names)
        return dict(zip(names, values, strict=True))

    def _raised_floors(self, pipe: Any, prompt_hash: str, erred: Mapping[str, float | None]) -> dict[str, float]:
        """The similarity floors an erring audit raises (read in the watched pipeline, before MULTI): each
        reused neighbour other than the prompt itself, to its similarity, where that is above its floor."""
        wanted = {donor: sim for donor, sim in erred.items() if sim is not None and donor != prompt_hash}
        if self._s.audit_similarity_floor_ttl_s <= 0 or not wanted:
            return {}
        keys = [self._key("simfloor", donor) for donor in wanted]
        pipe.watch(*keys)  # floors only rise: a concurrent raise retries this update
        current = pipe.mget(keys)
        return {donor: sim for (donor, sim), raw in zip(wanted.items(), current, strict=True)
                if raw is None or sim > float(raw)}

    def record_audits(self, audits: Sequence[AuditRecord], now: float) -> None:
        """Skips to roll out anyway: written before the prompts are published, so that no fresh reward can
        arrive before its audit exists."""
        if not audits:
            return
        with _available(), self.client.pipeline(transaction=True) as pipe:
            for record in audits:
                key = self._audit_key(record.prompt_hash, record.request_id)
                pipe.hset(key, mapping={"reused": repr(record.reused), "n": 0, "sum": 0.0,
                                        "expected": record.expected, "donors": ",".join(record.donors),
                                        "sims": ",".join(repr(float(v)) for v in record.similarities)})
                pipe.expire(key, self._s.audit_ttl_s)
                pipe.zadd(self._audits_key, {key: now})
            pipe.zremrangebyscore(self._audits_key, "-inf", now - self._s.audit_ttl_s)
            pipe.execute()

    def audit_summary(self, window: int = 10_000) -> AuditSummary:
        """The latest ``window`` audits against their fresh rewards."""
        with _available():
            keys = self.client.zrevrange(self._audits_key, 0, window - 1)
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.hmget(key, "reused", "n", "sum")
                rows = pipe.execute() if keys else []
        records = [(self._audited_prompt(key), float(r[0]), int(r[1]), float(r[2]))
                   for key, r in zip(keys, rows, strict=True) if r[0] is not None]
        return summarise_audits(records, self._s.audit_tolerance)

    def update_versions(self, policy_version: int | None = None, rm_version: str = "", at: float = 0.0) -> None:
        """Advance the newest policy version and/or record a promoted RM version (only forward)."""
        args = [-1 if policy_version is None else policy_version, rm_version, repr(at)]
        self._call(lambda: self._update_versions(keys=[self._versions_key], args=args))

    # -- counters --------------------------------------------------------------------------------------

    def count(self, increments: Mapping[str, int]) -> None:
        with _available(), self.client.pipeline(transaction=False) as pipe:
            for name, value in increments.items():
                pipe.hincrby(self._counters_key, name, value)
            pipe.execute()

    def summary(self) -> StoreSummary:
        with _available(), self.client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._counters_key)
            pipe.zcard(self._indexed_key)
            counters, indexed = pipe.execute()
        return StoreSummary({k.decode(): int(v) for k, v in counters.items()}, int(indexed))


def _versions(raw: Mapping[bytes, Any]) -> VersionState:
    policy = raw.get(b"policy_version")
    rm = raw.get(b"rm_version")
    return VersionState(int(policy) if policy is not None else 0, rm.decode() if rm else None)
