"""Wiring of the learner service: engine, reward intake, update loop, rollout tail, gRPC.

``build_learner`` returns every piece (tests and benches drive them directly: ``worker.poll_once``,
``loop.step``, ``tail.poll_once``); ``Learner.parts()`` hands them to ``strata.service`` to run.

Start-up order: (1) resume from the latest checkpoint or write ``v0`` from the initial policy;
(2) re-offer rewards committed but not yet learned (``recover_pending``); (3) start the consumer
group, the update loop, the rollout tail and the gRPC server. On a fresh policy topic nothing is
published until an update produces a new version (generators and learner agree on ``v0``, the
initial policy); when the topic's newest announcement is not this learner's current checkpoint (a
wiped checkpoint directory, a crash between checkpoint and publish), it is announced at start
(``UpdateLoop.announce_on_start``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import redis

from strata import redis_client
from strata.bus import Publisher, Worker
from strata.bus.admin import resume_offsets
from strata.bus.follow import newest_event
from strata.content_store import ContentStore
from strata.contract.models import ModelNotConfiguredError, model_path
from strata.models.tokens import tokenizer_id as shared_tokenizer_id
from strata.rpc import ServiceBinding
from strata.service import ServiceParts
from strata.v1 import learner_pb2, learner_pb2_grpc
from svc_learner import metrics
from svc_learner.config import LearnerSettings
from svc_learner.core import LearnerEngine
from svc_learner.servicer import LearnerServicer
from svc_learner.worker import (
    AppliedMarks,
    KlBrake,
    LearnerTopics,
    RewardIntake,
    RolloutTail,
    UpdateLoop,
    lineage_of,
    new_lineage,
    recover_pending,
)

log = logging.getLogger(__name__)


class LearnerSetupError(ValueError):
    """The learner cannot start; the message says what to set."""


def initial_policy_path(settings: LearnerSettings) -> Path:
    """``policy_model_path``, else the built zoo's Level-1 model (the generators' initial policy)."""
    try:
        return Path(model_path("level1", settings.policy_model_path, settings.cache_dir, settings.zoo_preset,
                               "--policy-model-path (STRATA_POLICY_MODEL_PATH), the model the Level-1 generator "
                               "starts from,"))
    except ModelNotConfiguredError as exc:
        raise LearnerSetupError(str(exc)) from exc


def level2_behaviour_path(settings: LearnerSettings) -> Path | None:
    """``level2_model_path``, else the built zoo's Level-2 model; None (with a warning) when there is none.

    Only looked up when ``train_tiers`` has 2. Unlike the policy, a missing Level-2 model does not stop
    the learner: it trains on Level-1 samples only (the engine says so at start).
    """
    if 2 not in settings.trained_tiers:
        return None
    try:
        return Path(model_path("level2", settings.level2_model_path, settings.cache_dir, settings.zoo_preset,
                               "--level2-model-path (STRATA_LEVEL2_MODEL_PATH), the model the Level-2 generator "
                               "samples from,"))
    except ModelNotConfiguredError as exc:
        log.warning("%s", exc)
        return None


@dataclass
class Learner:
    settings: LearnerSettings
    topics: LearnerTopics
    engine: LearnerEngine
    intake: RewardIntake
    loop: UpdateLoop
    tail: RolloutTail | None
    worker: Worker
    servicer: LearnerServicer
    publisher: Publisher
    client: redis.Redis
    tokenizer_id: str
    level2_tokenizer_id: str | None  # None: Level-2 samples do not train the policy

    def parts(self) -> ServiceParts:
        binding = ServiceBinding(learner_pb2_grpc.add_LearnerServicer_to_server, self.servicer,
                                 learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name)  # fmt: skip
        loops = [self.loop.run] + ([self.tail.run] if self.tail is not None else [])
        return ServiceParts("svc_learner", self.settings, [binding], self.settings.grpc_port, workers=[self.worker],
                            loops=loops, on_stop=[self.close])  # fmt: skip

    def close(self) -> None:
        """Release clients (the worker and the tail close themselves when their loops stop)."""
        self.worker.close()
        if self.tail is not None:
            self.tail.close()
        self.publisher.close()
        self.client.close()


def build_learner(settings: LearnerSettings, learner_topics: LearnerTopics | None = None,
                  recover: bool = True) -> Learner:  # fmt: skip
    """Load or create the policy, recover pending rewards, and wire every piece (nothing runs yet)."""
    learner_topics = learner_topics or LearnerTopics()
    model_dir = initial_policy_path(settings)
    offsets = resume_offsets(settings, settings.group_id, learner_topics.rewards)
    engine = LearnerEngine.start(
        settings, model_dir,
        initial_offsets={(learner_topics.rewards.name, p): offset for p, offset in offsets.items()},
        extra_config={"initial_policy": str(model_dir)},
        level2_model_path=level2_behaviour_path(settings),
    )  # fmt: skip
    tokenizer_id = settings.tokenizer_id or shared_tokenizer_id(engine.tokenizer)
    level2_tokenizer_id = None
    if engine.level2_tokenizer is not None:  # derived as the Level-2 generator's HF backend derives it
        level2_tokenizer_id = settings.level2_tokenizer_id or shared_tokenizer_id(engine.level2_tokenizer)
    client = redis_client.connect(settings.redis_address, socket_timeout=10)
    store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    publisher = Publisher(settings, client_id="svc-learner")
    lineage = lineage_of(settings)
    announced = newest_event(settings, learner_topics.policy)
    if announced is not None and announced.lineage == lineage and announced.policy_version > engine.version:
        # Checkpoints lost from under a lineage (restored from an older backup): its next versions
        # would repeat numbers the generators have already served, so it goes on as a new lineage.
        log.warning("policy v%d of this lineage was announced but the newest checkpoint is v%d: new lineage",
                    announced.policy_version, engine.version)
        lineage = new_lineage(settings)
    marks = AppliedMarks(client, lineage, settings.dedupe_ttl_s)
    intake = RewardIntake(settings, engine, store, client, marks, tokenizer_id, level2_tokenizer_id)
    loop = UpdateLoop(engine, publisher, marks, learner_topics.policy, lineage,
                      KlBrake(client) if settings.follow_kl_brake else None)
    loop.announce_on_start(announced)
    if recover:
        recover_pending(settings, learner_topics.rewards, intake, engine, loop)
    worker = Worker(settings, settings.group_id, publisher=publisher,
                    batch_handlers={learner_topics.rewards: intake.handle_batch})  # fmt: skip
    tail = RolloutTail(settings, engine, learner_topics.rollouts) if settings.measure_sync else None
    servicer = LearnerServicer(engine.status, loop.checkpoint_now)
    metrics.expose(engine.status)
    return Learner(settings, learner_topics, engine, intake, loop, tail, worker, servicer, publisher, client,
                   tokenizer_id, level2_tokenizer_id)  # fmt: skip


def build(settings: LearnerSettings) -> ServiceParts:
    return build_learner(settings).parts()
