"""The scheduler's Kafka side: reward statistics (one shared group) and replica index sync (every replica).

**Statistics** (group ``svc-scheduler-stats``, shared by all replicas so each event updates Redis
once; redeliveries are harmless because updates are idempotent by (prompt, response, RM version)):

- ``strata.rewards.scored``: every reward from a real scorer folds into the prompt's statistics
  (``svc_scheduler/stats.py``: Level-1 and Level-2, final or escalated, light and strong RM on one
  scale, aged by version), and into its audit when the request was an audited skip; reused rewards
  (``SCORER_REUSED``, published by the scheduler for its own skips) never do — they would feed the
  statistics with their own echo. An unsafe flag is recorded and sticky (R12). A variance over the
  threshold marks the neighbourhood high-uncertainty (R11). Every reward also advances the newest
  policy version seen.
- ``strata.annotations.completed``: a person's score of a Level-1 answer (not a gold item) adds a label to
  the prompt's Level-1 record, bad under ``record_bad_below``: how Level-1 fared there, passed on with the
  prompts routed near it (idempotent by (prompt, response, annotator)).
- ``strata.policy.updated`` / ``strata.rm.updated``: the current policy and reward-model versions
  that reused statistics must match (R12).

**Index sync** (every replica, no group): ``strata.scheduler.indexed`` announces a prompt another
replica indexed; this replica reads its embedding from Redis and adds it. The reader is positioned
at the end *before* the index is rebuilt from Redis, so nothing announced in between is missed
(adding is idempotent).
"""

from __future__ import annotations

import logging
import math
import threading

from strata.bus import Delivery, PoisonMessageError, topics
from strata.bus.tail import TailReader
from strata.contract.checksums import recorded_policy_version
from strata.contract.control import ControlEventError, ControlEventUnavailable, check_policy_update
from strata.v1 import common_pb2, events_pb2
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.engine import SchedulerEngine
from svc_scheduler.stats import LabelObservation, RewardObservation
from svc_scheduler.store import SchedulerStore

log = logging.getLogger(__name__)


SCORERS = {common_pb2.SCORER_LIGHT: "light", common_pb2.SCORER_STRONG: "strong", common_pb2.SCORER_HUMAN: "human"}


def observation(message: events_pb2.RewardScored) -> RewardObservation:
    scored_at = message.scored_at.ToNanoseconds() / 1e9 if message.HasField("scored_at") else 0.0
    scorer = SCORERS.get(message.scorer, "light")
    # The light RM's verdict on a Level-1 answer: the neighbourhood's record of Level-1 failures.
    judged = message.tier == common_pb2.TIER_LEVEL_1 and scorer == "light"
    return RewardObservation(message.reward, message.policy_version, message.rm_version, scored_at, message.unsafe,
                             scorer, message.escalated if judged else None)


class StatsUpdater:
    """Handlers of the statistics worker (thin: decode has been done, the rules are in ``stats``)."""

    def __init__(self, store: SchedulerStore, settings: SchedulerSettings) -> None:
        self.store = store
        self.settings = settings

    def handlers(self) -> dict:
        return {
            topics.REWARDS_SCORED: self.on_reward,
            topics.POLICY_UPDATED: self.on_policy,
            topics.RM_UPDATED: self.on_rm,
            topics.ANNOTATIONS_COMPLETED: self.on_label,
        }

    def on_reward(self, delivery: Delivery[events_pb2.RewardScored]) -> None:
        self.apply(delivery.message)

    def apply(self, message: events_pb2.RewardScored) -> bool:
        """Fold one reward event into Redis; True when it changed the statistics."""
        if message.scorer == common_pb2.SCORER_REUSED:
            return False
        if message.awaiting_annotation:  # provisional: svc_annotation publishes this sample's final reward
            return False
        if not math.isfinite(message.reward):  # one NaN would make the prompt's mean, and every reuse, NaN
            raise PoisonMessageError(f"reward {message.reward} for prompt {message.prompt_hash[:12]} is not a number")
        obs = observation(message)
        if message.policy_version:
            self.store.update_versions(policy_version=message.policy_version)
        update = self.store.apply_reward(
            message.prompt_hash, message.response_hash, obs, now=obs.scored_at, request_id=message.request_id
        )
        if update.newly_marked:
            log.info("prompt %s marked high-uncertainty (variance %.3f over %d rewards)",
                     message.prompt_hash[:12], update.stats.variance if update.stats else float("nan"),
                     update.stats.count if update.stats else 0)
        return update.applied

    def on_label(self, delivery: Delivery[events_pb2.AnnotationCompleted]) -> None:
        self.apply_label(delivery.message)

    def apply_label(self, message: events_pb2.AnnotationCompleted) -> bool:
        """Add a person's score of a Level-1 answer to its prompt's record; True when it changed the statistics.
        Gold items (drift checks, not rollouts) and other tiers' answers are not Level-1's record."""
        if message.gold or message.tier != common_pb2.TIER_LEVEL_1:
            return False
        if not math.isfinite(message.score):
            raise PoisonMessageError(f"label {message.score} for prompt {message.prompt_hash[:12]} is not a number")
        at = message.completed_at.ToNanoseconds() / 1e9 if message.HasField("completed_at") else 0.0
        obs = LabelObservation(message.score < self.settings.record_bad_below, message.policy_version, at)
        return self.store.apply_label(message.prompt_hash, message.response_hash, message.annotator_id, obs)

    def on_policy(self, delivery: Delivery[events_pb2.PolicyUpdated]) -> None:
        """Age the statistics by a new policy version, once its checkpoint is checked as a generator
        checks it: versions only move forward, so one forged 2^62 would age every prompt for good."""
        event = delivery.message
        try:
            check_policy_update(event.policy_version, event.checkpoint_path, event.checksum,
                                self.settings.policy_checkpoint_root, recorded_policy_version)
        except ControlEventError as exc:
            raise PoisonMessageError(f"policy update v{event.policy_version} refused: {exc}") from exc
        except ControlEventUnavailable as exc:  # no access to the checkpoints here: rewards carry versions too
            log.warning("policy update v%d not taken as the newest: %s", event.policy_version, exc)
            return
        self.store.update_versions(policy_version=event.policy_version)

    def on_rm(self, delivery: Delivery[events_pb2.RewardModelUpdated]) -> None:
        message = delivery.message
        at = message.published_at.ToNanoseconds() / 1e9 if message.HasField("published_at") else 0.0
        self.store.update_versions(rm_version=message.rm_version, at=at or delivery.timestamp_ms / 1000)
        log.info("reward model %s is current: statistics of other RM versions are no longer reused",
                 message.rm_version)


class IndexSync:
    """Loop adding prompts indexed by other replicas (a ``ServiceParts`` loop)."""

    def __init__(self, settings: SchedulerSettings, engine: SchedulerEngine, client_id: str) -> None:
        self.engine = engine
        self._reader = TailReader(settings, [topics.PROMPTS_INDEXED], client_id)
        self._reader.seek_to_end()  # before the engine rebuilds from Redis (see module docstring)

    def poll_once(self, timeout_s: float = 0.5) -> int:
        hashes = [message.prompt_hash for _topic, message in self._reader.poll(timeout_s)]
        try:
            return self.engine.add_indexed(hashes)
        except ConnectionError as exc:  # Redis down: the hashes stay pending and are retried
            log.warning("index sync: %d prompts pending, Redis unavailable: %s", len(hashes), exc)
            return 0

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.poll_once()
        finally:
            self._reader.close()
