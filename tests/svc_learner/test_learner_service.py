"""The learner service on the real Kafka and Redis with a tiny GPT-2 built here (no zoo, no downloads).

Reward events are fabricated as the generator and the reward service would write them: prompt text,
response text and token ids in the content store (directions travel on the RewardScored event) in
Redis, a RewardScored event on the rewards topic. Each test has its own topics, consumer group and
checkpoint directory, and drives the worker and the update loop until a condition holds.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from kafka import KafkaConsumer, TopicPartition

from strata.bus import Publisher, Topic
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.contract.template import format_prompt
from strata.models.tiny import build_char_policy
from strata.service import start_service, stop_service
from strata.v1 import common_pb2, events_pb2, learner_pb2, learner_pb2_grpc
from strata_tools.infra.process import free_port
from svc_learner.checkpoint import list_checkpoints, verify_checkpoint
from svc_learner.config import LearnerSettings
from svc_learner.service import Learner, build_learner
from svc_learner.worker import LearnerTopics

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
BATCH = 4


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_policy(tmp_path_factory.mktemp("policy") / "tiny-policy")


@pytest.fixture(scope="module")
def level2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Plays the Level-2 model: the policy's tokenizer, other weights, another directory."""
    return build_char_policy(tmp_path_factory.mktemp("level2") / "tiny-level2", seed=1)


@pytest.fixture
def learner_topics(infra: StrataSettings) -> LearnerTopics:
    run = uuid.uuid4().hex[:10]
    chosen = LearnerTopics(
        rewards=Topic(f"test.{run}.rewards", events_pb2.RewardScored),
        policy=Topic(f"test.{run}.policy", events_pb2.PolicyUpdated, key_field="policy_version"),
        rollouts=Topic(f"test.{run}.rollouts", events_pb2.RolloutGenerated),
    )
    ensure_topics(infra.kafka_address, infra.topic_partitions, topics=[chosen.rewards, chosen.rollouts])
    ensure_topics(infra.kafka_address, 1, topics=[chosen.policy])
    return chosen


@pytest.fixture
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra.kafka_address, client_id="test-learner")
    yield pub
    pub.close()




def learner_settings(infra: StrataSettings, policy_dir: Path, checkpoints: Path, **extra: object) -> LearnerSettings:
    values: dict = dict(
        kafka_bootstrap=infra.kafka_address, redis_url=infra.redis_address, policy_model_path=policy_dir,
        checkpoint_dir=checkpoints, device="cpu", batch_size=BATCH, minibatch_size=BATCH, update_epochs=1,
        learning_rate=1e-3, max_staleness=1, keep_checkpoints=3, grpc_port=0, measure_sync=False,
        group_id=f"test-learner-{uuid.uuid4().hex[:8]}",
        consumer_session_timeout_ms=infra.consumer_session_timeout_ms,
        consumer_heartbeat_interval_ms=infra.consumer_heartbeat_interval_ms,
        retry_backoff_initial_s=infra.retry_backoff_initial_s, retry_backoff_max_s=infra.retry_backoff_max_s,
    )  # fmt: skip
    values.update(extra)
    return LearnerSettings(**values)


@dataclass
class Fabricator:
    """Writes what the generator and the reward service would have written for one sample."""

    store: ContentStore
    client: redis.Redis
    tokenizer_id: str
    encode: Callable[[str], list[int]]
    rng: random.Random
    level2_tokenizer_id: str | None = None  # where the Level-2 generator stores its token ids

    def reward(self, policy_version: int = 0, *, tier: int = common_pb2.TIER_LEVEL_1, final: bool = True,
               scorer: int = common_pb2.SCORER_LIGHT, directions: tuple[str, ...] = ("give_steps",),
               reward: float = 2.5, escalated: bool | None = None) -> events_pb2.RewardScored:  # fmt: skip
        prompt = f"how do i fix the {self.rng.choice(['sink', 'door', 'bike'])} {uuid.uuid4().hex[:6]}"
        response = "".join(self.rng.choice("abcdefgh ") for _ in range(6)).strip() or "ok"
        token_ids = self.encode(response)
        prompt_hash = self.store.put(prompt)
        key = self.level2_tokenizer_id if tier == common_pb2.TIER_LEVEL_2 and self.level2_tokenizer_id else None
        response_hash = self.store.put(response, token_ids, key or self.tokenizer_id)
        request_id = uuid.uuid4().hex
        return events_pb2.RewardScored(
            prompt_hash=prompt_hash, response_hash=response_hash, tier=tier, policy_version=policy_version,
            rm_version="rm-test", reward=reward, scorer=scorer, final=final,
            escalated=(not final) if escalated is None else escalated, sample_index=0,
            response_tokens=len(token_ids), request_id=request_id,
            directions=[common_pb2.Direction(name=d) for d in directions],
        )  # fmt: skip

    def reused(self) -> events_pb2.RewardScored:
        """The scheduler's reused reward for a skipped prompt: no response at all."""
        prompt_hash = self.store.put(f"a skipped prompt {uuid.uuid4().hex[:6]}")
        return events_pb2.RewardScored(prompt_hash=prompt_hash, tier=common_pb2.TIER_LEVEL_1, reward=3.0,
                                       scorer=common_pb2.SCORER_REUSED, final=True)  # fmt: skip


@pytest.fixture
def make_learner(infra: StrataSettings) -> Iterator[Callable[..., Learner]]:
    made: list[Learner] = []

    def make(settings: LearnerSettings, learner_topics: LearnerTopics) -> Learner:
        learner = build_learner(settings, learner_topics)
        learner.worker.connect()
        made.append(learner)
        return learner

    yield make
    for learner in made:
        learner.close()


@pytest.fixture
def fabricate(infra: StrataSettings, redis_client: redis.Redis) -> Callable[[Learner], Fabricator]:
    store = ContentStore(redis_client, 600, infra.content_max_bytes)
    def make(learner: Learner) -> Fabricator:
        encode = learner.engine.tokenizer
        return Fabricator(store, redis_client, learner.tokenizer_id, lambda text: encode(text)["input_ids"],
                          random.Random(0), learner.level2_tokenizer_id)  # fmt: skip

    return make


def publish_all(publisher: Publisher, topic: Topic, events: list) -> None:
    publisher.wait([publisher.publish(topic, event) for event in events])


def drive(learner: Learner, done: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    """Poll the consumer group and run due updates until ``done()``; fail after the timeout."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"condition not reached in time; status {learner.engine.status()}"
        learner.worker.poll_once(0.2)
        learner.loop.step()


def handled(learner: Learner) -> int:
    return sum(learner.engine.status().counts.values())


def read_policy_updates(infra: StrataSettings, topic: Topic, count: int) -> list[events_pb2.PolicyUpdated]:
    consumer = KafkaConsumer(bootstrap_servers=infra.kafka_address, group_id=None, enable_auto_commit=False)
    consumer.assign([TopicPartition(topic.name, 0)])
    consumer.seek_to_beginning()
    events: list[events_pb2.PolicyUpdated] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(events) < count:
            assert time.monotonic() < deadline, f"saw {len(events)} policy updates, expected {count}"
            for records in consumer.poll(timeout_ms=500).values():
                events.extend(events_pb2.PolicyUpdated.FromString(r.value) for r in records)
    finally:
        consumer.close()
    return events


# -- tests ---------------------------------------------------------------------------------------------


def test_a_full_batch_is_learned_checkpointed_and_published(
    infra, policy_dir, tmp_path, learner_topics, publisher, make_learner, fabricate
) -> None:
    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt", measure_sync=True, train_tiers="1")
    learner = make_learner(settings, learner_topics)
    assert learner.tail is not None
    learner.tail.connect()  # weight sync is timed from rollouts published after this
    assert learner.engine.version == 0 and [p.name for p in list_checkpoints(settings.checkpoint_dir)] == ["v0"]
    make = fabricate(learner)
    # A reused reward, a non-final sample that did not escalate, a Level-2 sample (train_tiers=1): no gradient.
    # (An escalated Level-1 sample does train: see skip_reason.)
    ignored = [make.reused(), make.reward(final=False, escalated=False), make.reward(tier=common_pb2.TIER_LEVEL_2)]
    good = [make.reward(directions=("give_code", "summarize")), *(make.reward() for _ in range(BATCH - 1))]
    publish_all(publisher, learner_topics.rewards, ignored + good[:-1])
    drive(learner, lambda: handled(learner) == len(ignored) + BATCH - 1)
    assert learner.engine.version == 0, "no update before the batch is full"
    pending = {s.key.split(":")[1]: s for s in learner.engine.pending()}
    first = pending[good[0].response_hash]
    expected_prompt = format_prompt(make.store.get_text(good[0].prompt_hash), ("give_code", "summarize"))
    assert list(first.prompt_ids) == learner.engine.tokenizer(expected_prompt)["input_ids"]
    assert list(first.response_ids) == make.store.get_tokens(good[0].response_hash, learner.tokenizer_id)

    publish_all(publisher, learner_topics.rewards, good[-1:])
    drive(learner, lambda: learner.engine.version == 1)

    counts = learner.engine.status().counts
    assert counts["accepted"] == BATCH
    assert (counts["skipped_reused"], counts["skipped_not_final"], counts["skipped_tier"]) == (1, 1, 1)
    info = verify_checkpoint(settings.checkpoint_dir / "v1")  # every file matches its recorded sha256
    assert (info.version, info.step) == (1, 1)
    (event,) = read_policy_updates(infra, learner_topics.policy, 1)
    assert (event.policy_version, event.step) == (1, 1)
    assert (event.checkpoint_path, event.checksum) == (str(info.path), info.checksum)
    assert event.metrics["charts/mean_reward"] == pytest.approx(2.5)
    assert {"charts/kl", "charts/clip_epsilon", "charts/kl_coef", "losses/clipfrac", "losses/entropy",
            "losses/value_loss", "losses/approx_kl"} <= set(event.metrics)  # fmt: skip

    # Weight sync: publish -> the first rollout stamped v1 (a v0 rollout does not complete it).
    for version in (0, 1):
        publish_all(publisher, learner_topics.rollouts, [events_pb2.RolloutGenerated(
            prompt_hash=good[0].prompt_hash, tier=common_pb2.TIER_LEVEL_1, policy_version=version)])
    deadline = time.monotonic() + TIMEOUT_S
    while learner.engine.sync.last_version != 1:
        assert time.monotonic() < deadline, "the weight sync was never measured"
        learner.tail.poll_once(0.2)
    assert learner.engine.status().metrics["sync/seconds"] >= 0.0


def test_stale_and_future_samples_are_dropped_and_counted_lagging_ones_corrected(
    infra, policy_dir, tmp_path, learner_topics, publisher, make_learner, fabricate
) -> None:
    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt", max_staleness=1)
    learner = make_learner(settings, learner_topics)
    make = fabricate(learner)
    for version in (0, 1):  # two updates: the learner reaches v2
        publish_all(publisher, learner_topics.rewards, [make.reward(version) for _ in range(BATCH)])
        drive(learner, lambda v=version: learner.engine.version == v + 1)
    stale, future = make.reward(0), make.reward(7)  # lag 2 > max_staleness; a version never written
    lagging = [make.reward(1) for _ in range(2)]  # lag 1: accepted, corrected with checkpoint v1's log-probs
    fresh = [make.reward(2) for _ in range(BATCH - 2)]
    publish_all(publisher, learner_topics.rewards, [stale, future, *lagging, *fresh])
    drive(learner, lambda: learner.engine.version == 3)

    status = learner.engine.status()
    assert (status.counts["dropped_stale"], status.counts["dropped_future"]) == (1, 1)
    assert status.counts["accepted"] == 3 * BATCH
    assert status.metrics["samples/off_policy_fraction"] == pytest.approx(2 / BATCH)
    assert 0.0 < status.metrics["charts/importance_weight"] <= 1.0  # truncated at c̄ = 1
    reply = learner.servicer.Status(learner_pb2.LearnerStatusRequest(), None)  # type: ignore[arg-type]
    assert (reply.policy_version, reply.step, reply.samples_dropped_stale) == (3, 3, 1)


def test_level2_rewards_train_the_policy_weighted_against_the_level2_model(
    infra, policy_dir, level2_dir, tmp_path, learner_topics, publisher, make_learner, fabricate
) -> None:
    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt", level2_model_path=level2_dir,
                                level2_tokenizer_id="custom-level2-key", train_tiers="1,2")  # fmt: skip
    learner = make_learner(settings, learner_topics)
    assert learner.level2_tokenizer_id == "custom-level2-key" != learner.tokenizer_id
    make = fabricate(learner)  # stores Level-2 token ids under the Level-2 key only
    # Final Level-2 rewards, stamped with the Level-2 generator's version: never one of this learner's.
    level2 = [make.reward(9, tier=common_pb2.TIER_LEVEL_2, scorer=common_pb2.SCORER_STRONG) for _ in range(2)]
    publish_all(publisher, learner_topics.rewards, [*level2, *(make.reward() for _ in range(BATCH - 2))])
    drive(learner, lambda: learner.engine.version == 1)

    status = learner.engine.status()
    assert (status.counts["accepted"], status.counts["dropped_future"], status.counts["skipped_tier"]) == (BATCH, 0, 0)
    assert status.metrics["samples/off_policy_fraction"] == pytest.approx(2 / BATCH)
    assert status.metrics["samples/level2_fraction"] == pytest.approx(2 / BATCH)
    assert 0.0 < status.metrics["off_policy/level2_is_weight_mean"] <= 1.0


def test_a_restarted_learner_resumes_recovers_pending_and_never_reapplies(
    infra, policy_dir, tmp_path, learner_topics, publisher, make_learner, fabricate
) -> None:
    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt")
    first = make_learner(settings, learner_topics)
    make = fabricate(first)
    batch = [make.reward() for _ in range(BATCH)]
    extra = [make.reward() for _ in range(2)]
    publish_all(publisher, learner_topics.rewards, batch)
    drive(first, lambda: first.engine.version == 1)
    publish_all(publisher, learner_topics.rewards, extra)
    drive(first, lambda: first.engine.pending_count() == 2)  # committed by the bus, not yet learned
    first.close()

    # Same group: resumes at v1 and re-reads the two committed-but-unlearned rewards.
    second = make_learner(settings, learner_topics)
    assert (second.engine.version, second.engine.step) == (1, 1)
    assert {s.key.split(":")[1] for s in second.engine.pending()} == {e.response_hash for e in extra}
    # The same batch published again (new offsets): refused by sample id, nothing is learned twice.
    publish_all(publisher, learner_topics.rewards, batch)
    drive(second, lambda: second.engine.status().counts["duplicate"] == BATCH)
    second.close()

    # A new group redelivers every offset from the start: the checkpoint's offsets refuse the batch.
    third = make_learner(settings.model_copy(update={"group_id": f"test-learner-{uuid.uuid4().hex[:8]}"}),
                         learner_topics)  # fmt: skip
    drive(third, lambda: handled(third) == 2 * BATCH + 2)
    counts = third.engine.status().counts
    assert counts["already_applied"] == BATCH  # the original offsets of the batch
    assert counts["duplicate"] == BATCH  # its republished copies
    assert counts["accepted"] == 2  # the extra two: still never learned, so still wanted
    assert third.engine.version == 1
    assert [p.name for p in list_checkpoints(settings.checkpoint_dir)] == ["v0", "v1"]


def test_a_wiped_checkpoint_directory_is_announced_and_training_goes_on(
    infra, policy_dir, tmp_path, learner_topics, publisher, make_learner, fabricate
) -> None:
    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt")
    first = make_learner(settings, learner_topics)
    make = fabricate(first)
    publish_all(publisher, learner_topics.rewards, [make.reward() for _ in range(BATCH)])
    drive(first, lambda: first.engine.version == 1)
    first.close()
    old = read_policy_updates(infra, learner_topics.policy, 1)[-1]
    assert old.policy_version == 1

    shutil.rmtree(settings.checkpoint_dir)  # an operator wipes the volume; generators still serve v1
    second = make_learner(settings, learner_topics)
    assert second.engine.version == 0
    announced = read_policy_updates(infra, learner_topics.policy, 2)[-1]
    assert (announced.policy_version, announced.step) == (0, 0)
    assert announced.lineage != old.lineage  # generators reset their version floor and load v0

    # Samples of the old lineage's v1 are refused; those of the announced v0 train again.
    publish_all(publisher, learner_topics.rewards, [make.reward(policy_version=1) for _ in range(2)])
    drive(second, lambda: second.engine.status().counts["dropped_future"] == 2)
    publish_all(publisher, learner_topics.rewards, [make.reward(policy_version=0) for _ in range(BATCH)])
    drive(second, lambda: second.engine.version == 1)
    second.close()

    third = make_learner(settings, learner_topics)  # a plain restart announces nothing new
    assert third.engine.version == 1
    assert len(read_policy_updates(infra, learner_topics.policy, 3)) == 3


def test_checkpoints_restored_from_an_older_backup_start_a_new_lineage(
    infra, policy_dir, tmp_path, learner_topics, publisher, make_learner, fabricate
) -> None:
    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt")
    first = make_learner(settings, learner_topics)
    make = fabricate(first)
    publish_all(publisher, learner_topics.rewards, [make.reward() for _ in range(BATCH)])
    drive(first, lambda: first.engine.version == 1)
    first.close()
    shutil.rmtree(settings.checkpoint_dir / "v1")  # the backup predates v1; LINEAGE survived
    old = read_policy_updates(infra, learner_topics.policy, 1)[-1]

    make_learner(settings, learner_topics)  # re-learns the batch v1 had: its offsets are not in v0
    announced = read_policy_updates(infra, learner_topics.policy, 2)[1]
    assert announced.policy_version == 0
    assert announced.lineage != old.lineage  # v0 of the old lineage would lose to its v1 on the generators


def test_service_answers_status_and_checkpoint_over_grpc(
    infra, policy_dir, tmp_path, learner_topics, publisher, fabricate
) -> None:
    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt")
    learner = build_learner(settings, learner_topics)
    parts = learner.parts()
    running = start_service(parts)
    try:
        make = fabricate(learner)
        publish_all(publisher, learner_topics.rewards, [make.reward() for _ in range(BATCH)])
        (update,) = read_policy_updates(infra, learner_topics.policy, 1)  # the update loop thread did it
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = learner_pb2_grpc.LearnerStub(channel)
            status = stub.Status(learner_pb2.LearnerStatusRequest(), timeout=10)
            assert (status.policy_version, status.step, status.samples_accepted) == (1, 1, BATCH)
            assert status.checkpoint_path == update.checkpoint_path
            assert "charts/mean_reward" in status.metrics
            # No update since v1: Checkpoint re-publishes v1 rather than inventing a version.
            reply = stub.Checkpoint(learner_pb2.CheckpointRequest(), timeout=30)
            assert (reply.policy_version, reply.checkpoint_path, reply.checksum) == (1, update.checkpoint_path,
                                                                                      update.checksum)  # fmt: skip
        assert [e.policy_version for e in read_policy_updates(infra, learner_topics.policy, 2)] == [1, 1]
    finally:
        stop_service(parts, running)


def test_python_m_svc_learner_serves_and_stops_on_sigterm(infra, policy_dir, tmp_path, learner_topics) -> None:
    """Smoke run of the entry point: flags, start-up (v0 written), health + Status, clean SIGTERM."""
    port = free_port()
    env = {**os.environ, "STRATA_KAFKA_BOOTSTRAP": infra.kafka_address, "STRATA_REDIS_URL": infra.redis_address}
    argv = [sys.executable, "-m", "svc_learner", "--policy-model-path", str(policy_dir), "--device", "cpu",
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--grpc-port", str(port), "--batch-size", "4",
            "--minibatch-size", "4", "--group-id", f"test-learner-{uuid.uuid4().hex[:8]}", "--log-level", "WARNING"]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            status = learner_pb2_grpc.LearnerStub(channel).Status(learner_pb2.LearnerStatusRequest(), timeout=10)
            assert (status.policy_version, status.step) == (0, 0)
            assert status.checkpoint_path == str(tmp_path / "ckpt" / "v0")
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=TIMEOUT_S)
        assert process.returncode == 0, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_hacking_defences_kl_brake_scales_the_kl_coefficient_of_the_next_update(
    infra, policy_dir, tmp_path, learner_topics, publisher, make_learner, fabricate, redis_client
) -> None:
    from strata.audit import DEFENCE_KEY

    settings = learner_settings(infra, policy_dir, tmp_path / "ckpt", kl_coef=0.1, kl_warmup_updates=0)
    learner = make_learner(settings, learner_topics)
    make = fabricate(learner)
    redis_client.set(DEFENCE_KEY, '{"share":0.0,"acted_on":9,"redistil_requested":true,"kl_scale":4.0}')
    try:
        publish_all(publisher, learner_topics.rewards, [make.reward() for _ in range(BATCH)])
        drive(learner, lambda: learner.engine.version == 1)
        braked = learner.engine.status().metrics
        redis_client.delete(DEFENCE_KEY)  # the alarm over: the next update runs at kl_coef again
        publish_all(publisher, learner_topics.rewards, [make.reward(1) for _ in range(BATCH)])
        drive(learner, lambda: learner.engine.version == 2)
        released = learner.engine.status().metrics
    finally:
        redis_client.delete(DEFENCE_KEY)
    assert (braked["charts/kl_brake"], braked["charts/kl_coef"]) == (4.0, pytest.approx(0.4))
    assert (released["charts/kl_brake"], released["charts/kl_coef"]) == (1.0, pytest.approx(0.1))


def test_the_kl_brake_keeps_its_last_scale_when_redis_does_not_answer(redis_client) -> None:
    from strata.audit import DEFENCE_KEY
    from svc_learner.worker import KlBrake

    redis_client.set(DEFENCE_KEY, '{"kl_scale":2.0}')
    try:
        assert KlBrake(redis_client).read() == 2.0
        brake = KlBrake(redis_client)
        brake.read()
        brake._redis = redis.Redis(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
        assert brake.read() == 2.0
        redis_client.set(DEFENCE_KEY, "not json")
        assert KlBrake(redis_client).read() == 1.0  # a value not ours brakes nothing
    finally:
        redis_client.delete(DEFENCE_KEY)
