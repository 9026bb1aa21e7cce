"""Hot swap of the light RM (R7) on the real Kafka and Redis: a promotion lands while rollouts are
being scored; none is lost, none is scored twice, and each reward names the RM that produced it.

The two RMs are tiny constant models (``rmutil.constant_rm``): A scores every pair 3.5, B 4.5, so a
reward tells which model computed it, whatever version label it carries.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, TopicPartition

from strata.bus import Delivery, Publisher, Topic, Worker, decode, topics
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.models.loading import load_reward_model
from strata.models.reward import score_responses
from strata.v1 import common_pb2, events_pb2
from strata_tools.rm.registry import RmRegistryAdmin, update_event
from svc_reward.config import RewardSettings
from svc_reward.models import RewardModels, ScoringOptions
from svc_reward.registry import describe
from svc_reward.rm_watch import RmWatcher
from svc_reward.worker import RewardWorker

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


@pytest.fixture
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra.kafka_address, client_id="test-hot-swap")
    yield pub
    pub.close()


@pytest.fixture
def registry(redis_client: redis.Redis) -> RmRegistryAdmin:
    return RmRegistryAdmin(redis_client, prefix=f"test:rm:{uuid.uuid4().hex[:10]}")


def light_models(path: Path) -> RewardModels:
    options = ScoringOptions.of(RewardSettings())
    return RewardModels([str(path)], None, dataclasses.replace(options, device="cpu", dtype="float32", temperature=1.0,
                                                                batch_size=8, max_length=64))


def catch_up(infra: StrataSettings, models: RewardModels, rm_topic: Topic) -> None:
    """A fresh watcher reads the promotions to their end: ``models`` then serve the newest."""
    watcher = RmWatcher(infra.kafka_address, models, topic=rm_topic)
    watcher.connect()
    try:
        assert watcher.catch_up()
    finally:
        watcher.close()


class ScoredReader:
    """Reads strata.rewards.scored from its end at creation, keeping the events of one request id."""

    def __init__(self, infra: StrataSettings, request_id: str) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=infra.kafka_address, enable_auto_commit=False, group_id=None)
        self._partitions = [TopicPartition(topics.REWARDS_SCORED.name, p)
                            for p in sorted(self._consumer.partitions_for_topic(topics.REWARDS_SCORED.name))]
        self._consumer.assign(self._partitions)
        self._consumer.seek_to_end()
        for tp in self._partitions:
            self._consumer.position(tp)  # resolve "end" now, before anything is published
        self._request_id = request_id
        self.events: list[events_pb2.RewardScored] = []

    def poll(self) -> None:
        for records in self._consumer.poll(timeout_ms=50).values():
            for record in records:
                event = decode(topics.REWARDS_SCORED, record.value, record.key)
                if event.request_id == self._request_id:
                    self.events.append(event)

    def drain(self) -> None:
        """Read up to the current end of every partition (so late duplicates would show)."""
        end = self._consumer.end_offsets(self._partitions)
        deadline = time.monotonic() + TIMEOUT_S
        while any(self._consumer.position(tp) < end[tp] for tp in self._partitions):
            assert time.monotonic() < deadline, "could not read rewards.scored to its end"
            self.poll()

    def close(self) -> None:
        self._consumer.close()


def test_promote_during_a_stream_loses_nothing_and_each_reward_names_its_rm(
    infra: StrataSettings, redis_client: redis.Redis, publisher: Publisher, registry: RmRegistryAdmin,
    rm_topic: Topic, make_rm: Callable[..., Path],
) -> None:
    path_a, path_b = make_rm("rm_a", 3.5), make_rm("rm_b", 4.5)
    version_a = registry.register(describe("light", [path_a])).version
    version_b = registry.register(describe("light", [path_b])).version
    expected = {version_a: score_responses(load_reward_model(path_a, "cpu"), ["p"], ["r"])[0],
                version_b: score_responses(load_reward_model(path_b, "cpu"), ["p"], ["r"])[0]}
    assert expected[version_a] == pytest.approx(3.5, abs=0.01) and expected[version_b] == pytest.approx(4.5, abs=0.01)

    # The service's parts, in process: the models, the Kafka worker (small batches), the RM watcher.
    settings = RewardSettings(**{**infra.model_dump(), "consumer_max_poll_records": 4})
    models = light_models(path_a)
    assert models.light_version == version_a
    rollouts = Topic(f"test.rollouts.{uuid.uuid4().hex[:10]}", events_pb2.RolloutGenerated)
    ensure_topics(infra, infra.topic_partitions, topics=[rollouts])
    store = ContentStore(redis_client, settings.content_ttl_s, settings.content_max_bytes)
    handler = RewardWorker(settings, models, store, redis_client, publisher)
    worker = Worker(settings, f"test-hot-swap-{uuid.uuid4().hex[:8]}", publisher=publisher,
                    batch_handlers={rollouts: handler.handle_batch})
    worker.connect()
    watcher = RmWatcher(infra.kafka_address, models, topic=rm_topic)
    watcher.connect()
    assert not watcher.catch_up()  # nothing promoted yet: keep serving A
    request_id = f"hot-swap-{uuid.uuid4().hex[:8]}"
    reader = ScoredReader(infra, request_id)
    stop = threading.Event()
    follower = threading.Thread(target=watcher.run, args=(stop,), name="rm-watch")

    def publish(indices: range) -> None:
        for i in indices:
            prompt = store.put(f"hot swap prompt {request_id} {i}")
            response = store.put(f"a response to prompt {i} of {request_id}")
            event = events_pb2.RolloutGenerated(prompt_hash=prompt, response_hash=response,
                                                tier=common_pb2.TIER_LEVEL_1, sample_index=i, request_id=request_id)
            event.generated_at.GetCurrentTime()
            publisher.publish(rollouts, event)
        publisher.flush()

    def drive_until(done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not done():
            assert time.monotonic() < deadline, f"condition not reached; {len(reader.events)} rewards so far"
            worker.poll_once(0.1)
            reader.poll()

    try:
        # 1. A stream scored by A.
        publish(range(0, 12))
        drive_until(lambda: len(reader.events) >= 12)
        # 2. Promote B while more rollouts stream in; the watcher swaps on its own thread.
        follower.start()
        registry.promote(version_b, publisher, topic=rm_topic)
        publish(range(12, 36))
        drive_until(lambda: len(reader.events) >= 36 and models.light_version == version_b)
        # 3. After the swap, everything is B's.
        publish(range(36, 48))
        drive_until(lambda: len(reader.events) >= 48)
        reader.drain()
    finally:
        stop.set()
        follower.join(timeout=TIMEOUT_S)
        worker.close()
        reader.close()

    by_sample: dict[int, list[events_pb2.RewardScored]] = {}
    for event in reader.events:
        by_sample.setdefault(event.sample_index, []).append(event)
    assert sorted(by_sample) == list(range(48)), "a rollout was never scored"
    assert all(len(v) == 1 for v in by_sample.values()), "a rollout was scored twice"
    for event in reader.events:
        assert event.rm_version in expected
        assert event.reward == pytest.approx(expected[event.rm_version], abs=1e-4), "version does not match the RM"
    versions = [by_sample[i][0].rm_version for i in range(48)]
    assert set(versions[:12]) == {version_a}
    assert set(versions[36:]) == {version_b}
    assert watcher.swaps == 1 and watcher.rejected == 0


def test_on_start_the_newest_promotion_wins_and_bad_updates_are_refused(
    infra: StrataSettings, publisher: Publisher, registry: RmRegistryAdmin, rm_topic: Topic,
    make_rm: Callable[..., Path],
) -> None:
    path_a, path_b = make_rm("rm_a", 3.5), make_rm("rm_b", 4.5)
    version_a = registry.register(describe("light", [path_a])).version
    version_b = registry.register(describe("light", [path_b])).version
    registry.promote(version_b, publisher, topic=rm_topic)
    registry.promote(version_a, publisher, topic=rm_topic)  # a rollback: promoted last, so it wins
    registry.promote(version_b, publisher, topic=rm_topic)
    registry.promote(version_a, publisher, topic=rm_topic)

    models = light_models(path_b)
    watcher = RmWatcher(infra.kafka_address, models, topic=rm_topic)
    watcher.connect()
    try:
        assert watcher.catch_up()
        assert models.light_version == version_a and watcher.swaps == 1  # only the newest was loaded
        assert models.score(["p"], ["r"]).rewards[0] == pytest.approx(3.5, abs=0.01)

        # An update whose files do not match its checksum is refused; A keeps serving.
        forged = update_event(describe("light", [path_b]))
        forged.checksum = "0" * 64
        # An update pointing at a directory that is gone is refused too.
        missing = update_event(describe("light", [path_b]))
        missing.rm_version, missing.path, missing.ensemble_paths[:] = "light-gone", "/nonexistent", ["/nonexistent"]
        for rejected, event in enumerate((forged, missing), start=1):
            publisher.publish_and_wait(rm_topic, event)
            deadline = time.monotonic() + TIMEOUT_S
            while watcher.rejected < rejected:
                assert time.monotonic() < deadline, f"update {event.rm_version} was not seen"
                watcher.poll_once(0.2)
        assert models.light_version == version_a and watcher.swaps == 1
    finally:
        watcher.close()


def test_an_ensemble_version_swaps_in_as_one(
    infra: StrataSettings, publisher: Publisher, registry: RmRegistryAdmin, rm_topic: Topic,
    make_rm: Callable[..., Path],
) -> None:
    # `strata rm distill --members 3` registers one version covering every member (R8).
    members = [make_rm("m0", 3.0), make_rm("m1", 3.5), make_rm("m2", 4.5)]
    ensemble = registry.register(describe("light", members)).version
    registry.promote(ensemble, publisher, topic=rm_topic)
    models = light_models(make_rm("single", 1.0))
    catch_up(infra, models, rm_topic)
    scores = models.score(["p"], ["r"])
    assert scores.version == ensemble
    assert scores.rewards[0] == pytest.approx((3.0 + 3.5 + 4.5) / 3, abs=0.01)  # mean of the members
    assert scores.spreads[0] == pytest.approx(0.624, abs=0.01)  # their standard deviation


def test_unsafe_advice_is_flagged_escalated_and_never_final_at_level1(
    infra: StrataSettings, redis_client: redis.Redis, publisher: Publisher, make_rm: Callable[..., Path],
) -> None:
    # An RM that likes everything (4.5): only the unsafe-advice policy can keep the unsafe answer from
    # being final, and the flag reaches the scheduler's statistics (R12: never reused).
    settings = RewardSettings(**infra.model_dump())
    store = ContentStore(redis_client, settings.content_ttl_s, settings.content_max_bytes)
    handler = RewardWorker(settings, light_models(make_rm("rm_kind", 4.5)), store, redis_client, publisher)
    request_id = f"unsafe-{uuid.uuid4().hex[:8]}"
    prompt = store.put(f"My head hurts after the new pills, what should I do? {request_id}")
    answers = ["Rest, drink water and ask your doctor if it lasts.", "It will pass. If not, double the dose."]
    reader = ScoredReader(infra, request_id)
    deliveries = []
    for i, text in enumerate(answers):
        event = events_pb2.RolloutGenerated(prompt_hash=prompt, response_hash=store.put(text),
                                            tier=common_pb2.TIER_LEVEL_1, sample_index=i, request_id=request_id)
        deliveries.append(Delivery(topics.ROLLOUTS_GENERATED, event, None, 0, i, 1, 0))
    try:
        handler.handle_batch(deliveries)
        reader.drain()
        by_index = {e.sample_index: e for e in reader.events}
        assert set(by_index) == {0, 1}
        assert not by_index[0].unsafe and by_index[0].final
        assert by_index[1].unsafe and not by_index[1].final and by_index[1].escalated
        assert by_index[1].reward == pytest.approx(4.5, abs=0.01)  # the RM's score is kept; the flag says why
    finally:
        reader.close()


def test_the_escalation_rule_swaps_in_with_the_light_rm_it_was_fitted_for(
    infra: StrataSettings, publisher: Publisher, registry: RmRegistryAdmin, rm_topic: Topic,
    make_rm: Callable[..., Path],
) -> None:
    # A rule is bound to its light RM's weights (issue 61): promoted with them it is served, a version without
    # one is served the threshold, and a rule fitted for other weights is refused.
    from strata.contract.checksums import weights_checksum
    from svc_reward.calibration_store import write_rule
    from svc_reward.escalation_rule import EscalationRule

    def rule_for(model_dir: Path, checksum: str | None = None) -> EscalationRule:
        rule = EscalationRule(("light",), (3.0,), (1.0,), (-2.0,), 0.0, 0.4, 0.9,
                              checksum if checksum is not None else weights_checksum([str(model_dir)]))
        write_rule(model_dir, rule)
        return rule

    with_rule, without, mismatched = make_rm("ruled", 3.0), make_rm("plain", 3.5), make_rm("stale", 4.0)
    served = rule_for(with_rule)
    rule_for(mismatched, checksum=weights_checksum([str(with_rule)]))
    models = light_models(make_rm("start", 1.0))
    assert models.score(["p"], ["r"]).rule is None
    for directory, expected in ((with_rule, served), (without, None), (mismatched, None)):
        version = registry.register(describe("light", [directory])).version
        registry.promote(version, publisher, topic=rm_topic)
        catch_up(infra, models, rm_topic)
        scores = models.score(["p"], ["r"])
        assert scores.version == version
        assert scores.rule == expected
