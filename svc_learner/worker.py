"""Kafka side of the learner: final rewards in, policy-updated events out, rollouts tailed for sync.

Three pieces, each thin around :class:`~svc_learner.core.LearnerEngine`:

* :class:`RewardIntake` — batch handler of ``strata.rewards.scored`` (consumer group ``svc-learner``):
  keeps final rewards of generated rollouts of the trained tiers, fetches the prompt text and the
  response token ids from the content store (a Level-2 sample's under the Level-2 generator's
  tokenizer id), re-tokenizes the generator's prompt context, offers the sample to the engine
  marked with the model that wrote it;
* :class:`UpdateLoop` — when a batch is full: PPO update, checkpoint, ``PolicyUpdated`` published
  with ``publish_and_wait`` (path + checksum, never tensors), applied sample ids marked in Redis;
* :class:`RolloutTail` — reads ``strata.rollouts.generated`` from "now" without a group and times
  publish -> first Level-1 rollout stamped with the new version (weight-sync seconds).

Offsets: the bus worker commits an event once the intake returns, i.e. once the sample is *pending*
in memory, not yet learned. What is learned is recorded in the checkpoint (``AppliedBatches``: per
partition, the first offset not yet applied). A learner that stops with pending samples therefore
loses nothing: at start, :func:`recover_pending` re-reads each partition from the checkpoint's
offset up to the group's committed offset and offers those events again (refusing whatever the
checkpoint already holds). Kafka offsets cover redelivery of the same record; the sample identity
(prompt hash, response hash, request id, sample index), remembered in memory and, once checkpointed,
in Redis, covers the same sample published twice.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis

from strata.audit import defence_kl_scale
from strata.bus import Delivery, Publisher, Topic, TransientError, topics
from strata.bus.admin import resume_offsets
from strata.bus.tail import TailReader, read_ranges
from strata.content_store import ContentNotFoundError, ContentStore
from strata.contract.identity import sample_identity
from strata.contract.tiers import TIER_NUMBER
from strata.v1 import common_pb2, events_pb2
from svc_learner import metrics
from svc_learner.config import LearnerSettings
from svc_learner.core import LEVEL2, LearnerEngine, NewCheckpoint, Outcome, Sample, Source, UpdateResult

log = logging.getLogger(__name__)

POLICY_TIER = 1  # the tier the policy generates; another tier's rollouts come from another model


@dataclass(frozen=True)
class LearnerTopics:
    """The topics the learner reads and writes (tests and benches pass fresh ones)."""

    rewards: Topic[events_pb2.RewardScored] = topics.REWARDS_SCORED
    policy: Topic[events_pb2.PolicyUpdated] = topics.POLICY_UPDATED
    rollouts: Topic[events_pb2.RolloutGenerated] = topics.ROLLOUTS_GENERATED


def sample_key(event: events_pb2.RewardScored) -> str:
    """Identity of one sample, whatever offset it arrives at."""
    return sample_identity(event.prompt_hash, event.response_hash, event.request_id, event.sample_index)


def skip_reason(event: events_pb2.RewardScored, trained_tiers: frozenset[int],
                train_on_escalated: bool = True) -> Outcome | None:
    """Why a reward event gives no gradient, or None when it is a candidate sample.

    An escalated Level-1 sample is still the policy's own sample with a light-RM reward: training
    only on finals would keep just the samples above the escalation threshold and hide from PPO
    exactly the answers it should move away from.
    """
    if event.scorer == common_pb2.SCORER_REUSED or not event.response_hash:
        return Outcome.REUSED  # a skipped prompt: neighbours' reward, no response was generated
    if not math.isfinite(event.reward):
        return Outcome.UNUSABLE  # one NaN would make the whole update NaN
    if not event.final and not (train_on_escalated and event.escalated):
        return Outcome.NOT_FINAL
    if TIER_NUMBER.get(event.tier) not in trained_tiers:
        return Outcome.OTHER_TIER
    return None


class AppliedMarks:
    """Sample ids already inside a checkpoint, in Redis, so duplicates are refused across restarts."""

    def __init__(self, client: redis.Redis, lineage: str, ttl_s: int) -> None:
        self._redis = client
        self._prefix = f"strata:learner:applied:{lineage}:"
        self._ttl_s = ttl_s

    def _key(self, sample: str) -> str:
        return self._prefix + hashlib.sha256(sample.encode()).hexdigest()[:32]

    def which(self, samples: Sequence[str]) -> set[str]:
        if not samples:
            return set()
        with self._redis.pipeline(transaction=False) as pipe:
            for sample in samples:
                pipe.exists(self._key(sample))
            found = pipe.execute()
        return {sample for sample, hit in zip(samples, found, strict=True) if hit}

    def mark(self, samples: Sequence[str]) -> None:
        if not samples:
            return
        with self._redis.pipeline(transaction=False) as pipe:
            for sample in samples:
                pipe.set(self._key(sample), b"1", ex=self._ttl_s)
            pipe.execute()


LINEAGE_FILE = "LINEAGE"


def lineage_of(settings: LearnerSettings) -> str:
    """One learner lineage = one checkpoint directory's life: its dedupe marks do not leak into another,
    and generators know that versions restarted (``PolicyUpdated.lineage``). A directory deleted and
    recreated is a new lineage."""
    directory = settings.checkpoint_dir
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LINEAGE_FILE
    if not path.exists():
        return new_lineage(settings)
    return path.read_text().strip()


def new_lineage(settings: LearnerSettings) -> str:
    """Start a new lineage in the checkpoint directory (its versions restart for the generators)."""
    lineage = uuid.uuid4().hex[:16]
    (settings.checkpoint_dir / LINEAGE_FILE).write_text(lineage + "\n")
    return lineage


def behaviour_of(event: events_pb2.RewardScored) -> str:
    """``Sample.behaviour``: "" for the policy's own tier, LEVEL2 for the Level-2 generator's samples."""
    return LEVEL2 if TIER_NUMBER.get(event.tier) == 2 else ""


class RewardIntake:
    """The batch handler of the rewards topic."""

    def __init__(self, settings: LearnerSettings, engine: LearnerEngine, store: ContentStore, client: redis.Redis,
                 marks: AppliedMarks, tokenizer_id: str, level2_tokenizer_id: str | None = None) -> None:  # fmt: skip
        """``level2_tokenizer_id``: the key of the Level-2 generator's token ids (None: Level 2 does not train)."""
        self._settings = settings
        self._engine = engine
        self._store = store
        self._redis = client
        self._marks = marks
        self._tokenizer_id = tokenizer_id
        self._level2_tokenizer_id = level2_tokenizer_id
        # The engine's tiers: train_tiers, less Level 2 when it has no usable Level-2 model.
        self._tiers = engine.trained_tiers if level2_tokenizer_id is not None else engine.trained_tiers - {2}

    def handle_batch(self, deliveries: list[Delivery[events_pb2.RewardScored]]) -> None:
        pending = self._engine.pending_count()
        if pending >= self._settings.max_pending_samples:
            # Backpressure: the bus pauses the partitions and retries later; nothing is lost or dead-lettered.
            raise TransientError(f"learner busy: {pending} samples wait for an update")
        escalated_too = self._settings.train_on_escalated
        candidates = [sample_key(d.message) for d in deliveries
                      if skip_reason(d.message, self._tiers, escalated_too) is None]
        marked = self._marks.which(candidates)
        for delivery in deliveries:
            event = delivery.message
            source = Source(delivery.topic.name, delivery.partition, delivery.offset)
            key = sample_key(event)
            behaviour = behaviour_of(event)
            refusal = (skip_reason(event, self._tiers, escalated_too)
                       or self._engine.classify(key, event.policy_version, source, behaviour))
            if refusal is None and key in marked:
                refusal = Outcome.DUPLICATE  # learned in an earlier run, arriving again at a new offset
            if refusal is not None:
                self._engine.discard(source, refusal)
                continue
            try:
                prompt_ids, response_ids = self._tokens(event)
            except ContentNotFoundError as exc:
                log.warning("reward for prompt %s: %s; dropped", event.prompt_hash[:12], exc)
                self._engine.discard(source, Outcome.MISSING)
                continue
            except ValueError as exc:  # e.g. a direction the template does not know
                log.warning("reward for prompt %s: unusable rollout context: %s", event.prompt_hash[:12], exc)
                self._engine.discard(source, Outcome.UNUSABLE)
                continue
            sample = Sample(key, source, prompt_ids, response_ids, event.reward, event.policy_version, behaviour)
            outcome = self._engine.offer(sample)
            log.debug("reward prompt=%s response=%s v%d: %s", event.prompt_hash[:12], event.response_hash[:12],
                      event.policy_version, outcome.value)  # fmt: skip

    def _tokens(self, event: events_pb2.RewardScored) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Prompt context and response as token ids, exactly as the generator saw and wrote them.

        The response ids are read under the key of the generator that wrote them (the Level-2 model
        has the policy's vocabulary, checked at start, but its generator may name it otherwise); the
        prompt is re-rendered and re-tokenized with the policy's prompt format (its chat template when
        it has one), the text a Level-1 generator of this policy fed.
        """
        tokenizer_id = self._level2_tokenizer_id if behaviour_of(event) == LEVEL2 else self._tokenizer_id
        assert tokenizer_id is not None  # skip_reason refuses Level-2 samples without one
        response_ids = self._store.get_tokens(event.response_hash, tokenizer_id)
        prompt = self._store.get_text(event.prompt_hash)
        directions = self._directions(event)
        prompt_ids = self._engine.prompt_format.prompt_ids(prompt, directions)
        return tuple(prompt_ids), tuple(response_ids)

    @staticmethod
    def _directions(event: events_pb2.RewardScored) -> tuple[str, ...]:
        """The directions the generator conditioned on (carried from the rollout by svc_reward)."""
        return tuple(d.name for d in event.directions)


class KlBrake:
    """The hacking defence's KL brake (svc_reward/defence.py), read from Redis before each update; when Redis
    does not answer, the last scale read stays (a warning once, not per update)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._scale = 1.0
        self._failing = False

    def read(self) -> float:
        try:
            scale = defence_kl_scale(self._redis)
        except redis.RedisError as exc:
            if not self._failing:
                log.warning("could not read the hacking defence's KL brake (%s): x%g stays", exc, self._scale)
            self._failing = True
            return self._scale
        if scale != self._scale:
            log.warning("hacking defence: KL coefficient x%g -> x%g", self._scale, scale)
        self._scale, self._failing = scale, False
        return scale


class UpdateLoop:
    """Runs updates when a batch is full and announces each new policy version."""

    def __init__(self, engine: LearnerEngine, publisher: Publisher, marks: AppliedMarks,
                 topic: Topic[events_pb2.PolicyUpdated] = topics.POLICY_UPDATED,
                 lineage: str = "", kl_brake: KlBrake | None = None) -> None:
        self._lineage = lineage
        self._kl_brake = kl_brake
        self._engine = engine
        self._publisher = publisher
        self._marks = marks
        self._topic = topic
        self._publish_lock = threading.Lock()  # versions go out in order (update loop vs Checkpoint RPC)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self._engine.wait_ready(0.5):
                self.step()

    def step(self) -> UpdateResult | None:
        """One update if a batch is full (None otherwise); publishes the checkpoint it produced."""
        started = time.perf_counter()
        if self._kl_brake is not None:
            self._engine.kl_scale = self._kl_brake.read()
        result = self._engine.update()
        if result is None:
            return None
        metrics.UPDATE_SECONDS.observe(result.metrics.get("perf/update_seconds", time.perf_counter() - started))
        if result.checkpoint is not None:
            self.announce(result.checkpoint)
        return result

    def announce_on_start(self, newest: events_pb2.PolicyUpdated | None) -> events_pb2.PolicyUpdated | None:
        """Announce the current checkpoint when the topic's newest announcement is not it.

        Generators stamp samples with the version they serve. If that is another lineage's (the
        checkpoint directory was wiped or replaced) or a version this learner has not announced (it
        stopped between writing a checkpoint and publishing it), every sample they write would be
        refused as ``future`` or never catch up, and no update would ever come to fix it.
        """
        if newest is None:
            return None  # a fresh topic: generators start from the initial policy, which is v0
        if newest.lineage == self._lineage and newest.policy_version == self._engine.version:
            return None
        log.warning("the newest policy announcement is v%d of lineage %s, this learner holds v%d of lineage %s: "
                    "announcing it", newest.policy_version, newest.lineage or "-", self._engine.version,
                    self._lineage or "-")
        return self.checkpoint_now()

    def checkpoint_now(self) -> events_pb2.PolicyUpdated:
        """``Learner.Checkpoint``: write the current weights if they changed, and (re)publish them."""
        new, info = self._engine.checkpoint_now()
        if new is not None:
            return self.announce(new)
        return self._publish(info.version, info.step, str(info.path), info.checksum, info.metrics, new_version=False)

    def announce(self, checkpoint: NewCheckpoint) -> events_pb2.PolicyUpdated:
        info = checkpoint.info
        event = self._publish(info.version, info.step, str(info.path), info.checksum, info.metrics, new_version=True)
        # After the checkpoint is durable: a duplicate of these samples is refused even after a restart.
        self._marks.mark(checkpoint.applied_keys)
        return event

    def _publish(self, version: int, step: int, path: str, checksum: str, update_metrics: Mapping[str, float],
                 new_version: bool) -> events_pb2.PolicyUpdated:  # fmt: skip
        started = time.perf_counter()
        event = events_pb2.PolicyUpdated(policy_version=version, step=step, checkpoint_path=path, checksum=checksum,
                                         metrics=dict(update_metrics), lineage=self._lineage)
        event.published_at.GetCurrentTime()
        with self._publish_lock:
            if new_version:  # a re-publish of a known version is not a weight sync to time
                self._engine.sync.published(version, time.monotonic())
            self._publisher.publish_and_wait(self._topic, event)
        metrics.CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
        log.info("published policy v%d (step %d) %s", version, step, path)
        return event


class RolloutTail:
    """Weight-sync timing: the first Level-1 rollout stamped with each new version.

    Only the policy's own tier counts: a Level-2 rollout's version stamp is the Level-2 generator's.
    """

    def __init__(self, settings: LearnerSettings, engine: LearnerEngine,
                 topic: Topic[events_pb2.RolloutGenerated] = topics.ROLLOUTS_GENERATED) -> None:  # fmt: skip
        self._settings = settings
        self._engine = engine
        self._topic = topic
        self._reader: TailReader | None = None

    def connect(self) -> None:
        """Every partition at its end now: only rollouts produced from here on count."""
        self._reader = TailReader(self._settings, [self._topic], client_id="svc-learner-rollout-tail")
        self._reader.seek_to_end()

    def poll_once(self, timeout_s: float = 0.2) -> int:
        if self._reader is None:
            self.connect()
        assert self._reader is not None
        events = self._reader.poll(timeout_s)
        arrived = time.monotonic()
        for _topic, rollout in events:
            if TIER_NUMBER.get(rollout.tier) != POLICY_TIER:
                continue
            for version, seconds in self._engine.sync.observed(rollout.policy_version, arrived):
                metrics.SYNC_SECONDS.observe(seconds)
                log.info("weight sync: first rollout on policy v%d %.2f s after publish", version, seconds)
        return len(events)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.poll_once(0.2)
        finally:
            self.close()

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


# -- offsets at start ------------------------------------------------------------------------------


def recover_pending(settings: LearnerSettings, topic: Topic[events_pb2.RewardScored], intake: RewardIntake,
                    engine: LearnerEngine, loop: UpdateLoop, timeout_s: float = 60.0) -> int:  # fmt: skip
    """Re-offer events committed by a previous run but not inside the checkpoint; returns how many.

    For each partition: from the checkpoint's first unapplied offset up to the group's committed
    offset. Batches that fill up on the way are learned at once (``loop.step``).
    """
    applied = engine.applied()
    committed = resume_offsets(settings, settings.group_id, topic)
    ranges = {
        p: (applied.offsets[f"{topic.name}:{p}"], end)
        for p, end in committed.items()
        if f"{topic.name}:{p}" in applied.offsets and applied.offsets[f"{topic.name}:{p}"] < end
    }
    recovered = 0
    for deliveries in read_ranges(settings, topic, ranges, "svc-learner-recover", timeout_s):
        for start in range(0, len(deliveries), settings.batch_size):
            intake.handle_batch(deliveries[start : start + settings.batch_size])
            recovered += len(deliveries[start : start + settings.batch_size])
            while loop.step() is not None:
                pass
    if recovered:
        log.info("recovered %d events of %s committed before the last checkpoint", recovered, topic.name)
    return recovered
