"""Kafka side of the reward service: rollouts in; rewards, escalations, annotations and the rollout
log out.

Idempotent by (tier, prompt hash, response hash, request, sample): a done key is set in Redis after
everything of a rollout is acknowledged by Kafka, and a redelivered rollout with a done key is
skipped. An escalation is published once per (prompt, request): its key is claimed (SET NX) only
after Kafka acknowledged it, so a publish that fails leaves it to the redelivered rollout. A crash
between the acknowledgement and the claim publishes it twice, which is harmless: the escalation's
request identity is stable, and the Level-2 generator's claim keys dedupe by it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import redis
from kafka.producer.future import FutureRecordMetadata
from prometheus_client import Counter, Gauge, Histogram

from strata import ledger, risk
from strata.audit import (
    HUMAN_AUDIT,
    STRONG_AUDIT,
    AuditLabel,
    AuditTally,
    add_labels,
    add_to,
    deciding,
    read_judges,
    read_versions,
    rms_of,
)
from strata.bus import Delivery, PoisonMessageError, Publisher, topics
from strata.content_store import ContentNotFoundError, ContentStore
from strata.contract.identity import request_identity, sample_identity
from strata.contract.tiers import TIER_NUMBER
from strata.v1 import common_pb2, events_pb2
from svc_reward import audit_store
from svc_reward.audit import sampled_for_audit, strong_calls_bad
from svc_reward.config import RewardSettings
from svc_reward.decide import (
    RuleVerdict,
    decide,
    describe_escalation,
    describe_threshold,
    escalation_threshold,
    sampled_for_annotation,
)
from svc_reward.defence import DefenceState, respond
from svc_reward.escalation_rule import EscalationRule, features
from svc_reward.models import RewardModels, Scores
from svc_reward.signals_store import StoredSignals, add_signals

log = logging.getLogger(__name__)

REWARDS = Histogram("strata_reward_score", "Rewards produced (0-5)", ["tier", "scorer"],
                    buckets=(0.5, 1, 1.5, 2, 2.5, 3, 3.2, 3.5, 4, 4.5, 5))
ESCALATIONS = Counter("strata_reward_escalations_total", "Level-1 prompts escalated to Level-2 (R3)")
UNSAFE = Counter("strata_reward_unsafe_total", "Responses flagged for unsafe advice (R12)", ["tier", "kind"])
SCORE_SECONDS = Histogram("strata_reward_score_batch_seconds", "RM scoring time per batch", ["tier"])
AUDITS = Counter("strata_reward_audits_total", "Level-1 answers also scored by the strong RM (the live audit)")
AUDIT_GAP = Gauge("strata_reward_audit_hacking_gap", "Light RM minus the judge (strong RM or people) on the newest "
                  "audited versions", ["judge"])
AUDIT_GAP_DRIFT = Gauge("strata_reward_audit_hacking_gap_drift",
                        "The hacking gap's growth from the first audited versions to the newest", ["judge"])
AUDIT_CATCH = Gauge("strata_reward_audit_catch", "Escalated share of the audited answers the judge calls bad",
                    ["judge"])
AUDIT_FALSE_PASS = Gauge("strata_reward_audit_false_pass", "Bad share (by the judge) of the audited answers passed",
                         ["judge"])
HACKING_ALARM = Gauge("strata_reward_hacking_alarm", "1 while the live hacking alarm fires")
DEFENCE_SHARE = Gauge("strata_reward_defence_share",
                      "Strong-RM share of Level-1 answers the hacking defence adds (their reward the strong RM's)")



def rule_verdict(rule: EscalationRule | None, event: events_pb2.RolloutGenerated, reward: float, spread: float,
                 response: str) -> RuleVerdict | None:
    """The served escalation rule's verdict on one Level-1 answer; None without a rule, or when the event
    lacks a signal the rule needs (the threshold then decides)."""
    if rule is None:
        return None
    probability = rule.probability(features(StoredSignals.of(event).signals(reward, spread, response)))
    if probability is None:
        return None
    return RuleVerdict(probability >= rule.threshold, probability, rule.threshold)


def done_key(event: events_pb2.RolloutGenerated) -> str:
    sample = sample_identity(event.prompt_hash, event.response_hash, event.request_id, event.sample_index)
    return f"strata:reward:done:{event.tier}:{sample}"


def escalation_key(event: events_pb2.RolloutGenerated) -> str:
    return f"strata:reward:escalated:{event.prompt_hash}:{event.request_id}"


@dataclass(frozen=True)
class _ItemScore:
    reward: float  # raw: what is published
    spread: float  # across the ensemble's members (0 for one RM)
    version: str
    scorer: int  # common_pb2.Scorer
    calibrated: float | None = None  # on the oracle's scale, when the light RM that scored it has a calibration
    calibrated_threshold: float | None = None  # the escalation threshold stored with that calibration
    rule: RuleVerdict | None = None  # the learned escalation rule's verdict, where one is served and could judge
    strong: _Audited | None = None  # the defence: an audited answer published, when final, with the strong reward


@dataclass(frozen=True)
class _Audited:
    """The strong RM's judgment of an audited Level-1 answer."""

    reward: float
    version: str
    charge: ledger.Charge  # booked at tier 1


@dataclass(frozen=True)
class _Emitted:
    """What ``_emit`` published for one rollout, for the batch to claim and book once acknowledged."""

    futures: list[FutureRecordMetadata]
    final: bool
    annotated: bool
    escalate: bool  # the rule sent this answer's prompt to Level-2 (published now or by an earlier sample)
    escalation: str | None  # the escalation key, when this rollout escalated its prompt
    threshold: float  # the escalation threshold the reward was compared with
    calibrated_scale: bool  # ... on the light RM's calibrated scale (else the raw one)


def escalation_event(event: events_pb2.RolloutGenerated, reason: str) -> events_pb2.PromptRouted:
    """The Level-2 request an escalated Level-1 answer sends (R3)."""
    escalation = events_pb2.PromptRouted(
        prompt_hash=event.prompt_hash, tier=common_pb2.TIER_LEVEL_2, decision=common_pb2.DECISION_LEVEL_2,
        reason=f"escalated: {reason}", sampling=event.sampling, n_samples=1,
        directions=event.directions, caution=event.caution, escalated_from=common_pb2.TIER_LEVEL_1,
        policy_version=event.policy_version,
        # Stable across a republish, so the Level-2 generator's claims dedupe it.
        request_id=request_identity(event.request_id, event.routed_at.seconds, event.routed_at.nanos),
    )
    escalation.submitted_at.CopyFrom(event.routed_at)
    escalation.routed_at.GetCurrentTime()
    return escalation


class RewardWorker:
    def __init__(self, settings: RewardSettings, models: RewardModels, store: ContentStore,
                 client: redis.Redis, publisher: Publisher) -> None:
        self._settings = settings
        self._models = models
        self._store = store
        self._redis = client
        self._publisher = publisher
        self._alarm: str | None = None
        self._watched_at = -math.inf  # monotonic time the audit was last read
        self._escalation_version: str | None = None  # the light RM whose escalation was last said (Redis, log)
        try:
            self._defence = audit_store.read_defence(client) if settings.hacking_defence else DefenceState()
            audit_store.write_thresholds(client, audit_store.ServedThresholds(
                settings.hacking_min_audits, settings.hacking_gap_bound, settings.hacking_defence))
        except redis.RedisError as exc:  # the first audited batch reads it again
            log.warning("could not read the hacking defence's state from Redis (%s): none until the next audit", exc)
            self._defence = DefenceState()
        DEFENCE_SHARE.set(self._defence.share)

    def handle_batch(self, deliveries: list[Delivery[events_pb2.RolloutGenerated]]) -> None:
        # Redis in one round trip each: which samples are done, which prompts already escalated, the texts.
        delivered = [d.message for d in deliveries]
        with self._redis.pipeline(transaction=False) as pipe:
            for event in delivered:
                pipe.exists(done_key(event))
            for event in delivered:
                pipe.exists(escalation_key(event))
            flags = pipe.execute()
        n = len(delivered)
        todo = [event for event, done in zip(delivered, flags[:n], strict=True) if not done]
        escalated_before = {escalation_key(e) for e, flag in zip(delivered, flags[n:], strict=True) if flag}
        by_tier: dict[int, list[events_pb2.RolloutGenerated]] = defaultdict(list)
        for event in todo:
            if event.tier not in TIER_NUMBER:
                raise PoisonMessageError(f"rollout of unknown tier {event.tier}")
            by_tier[TIER_NUMBER[event.tier]].append(event)
        futures = []
        escalations: set[str] = set()  # escalation keys published in this batch, claimed once acknowledged
        escalated = set(escalated_before)  # ... and every key no later sample may escalate again
        finals: list[int] = []
        charges: list[tuple[events_pb2.RolloutGenerated, list[ledger.Charge]]] = []
        audits: dict[int, AuditTally] = {}  # policy version -> this batch's audited answers
        labels: list[AuditLabel] = []  # ... and their strong-RM rewards, labels for the RM loop
        kept: list[tuple[str, StoredSignals]] = []  # Level-1 answers sent to people: their rule signals
        for tier, events in by_tier.items():
            try:
                texts = self._store.get_texts([e.prompt_hash for e in events] + [e.response_hash for e in events])
                prompts, responses = texts[: len(events)], texts[len(events):]
            except ContentNotFoundError as exc:
                raise PoisonMessageError(str(exc)) from exc
            with SCORE_SECONDS.labels(tier=str(tier)).time():
                scores = self._models.score(prompts, responses, strong=(tier == 2 and self._models.has_strong))
            for event, reward, spread in zip(events, scores.rewards, scores.spreads, strict=True):
                if not (math.isfinite(reward) and math.isfinite(spread)):
                    # Checked before anything of the batch is published: the bus then handles the
                    # events one by one and dead-letters only this one; a NaN never reaches the learner.
                    raise PoisonMessageError(f"the reward model scored response {event.response_hash[:12]} "
                                             f"{reward} (spread {spread}): not a finite number")
            scorer = common_pb2.SCORER_STRONG if tier == 2 and self._models.has_strong else common_pb2.SCORER_LIGHT
            if tier == 1 and scores.version != self._escalation_version:
                self._say_escalation(scores)
            audited = self._audit_scores(tier, events, prompts, responses)
            calibrated: Sequence[float | None] = scores.calibrated or [None] * len(events)
            for i, (event, response, reward, spread, charge, cal) in enumerate(zip(
                    events, responses, scores.rewards, scores.spreads, scores.charges, calibrated, strict=True)):
                unsafe = risk.detect_unsafe_advice(response) if self._settings.flag_unsafe else None
                if unsafe is not None:
                    UNSAFE.labels(tier=str(tier), kind=unsafe.kind).inc()
                verdict = rule_verdict(scores.rule, event, reward, spread, response) if tier == 1 else None
                item = _ItemScore(reward, spread, scores.version, scorer, cal, scores.calibrated_threshold, verdict,
                                  audited.get(i) if self._defending else None)
                emitted = self._emit(tier, event, item, unsafe is not None, escalated)
                futures.extend(emitted.futures)
                if emitted.final:
                    finals.append(tier)  # counted once the batch is acknowledged
                if emitted.escalation is not None:
                    escalations.add(emitted.escalation)
                    escalated.add(emitted.escalation)
                # Booked as human review once the batch is acknowledged.
                review = ([ledger.Charge("human_review", tier, human_seconds=self._settings.review_seconds_per_item)]
                          if emitted.annotated else [])
                if emitted.annotated and tier == 1:  # their labels refit the escalation rule (strata rm refresh)
                    kept.append((event.response_hash, StoredSignals.of(event)))
                booked = [charge, *review]
                if i in audited:
                    strong = audited[i]
                    booked.append(strong.charge)
                    bad = self._strong_calls_bad(strong.reward, emitted)
                    one = AuditTally.of(reward, strong.reward, emitted.escalate, bad, rms_of(scores.version,
                                                                                             strong.version))
                    audits[event.policy_version] = audits.get(event.policy_version, AuditTally()) + one
                    labels.append(AuditLabel(event.prompt_hash, event.response_hash, strong.reward, reward,
                                             event.policy_version, emitted.escalate, bad))
                charges.append((event, booked))
        self._publisher.wait(futures)
        for key in escalations:  # acknowledged: now claim, so that no later sample escalates again
            if self._redis.set(key, b"1", nx=True, ex=self._settings.content_ttl_s):
                ledger.count(self._redis, "escalations")
                ESCALATIONS.inc()
        if todo:
            self._commit(todo, finals, charges, audits, labels, kept)

    def _commit(self, todo: Sequence[events_pb2.RolloutGenerated], finals: Sequence[int],
                charges: Sequence[tuple[events_pb2.RolloutGenerated, list[ledger.Charge]]],
                audits: Mapping[int, AuditTally], labels: Sequence[AuditLabel],
                kept: Sequence[tuple[str, StoredSignals]]) -> None:
        """One transaction: the done keys, the ledger, the audit and the kept signals move together, so a
        rollout is booked and audited once; then the audit's figures, at most every ``audit_refresh_s``."""
        ttl = self._settings.content_ttl_s
        with self._redis.pipeline(transaction=True) as pipe:
            for event in todo:
                pipe.set(done_key(event), b"1", ex=ttl)
            for tier in finals:
                pipe.hincrby(ledger.COUNTS_KEY, f"final_tier{tier}", 1)
            for event, booked in charges:
                ledger.book(self._redis, event.prompt_hash, event.request_id, booked, ttl, pipe=pipe)
            add_to(pipe, STRONG_AUDIT, audits, self._settings.audit_ttl_s)
            if self._settings.audit_labels_kept:
                add_labels(pipe, STRONG_AUDIT, labels, self._settings.audit_labels_kept)
            add_signals(pipe, kept, ttl)
            pipe.execute()
        if audits:
            AUDITS.inc(sum(t.n for t in audits.values()))
        # After any batch, not only one with strong audits: people's tallies grow on their own.
        if time.monotonic() - self._watched_at >= self._settings.audit_refresh_s:
            self._watched_at = time.monotonic()
            self._watch_hacking()

    def _say_escalation(self, scores: Scores) -> None:
        """Write how Level-1 answers escalate under the light RM that scored them, for `strata status`; once
        per version (at start and after a swap)."""
        s = self._settings
        threshold = describe_threshold(s.escalation_threshold, s.use_calibration and scores.calibrated is not None,
                                       scores.calibrated_threshold)
        line = describe_escalation(scores.rule, threshold)
        audit_store.write_escalation(self._redis, scores.version, line)
        self._escalation_version = scores.version
        log.info("light RM %s: %s", scores.version, line)

    @property
    def _defending(self) -> bool:
        return self._settings.hacking_defence and self._defence.share > 0

    def _audit_scores(self, tier: int, events: Sequence[events_pb2.RolloutGenerated], prompts: Sequence[str],
                      responses: Sequence[str]) -> dict[int, _Audited]:
        """Index in ``events`` -> the strong RM's judgment, for the audited Level-1 answers: the audit's share,
        and the defence's on top while it defends."""
        share = self._settings.audit_level1_share
        if tier != 1 or share <= 0 or not self._models.has_strong:
            return {}
        if self._defending:
            share = min(1.0, share + self._defence.share)
        chosen = [i for i, e in enumerate(events) if sampled_for_audit(e.response_hash, share)]
        if not chosen:
            return {}
        scores = self._models.score([prompts[i] for i in chosen], [responses[i] for i in chosen], strong=True)
        found = {}
        for i, reward, charge in zip(chosen, scores.rewards, scores.charges, strict=True):
            if math.isfinite(reward):  # a non-finite strong score audits nothing; the light one decides
                found[i] = _Audited(reward, scores.version, replace(charge, tier=1))
        return found

    def _strong_calls_bad(self, strong: float, emitted: _Emitted) -> bool:
        """The strong RM's judgment of an audited answer, against the threshold ``_emit`` decided it with."""
        calibration = self._models.light_calibration if emitted.calibrated_scale else None
        return strong_calls_bad(strong, self._settings.audit_bad_below, emitted.threshold,
                                calibration.apply if calibration is not None else None)

    def _watch_hacking(self) -> None:
        """The live estimates as gauges; the alarm logged when it starts and when it stops."""
        s = self._settings
        # Rewritten at every read: a Redis restarted since the start (or down then) gets them back.
        audit_store.write_thresholds(self._redis, audit_store.ServedThresholds(
            s.hacking_min_audits, s.hacking_gap_bound, s.hacking_defence))
        readings = read_judges({HUMAN_AUDIT: read_versions(self._redis, HUMAN_AUDIT),
                                STRONG_AUDIT: read_versions(self._redis, STRONG_AUDIT)},
                               s.hacking_min_audits, s.hacking_gap_bound)
        for reading in readings:
            judge = reading.judge.name
            AUDIT_GAP.labels(judge=judge).set(reading.current.gap)
            AUDIT_CATCH.labels(judge=judge).set(reading.current.catch.estimate)
            AUDIT_FALSE_PASS.labels(judge=judge).set(reading.current.false_pass.estimate)
            if reading.baseline is not None:
                AUDIT_GAP_DRIFT.labels(judge=judge).set(reading.growth)
        acting = deciding(readings)
        if acting is None:  # no judge holds a window under the RMs scoring now (none yet, or they changed)
            if self._alarm:
                log.info("hacking alarm: no reading under the RMs scoring now; it waits for a new baseline")
            HACKING_ALARM.set(0)
            self._alarm = None
            return
        alarm = acting.alarm
        HACKING_ALARM.set(1 if alarm else 0)
        if alarm and not self._alarm:
            log.warning("hacking alarm (%s audit, policy v%d): %s", acting.judge.name, acting.last_version, alarm)
        elif self._alarm and not alarm:
            log.info("hacking alarm cleared (policy v%d): gap %+.3f (%s audit)", acting.last_version,
                     acting.current.gap, acting.judge.name)
        self._alarm = alarm
        if s.hacking_defence:
            # When people decide: does the strong RM see the growth too, or does it rate like its student?
            strong = next((r for r in readings if r.judge is STRONG_AUDIT), None)
            strong_growth = strong.growth if strong is not None and acting.judge is HUMAN_AUDIT else math.nan
            # The deciding judge's own newest version: a step per version of its evidence, never per version of
            # a faster judge's (people's scores lag the strong RM's).
            step = audit_store.apply_step(self._redis, lambda state: respond(
                state, acting.baseline, acting.current, acting.last_version, s.hacking_gap_bound,
                s.defence_share_step, s.defence_max_share, acting.judge, strong_growth, s.defence_kl_factor,
                s.defence_max_kl_scale))
            if step is None:  # another replica stepped first: serve what it wrote
                self._defence = audit_store.read_defence(self._redis)
            else:
                self._defence = step.state
                if step.decision is not None:
                    log.warning("hacking defence: %s", step.decision)
            DEFENCE_SHARE.set(self._defence.share)

    def _emit(self, tier: int, event: events_pb2.RolloutGenerated, score: _ItemScore, unsafe: bool,
              escalated: Collection[str]) -> _Emitted:
        """Publish what one scored rollout leads to (its reward; the rollout log, an escalation, an
        annotation request as ``decide`` says); nothing is claimed or booked until the batch is acknowledged."""
        reward, spread, version, scorer = score.reward, score.spread, score.version, score.scorer
        s = self._settings
        # The threshold is on the calibrated scale when the RM has a calibration (and comes with it unless
        # one is set); the raw reward is still what is published: the learner's and the scheduler's
        # rewards do not change scale with a calibration file.
        calibrated = score.calibrated if s.use_calibration else None
        threshold = escalation_threshold(s.escalation_threshold,
                                         None if calibrated is None else score.calibrated_threshold)
        outcome = decide(tier, reward if calibrated is None else calibrated, event.caution, threshold,
                         s.escalate_on_caution, s.annotate_level2, unsafe=unsafe,
                         await_annotation=bool(s.await_annotation),  # resolved at start (level2_humans)
                         sampled=tier == 1 and sampled_for_annotation(event.response_hash, s.annotate_level1_share),
                         raw=None if calibrated is None else reward, rule=score.rule)
        # What people's scores are compared with (drift, the human audit): the light RM's reward on their scale
        # when it has a calibration, and never the strong RM's that the defence may publish instead.
        light_reward = score.calibrated if score.calibrated is not None else reward
        # The light RM's reward decided the route; the hacking defence publishes the better judge's to PPO.
        if outcome.final and score.strong is not None:
            reward, spread, version, scorer = score.strong.reward, 0.0, score.strong.version, common_pb2.SCORER_STRONG
        scored = events_pb2.RewardScored(
            prompt_hash=event.prompt_hash, response_hash=event.response_hash, tier=event.tier,
            policy_version=event.policy_version, rm_version=version, reward=reward, reward_std=spread,
            scorer=scorer, final=outcome.final, escalated=outcome.escalate, sample_index=event.sample_index,
            response_tokens=event.response_tokens, request_id=event.request_id, directions=event.directions,
            unsafe=unsafe, awaiting_annotation=outcome.awaits_annotation,
        )
        scored.generated_at.CopyFrom(event.generated_at)
        scored.scored_at.GetCurrentTime()
        futures = [self._publisher.publish(topics.REWARDS_SCORED, scored)]
        REWARDS.labels(tier=str(tier), scorer=common_pb2.Scorer.Name(scorer)).observe(reward)
        if outcome.final:
            futures.append(self._publisher.publish(topics.ROLLOUT_LOG, events_pb2.RolloutLogRecord(
                prompt_hash=event.prompt_hash, response_hash=event.response_hash, reward=reward)))
        key = escalation_key(event)
        escalates = outcome.escalate and key not in escalated
        if escalates:
            futures.append(self._publisher.publish(topics.PROMPTS_LEVEL2, escalation_event(event, outcome.reason)))
        if outcome.annotate:
            request = events_pb2.AnnotationRequested(
                prompt_hash=event.prompt_hash, response_hash=event.response_hash, tier=event.tier,
                policy_version=event.policy_version, rm_version=score.version if tier == 1 else version,
                model_reward=light_reward if tier == 1 else reward, reason=outcome.reason,
                provisional=scored,
            )
            request.requested_at.GetCurrentTime()
            futures.append(self._publisher.publish(topics.ANNOTATIONS_REQUESTED, request))
        log.info("reward tier=%d prompt=%s response=%s reward=%.3f calibrated=%s rm=%s final=%s escalate=%s unsafe=%s",
                 tier, event.prompt_hash[:12], event.response_hash[:12], reward,
                 None if score.calibrated is None else round(score.calibrated, 3), version, outcome.final,
                 outcome.escalate, unsafe)
        return _Emitted(futures, outcome.final, outcome.annotate, outcome.escalate, key if escalates else None,
                        threshold, calibrated is not None)
