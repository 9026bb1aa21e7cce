"""Kafka side of the annotation desk: AnnotationRequested in; AnnotationCompleted, the sample's one
final RewardScored and its rollout-log record out.

Two parts, as in the other services (poll -> step -> publish -> commit):

* ``AnnotationWorker`` queues each requested sample (idempotent by item id: a redelivered or
  duplicated request adds nothing). A request whose texts are not in the content store, or whose
  hashes do not make sense, is poison: the bus dead-letters it.
* ``DeskLoop`` runs every ``loop_interval_s``: (1) close the items past their deadline, (2) publish
  what the outbox holds, (3) mark what Kafka acknowledged and settle. A closed item publishes one
  AnnotationCompleted per score and, when the reward service awaits it (``provisional`` set and
  ``awaiting_annotation``), exactly one final RewardScored: the human mean, or the provisional
  reward itself when no score came in time. Each publication is marked sent only after Kafka
  acknowledged it (as svc_reward claims escalations), so a failed publish is retried by the next
  pass; a crash between the acknowledgement and the mark publishes it twice. One replica at a time
  holds the loop (a lease in Redis).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from prometheus_client import Counter, Gauge

from strata import ledger
from strata.audit import HUMAN_AUDIT, AuditLabel, AuditTally, add_labels, add_to, rms_of
from strata.bus import Delivery, PoisonMessageError, Publisher, topics
from strata.bus.errors import is_transient
from strata.content_store import ContentStore
from strata.contract.tiers import TIER_NUMBER
from strata.hashing import is_content_hash
from strata.v1 import common_pb2, events_pb2
from svc_annotation.core import (
    COMPLETE,
    EXPIRED,
    PENDING,
    GoldItem,
    Item,
    Rules,
    Score,
    deadline_of,
    final_reward,
    item_id_of,
    scores_needed,
)
from svc_annotation.drift import MAX_SCORE, Observation, item_observations
from svc_annotation.drift_book import DriftBook
from svc_annotation.store import AnnotationStore, Ready

log = logging.getLogger(__name__)

QUEUE_DEPTH = Gauge("strata_annotation_queue_depth", "Items waiting for a human score")
ITEMS_COMPLETED = Counter("strata_annotation_items_completed",
                          "Items closed with human scores (all they need, or some at the deadline)")
EXPIRED_TO_PROVISIONAL = Counter("strata_annotation_expired_to_provisional",
                                 "Items with no human score by the deadline: the provisional reward became final")
FINAL_REWARDS = Counter("strata_annotation_final_rewards", "Final rewards published, by scorer", ["scorer"])
HUMAN_AUDITS = Counter("strata_annotation_human_audits", "Level-1 answers people scored, added to the human audit")


def item_of(request: events_pb2.AnnotationRequested, now: float, rules: Rules) -> Item:
    """The desk's item for a request. Pure; a request that makes no sense is poison."""
    for name in ("prompt_hash", "response_hash"):
        if not is_content_hash(getattr(request, name)):
            raise PoisonMessageError(f"annotation request with a malformed {name} {getattr(request, name)[:80]!r}")
    request_id, sample_index, awaits_final = "", 0, False
    if request.HasField("provisional"):
        provisional = request.provisional
        if (provisional.prompt_hash, provisional.response_hash) != (request.prompt_hash, request.response_hash):
            raise PoisonMessageError(f"annotation request for {request.response_hash[:12]} carries the provisional "
                                     f"reward of another sample ({provisional.response_hash[:12]})")
        if not math.isfinite(provisional.reward):
            raise PoisonMessageError(f"provisional reward {provisional.reward} of {request.response_hash[:12]} is not "
                                     "a number")
        request_id, sample_index = provisional.request_id, provisional.sample_index
        awaits_final = provisional.awaiting_annotation
    item_id = item_id_of(request.prompt_hash, request.response_hash, request_id, sample_index)
    return Item(item_id=item_id, prompt_hash=request.prompt_hash, response_hash=request.response_hash,
                request_id=request_id, sample_index=sample_index, needs=scores_needed(item_id, rules.double_share),
                enqueued_at=now, deadline_at=deadline_of(now, rules), awaits_final=awaits_final,
                event=request.SerializeToString())


def completed_event(item: Item, request: events_pb2.AnnotationRequested | None,
                    score: Score) -> events_pb2.AnnotationCompleted:
    """One annotator's score as the drift tracker and RM training read it. Pure."""
    out = events_pb2.AnnotationCompleted(
        prompt_hash=item.prompt_hash, response_hash=item.response_hash, annotator_id=score.annotator,
        score=score.score, unsafe=score.unsafe, off_topic=score.off_topic, gold=item.gold,
        request_id=item.request_id, sample_index=item.sample_index,
    )
    if request is not None:
        out.policy_version = request.policy_version
        out.rm_version = request.rm_version
        out.tier = request.tier
        out.requested_at.CopyFrom(request.requested_at)
    out.completed_at.FromNanoseconds(int(score.scored_at * 1e9))
    return out


def final_event(provisional: events_pb2.RewardScored, scores: Sequence[Score]) -> events_pb2.RewardScored:
    """The sample's final reward: the human scores' mean, or (none in time) the provisional one. Pure."""
    out = events_pb2.RewardScored()
    out.CopyFrom(provisional)
    out.final = True
    out.awaiting_annotation = False
    if scores:
        human = final_reward(scores)
        out.reward = human.reward
        out.reward_std = human.spread  # the annotators' disagreement, as an ensemble's spread
        out.scorer = common_pb2.SCORER_HUMAN
        out.annotator_id = human.annotators
        out.unsafe = provisional.unsafe or human.unsafe
        out.scored_at.FromNanoseconds(int(max(s.scored_at for s in scores) * 1e9))
    return out


class AnnotationWorker:
    """AnnotationRequested -> the desk's queue."""

    def __init__(self, store: AnnotationStore, content: ContentStore) -> None:
        self._store = store
        self._content = content

    def handle_batch(self, deliveries: list[Delivery[events_pb2.AnnotationRequested]]) -> None:
        for delivery in deliveries:
            request = delivery.message
            item = item_of(request, self._store.clock(), self._store.rules)
            for name, digest in (("prompt", item.prompt_hash), ("response", item.response_hash)):
                if not self._content.contains(digest):
                    raise PoisonMessageError(f"the {name} {digest[:12]} of an annotation request is not in the "
                                             "content store (never stored, or expired)")
            if self._store.enqueue(item):
                log.info("annotation queued item=%s prompt=%s response=%s needs=%d awaits_final=%s", item.item_id,
                         item.prompt_hash[:12], item.response_hash[:12], item.needs, item.awaits_final)
            else:
                log.info("annotation item=%s already queued: redelivery ignored", item.item_id)


def drift_observations(entry: Ready, request: events_pb2.AnnotationRequested | None) -> list[Observation]:
    """What a closed item tells about its annotators (R18): a gold item each score against the known
    one (annotators of a gold item at different times are not peers); a real item each score against
    the strong RM's reward (``request``, the item's event) and the other annotators' scores."""
    item = entry.item
    if item.gold:
        return [Observation(s.annotator, item.item_id, s.score, gold=item.gold_score) for s in entry.scores]
    if item.state not in (COMPLETE, EXPIRED) or not entry.scores:
        return []
    model = None
    if request is not None and math.isfinite(request.model_reward):
        model = min(MAX_SCORE, max(0.0, request.model_reward))
    return item_observations(item.item_id, {s.annotator: s.score for s in entry.scores}, None, model)


@dataclass(frozen=True)
class HumanAudit:
    """The desk's side of the live audit (``strata.audit``): people's scores of Level-1 answers beside the
    light RM's reward of the same answers, tallied per policy version."""

    bad_below: float  # a mean human score under this marks the answer bad (catch and false-pass estimates)
    ttl_s: int  # how long a policy version's tally is kept
    labels_kept: int = 0  # audited answers kept one by one (``strata.audit.AuditLabel``)


def human_audit_of(entry: Ready, request: events_pb2.AnnotationRequested | None, bad_below: float,
                   drifting: frozenset[str] = frozenset()) -> tuple[int, AuditTally] | None:
    """A closed item's contribution to the human audit, by policy version: a Level-1 answer (not gold) people
    scored, against the light RM's reward the request carries (``model_reward``: on people's scale where the
    light RM has a calibration, and the light RM's even where the hacking defence published the strong RM's).
    Scores of ``drifting`` annotators (the desk's drift alarm) are left out: a drifting scale would read as a
    moving gap. None for anything else. Pure."""
    if request is None or entry.item.gold or request.tier != common_pb2.TIER_LEVEL_1:
        return None
    scores = [score.score for score in entry.scores if score.annotator not in drifting]
    if not scores or not request.HasField("provisional") or not math.isfinite(request.model_reward):
        return None
    human = sum(scores) / len(scores)
    return request.policy_version, AuditTally.of(request.model_reward, human, request.provisional.escalated,
                                                  human < bad_below, rms_of(request.rm_version))


class DeskLoop:
    """Close due items, publish what is ready, settle; once per ``interval_s``."""

    def __init__(self, store: AnnotationStore, publisher: Publisher, client: redis.Redis, owner: str,
                 interval_s: float, batch: int, lease_s: float, gold: Sequence[GoldItem] = (),
                 gold_refresh_s: float = 24 * 3600, drift: DriftBook | None = None,
                 audit: HumanAudit | None = None) -> None:
        self._store = store
        self._drift = drift
        self._audit = audit
        self._publisher = publisher
        self._redis = client  # the cost ledger's counts
        self._owner = owner
        self._interval_s = interval_s
        self._batch = batch
        self._lease_s = lease_s
        self._gold = list(gold)
        self._gold_refresh_s = gold_refresh_s  # gold texts live in the content store, which expires them
        self._gold_loaded_at: float | None = None

    def _feed_drift(self, entry: Ready, request: events_pb2.AnnotationRequested | None) -> None:
        """Each annotator's score of a closed item once (claimed like a publication, before feeding:
        a crash in between loses one observation rather than counting it twice)."""
        for obs in drift_observations(entry, request):
            if f"d:{obs.annotator}" not in entry.sent and self._store.mark_sent(entry.item, f"d:{obs.annotator}"):
                current = self._drift.feed_one(obs)  # type: ignore[union-attr]
                if current.alarm and current.alarm_since is not None:
                    log.warning("annotator %s: drift alarm %s since its item %d", obs.annotator, current.status,
                                current.alarm_since)

    def _feed_audit(self, entry: Ready, request: events_pb2.AnnotationRequested | None,
                    drifting: frozenset[str] = frozenset()) -> None:
        """A closed Level-1 item's human score into the audit once (claimed before it is added, as drift is:
        a crash in between loses one audit rather than counting it twice); ``drifting``: annotators in drift
        alarm, left out."""
        if self._audit is None:
            return
        found = human_audit_of(entry, request, self._audit.bad_below, drifting)
        if found is None or "audit" in entry.sent or not self._store.mark_sent(entry.item, "audit"):
            return
        version, tally = found
        with self._redis.pipeline(transaction=True) as pipe:
            add_to(pipe, HUMAN_AUDIT, {version: tally}, self._audit.ttl_s)
            if self._audit.labels_kept:
                label = AuditLabel(entry.item.prompt_hash, entry.item.response_hash, tally.strong_sum, tally.light_sum,
                                   version, escalated=tally.passed == 0, bad=tally.bad > 0)
                add_labels(pipe, HUMAN_AUDIT, [label], self._audit.labels_kept)
            pipe.execute()
        HUMAN_AUDITS.inc()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.step()
            except Exception as exc:
                if not is_transient(exc):
                    raise  # a bug: the process stops and its supervisor restarts it
                log.warning("annotation loop: %s: %s; retrying in %.1f s", type(exc).__name__, exc, self._interval_s)
            stop.wait(self._interval_s)

    def step(self) -> int:
        """One pass; returns the items settled."""
        self._refresh_gold()
        QUEUE_DEPTH.set(self._store.queue_depth())
        if not self._store.hold_publisher(self._owner, self._lease_s):
            return 0  # another replica's turn
        for item_id, state in self._store.close_due(self._batch):
            if state == EXPIRED:
                log.info("annotation item=%s: no human score by the deadline, the provisional reward is final",
                         item_id)
            else:
                log.info("annotation item=%s: deadline passed with some of its scores, closed with those", item_id)
        ready = self._store.outbox(self._batch)
        if ready:
            self._publish(ready)
        return len(ready)

    def _refresh_gold(self) -> None:
        now = time.monotonic()
        if self._gold and (self._gold_loaded_at is None or now - self._gold_loaded_at >= self._gold_refresh_s):
            ids = self._store.load_gold(self._gold)
            self._gold_loaded_at = now
            log.info("annotation gold set: %d items", len(ids))

    def _publish(self, ready: list[Ready]) -> None:
        futures = []
        sent: list[tuple[Item, str]] = []
        finals: list[tuple[Item, events_pb2.RewardScored]] = []
        closed: list[tuple[Ready, events_pb2.AnnotationRequested | None]] = []
        for entry in ready:
            item = entry.item
            if item.state == PENDING:
                continue  # nothing to publish before it closes
            request = events_pb2.AnnotationRequested.FromString(item.event) if item.event else None
            closed.append((entry, request))
            for score in entry.scores:
                if f"c:{score.annotator}" not in entry.sent:
                    futures.append(self._publisher.publish(topics.ANNOTATIONS_COMPLETED,
                                                           completed_event(item, request, score)))
                    sent.append((item, f"c:{score.annotator}"))
            wants_final = request is not None and item.awaits_final and item.state in (COMPLETE, EXPIRED)
            if wants_final and "final" not in entry.sent:
                final = final_event(request.provisional, entry.scores)  # type: ignore[union-attr]
                futures.append(self._publisher.publish(topics.REWARDS_SCORED, final))
                futures.append(self._publisher.publish(topics.ROLLOUT_LOG, events_pb2.RolloutLogRecord(
                    prompt_hash=final.prompt_hash, response_hash=final.response_hash, reward=final.reward)))
                finals.append((item, final))
        self._publisher.wait(futures)
        # Acknowledged: now mark, so that no later pass publishes them again.
        for item, what in sent:
            self._store.mark_sent(item, what)
        for item, final in finals:
            if self._store.mark_sent(item, "final"):
                tier = TIER_NUMBER.get(final.tier)
                if tier is not None:
                    ledger.count(self._redis, f"final_tier{tier}")  # the reward service left it to us
                FINAL_REWARDS.labels(scorer=common_pb2.Scorer.Name(final.scorer)).inc()
            log.info("annotation final reward item=%s prompt=%s response=%s reward=%.3f scorer=%s annotators=%s",
                     item.item_id, final.prompt_hash[:12], final.response_hash[:12], final.reward,
                     common_pb2.Scorer.Name(final.scorer), final.annotator_id or "-")
        if self._drift is not None:
            for entry, request in closed:
                self._feed_drift(entry, request)
        if self._audit is not None and closed:
            drifting = self._drift.drifting() if self._drift is not None else frozenset()
            for entry, request in closed:
                self._feed_audit(entry, request, drifting)
        for entry in ready:
            if self._store.settle(entry.item.item_id, entry.seq):
                if entry.item.state == COMPLETE:
                    ITEMS_COMPLETED.inc()
                elif entry.item.state == EXPIRED:
                    EXPIRED_TO_PROVISIONAL.inc()
