"""The scheduler in-process (gRPC on port 0) against the real Kafka and Redis."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
import redis
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import RebalanceInProgressError
from kafka.structs import OffsetAndMetadata
from prometheus_client import REGISTRY

from strata.bus import Publisher, Topic, topics
from strata.bus.admin import ensure_topics, start_group_at_end
from strata.bus.security import kafka_connection
from strata.bus.serde import decode
from strata.bus.tail import TailReader
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata.ratelimit import RateLimiter, RetryHints
from strata.rpc import RETRY_PUSHBACK_KEY
from strata.service import RunningService, ServiceParts, start_service, stop_service
from strata.v1 import common_pb2, events_pb2, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.cli import submit_cmd
from strata_tools.infra import down as infra_down
from strata_tools.infra import kafka_broker
from strata_tools.infra import up as infra_up
from strata_tools.infra.process import free_port
from svc_scheduler.__main__ import build_parts
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.encoder import Encoder
from svc_scheduler.engine import SchedulerEngine
from svc_scheduler.routing import Route
from svc_scheduler.stats import RewardObservation
from svc_scheduler.store import SchedulerStore

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0

# Close paraphrases of one request (pairwise cosine well above the 0.75 floor under MiniLM).
PARAPHRASES = [
    "Explain how binary search works.",
    "Please explain how binary search works.",
    "Can you explain how binary search works?",
    "Explain to me how binary search works.",
    "Explain how the binary search algorithm works.",
    "Explain briefly how binary search works.",
    "Explain how binary search works, please.",
]
QUERY = "Could you explain how binary search works?"


def eventually(condition: Callable[[], object], what: str, timeout_s: float = TIMEOUT_S) -> object:
    """Re-check ``condition`` until it is truthy; each check waits on real I/O (Redis, Kafka)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # poll interval of a condition read from Redis, not a stand-in for sync


def commit_once_stable(member: KafkaConsumer, offsets: dict) -> None:
    """Commit as a group member: a join round in flight (the topic's metadata arriving after the first
    assignment starts one) refuses commits until a poll completes it, as kafka-python's error says."""
    def attempt() -> bool:
        try:
            member.commit(offsets)
            return True
        except RebalanceInProgressError:
            member.poll(timeout_ms=200)
            return False

    eventually(attempt, "the member's commit once its group is stable")


class Replica:
    def __init__(self, settings: SchedulerSettings, encoder: Encoder) -> None:
        self.settings = settings
        self.parts, self.engine = build_parts(settings, encoder)
        self.running: RunningService = start_service(self.parts)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.running.port}")
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        stop_service(self.parts, self.running, grace_s=0.5)

    def __enter__(self) -> Replica:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def scheduler_settings(infra: StrataSettings, **overrides: object) -> SchedulerSettings:
    base = infra.model_dump()
    base.update(grpc_port=0, redis_prefix=f"test:sched:{uuid.uuid4().hex[:8]}",
                stats_group_id=f"test-sched-stats-{uuid.uuid4().hex[:8]}", watch_lookback_s=30.0)
    base.update(overrides)
    settings = SchedulerSettings(**base)
    start_group_at_end(infra.kafka_address, settings.stats_group_id,
                       [topics.REWARDS_SCORED, topics.ANNOTATIONS_COMPLETED])
    return settings


@pytest.fixture(scope="module")
def settings(infra: StrataSettings, zoo) -> SchedulerSettings:
    # Skips stay skips here (audits have their own test); the tiers' models give the prompt token check.
    return scheduler_settings(infra, audit_share=0.0, level1_model=str(zoo.level1), level2_model=str(zoo.level2))


@pytest.fixture(scope="module")
def replica(settings: SchedulerSettings, encoder: Encoder) -> Iterator[Replica]:
    running = Replica(settings, encoder)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra.kafka_address, client_id="test-scheduler")
    yield pub
    pub.close()


def reward(prompt_hash: str, value: float, i: int, final: bool = True, rm: str = "rm-test",
           scorer: int = common_pb2.SCORER_LIGHT, unsafe: bool = False, escalated: bool = False
           ) -> events_pb2.RewardScored:
    message = events_pb2.RewardScored(
        prompt_hash=prompt_hash, response_hash=content_hash(f"response {i} of {prompt_hash}"),
        tier=common_pb2.TIER_LEVEL_1, policy_version=1, rm_version=rm, reward=value, scorer=scorer, final=final,
        unsafe=unsafe, sample_index=i, escalated=escalated,
    )
    message.scored_at.GetCurrentTime()
    return message


def submit(stub, prompt: str, **fields) -> scheduler_pb2.SubmitResponse:
    return stub.Submit(scheduler_pb2.SubmitRequest(prompt=prompt, **fields), timeout=30)


def invalid(call: Callable[[], object]) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    return caught.value.details()


# -- bad input ----------------------------------------------------------------------------------------

def test_bad_inputs_get_invalid_argument_naming_the_field(replica: Replica) -> None:
    stub = replica.stub
    assert invalid(lambda: submit(stub, "")).startswith("prompt: must not be empty")
    assert invalid(lambda: submit(stub, "x" * (replica.settings.max_prompt_chars + 1))).startswith("prompt: is ")
    assert invalid(lambda: submit(stub, "binary\x00\x01\x02")).startswith("prompt: contains a control")
    # Under the character limit, but more tokens than the tiers' models read: refused, not accepted and dropped.
    assert "positions of the Level-1 model" in invalid(lambda: submit(stub, "Please read this. " * 120))
    too_cold = common_pb2.SamplingParams(temperature=0.2)
    assert invalid(lambda: submit(stub, "ok", sampling=too_cold)).startswith("sampling.temperature:")
    too_wide = common_pb2.SamplingParams(top_p=0.99)
    assert invalid(lambda: submit(stub, "ok", sampling=too_wide)).startswith("sampling.top_p:")
    assert invalid(lambda: submit(stub, "ok", n_samples=10_000)).startswith("n_samples:")
    assert invalid(lambda: list(stub.Watch(scheduler_pb2.WatchRequest(prompt_hash="nope"), timeout=5))).startswith(
        "prompt_hash:")
    raw_submit = replica.channel.unary_unary("/strata.v1.Scheduler/Submit")  # bytes in, bytes out
    assert invalid(lambda: raw_submit(b"\x0a\x03\xff\xfeA", timeout=10)).startswith("prompt: is not valid UTF-8")


def test_watch_streams_are_capped_per_client_and_unary_calls_still_answer(replica: Replica) -> None:
    # Each Watch holds a server thread: past the cap a client gets RESOURCE_EXHAUSTED at once, and
    # Submit's siblings (Stats, the health check) keep answering while the streams stay open.
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    limiter = replica.parts.bindings[0].servicer.watch_streams
    per_client = replica.settings.max_watch_streams_per_client
    idle = [replica.stub.Watch(scheduler_pb2.WatchRequest(prompt_hash=content_hash(f"idle {i} {uuid.uuid4()}")),
                               timeout=TIMEOUT_S) for i in range(per_client)]
    try:
        eventually(lambda: limiter.open == per_client, "the idle streams to open")
        extra = replica.stub.Watch(scheduler_pb2.WatchRequest(prompt_hash=content_hash("one too many")), timeout=30)
        with pytest.raises(grpc.RpcError) as refused:
            next(extra)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"limit {per_client} per client" in refused.value.details()
        assert replica.stub.Stats(scheduler_pb2.StatsRequest(), timeout=10).index_size >= 0
        health = health_pb2_grpc.HealthStub(replica.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for stream in idle:
            stream.cancel()
    eventually(lambda: limiter.open == 0, "the cancelled streams to be released")


def test_batch_reports_errors_per_prompt(replica: Replica) -> None:
    batch = scheduler_pb2.SubmitBatchRequest(requests=[
        scheduler_pb2.SubmitRequest(prompt=f"Summarize the history of the printing press {uuid.uuid4()}"),
        scheduler_pb2.SubmitRequest(prompt=""),
    ])
    results = replica.stub.SubmitBatch(batch, timeout=30).results
    assert results[0].WhichOneof("result") == "response"
    assert results[0].response.decision == common_pb2.DECISION_LEVEL_1
    assert results[1].error == "requests[1].prompt: must not be empty"


# -- routing through Kafka ----------------------------------------------------------------------------

def test_submit_publishes_to_the_decided_topic_and_watch_streams_it(replica: Replica, infra) -> None:
    reader = TailReader(infra, [topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL2], client_id="test-tail")
    reader.seek_to_end()
    try:
        plain = submit(replica.stub, f"Give me an example of recursion {uuid.uuid4()}", request_id="r-1")
        risky = submit(replica.stub, f"What dose of ibuprofen should I take? {uuid.uuid4()}")
        assert plain.decision == common_pb2.DECISION_LEVEL_1 and plain.tier == common_pb2.TIER_LEVEL_1
        assert risky.decision == common_pb2.DECISION_LEVEL_2 and "medical" in risky.reason
        seen: dict[str, tuple[str, events_pb2.PromptRouted]] = {}

        def both_seen() -> bool:
            for topic, message in reader.poll(0.2):
                seen[message.prompt_hash] = (topic.name, message)
            return plain.prompt_hash in seen and risky.prompt_hash in seen

        eventually(both_seen, "the routed events")
    finally:
        reader.close()
    topic, message = seen[plain.prompt_hash]
    assert topic == topics.PROMPTS_LEVEL0.name
    assert message.tier == common_pb2.TIER_LEVEL_0 and message.decision == common_pb2.DECISION_LEVEL_1
    assert message.request_id == "r-1" and message.n_samples == replica.settings.default_n_samples
    assert not message.level1_only  # tiering on: the probe may still send a cautious prompt to Level-2
    assert seen[risky.prompt_hash][0] == topics.PROMPTS_LEVEL2.name and seen[risky.prompt_hash][1].caution
    # The text is in the content store, keyed by the hash the client got back.
    assert replica.engine.content.contains(plain.prompt_hash)
    # Watch after Submit still sees the routed event (replayed from the hub's buffer).
    stream = replica.stub.Watch(scheduler_pb2.WatchRequest(prompt_hash=plain.prompt_hash), timeout=TIMEOUT_S)
    first = next(iter(stream))
    stream.cancel()
    assert first.WhichOneof("event") == "routed" and first.routed.prompt_hash == plain.prompt_hash


def test_with_tiering_off_a_risky_prompt_goes_to_level1_through_the_probe_marked_level1_only(
    settings: SchedulerSettings, encoder: Encoder, infra: StrataSettings,
) -> None:
    reader = TailReader(infra, [topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL2], client_id="test-tail-plain")
    reader.seek_to_end()
    plain_settings = settings.model_copy(update={"tiering": False,
                                                 "redis_prefix": f"test:plain:{uuid.uuid4().hex[:8]}"})
    try:
        with Replica(plain_settings, encoder) as plain:
            risky = submit(plain.stub, f"What dose of ibuprofen should I take? {uuid.uuid4()}")
            assert risky.decision == common_pb2.DECISION_LEVEL_1
            seen: dict[str, tuple[str, events_pb2.PromptRouted]] = {}

            def risky_seen() -> bool:
                for topic, message in reader.poll(0.2):
                    seen[message.prompt_hash] = (topic.name, message)
                return risky.prompt_hash in seen

            eventually(risky_seen, "the routed event")
    finally:
        reader.close()
    topic, message = seen[risky.prompt_hash]
    assert topic == topics.PROMPTS_LEVEL0.name and message.level1_only


def test_every_scored_reward_updates_redis_once(replica: Replica, publisher: Publisher) -> None:
    store = replica.engine.store
    prompt_hash = submit(replica.stub, f"Compare quicksort and merge sort {uuid.uuid4()}").prompt_hash
    events = [reward(prompt_hash, r, i) for i, r in enumerate([3.0, 3.5, 4.0, 3.5])]
    for message in events:
        publisher.publish(topics.REWARDS_SCORED, message)
    publisher.publish(topics.REWARDS_SCORED, events[0])  # a redelivered duplicate
    publisher.publish(topics.REWARDS_SCORED, reward(prompt_hash, 0.0, 7, final=False))  # escalated: counts too
    publisher.publish(topics.REWARDS_SCORED, reward(prompt_hash, 0.0, 8, scorer=common_pb2.SCORER_REUSED))
    publisher.publish_and_wait(topics.REWARDS_SCORED, reward(prompt_hash, 3.0, 9))  # last, same partition
    stats = eventually(lambda: (s := store.get_stats(prompt_hash)) and s.count >= 6 and s, "stats")
    folded = [3.0, 3.5, 4.0, 3.5, 0.0, 3.0]
    assert stats.count == 6
    assert stats.mean == pytest.approx(np.mean(folded)) and stats.variance == pytest.approx(np.var(folded, ddof=1))
    assert stats.rm_version == "rm-test" and not stats.unsafe
    assert store.versions().policy_version >= 1
    # An unsafe response flags the prompt for good (never reused).
    publisher.publish_and_wait(topics.REWARDS_SCORED, reward(prompt_hash, 0.5, 10, final=False, unsafe=True))
    flagged = eventually(lambda: (s := store.get_stats(prompt_hash)) and s.unsafe and s, "the unsafe flag")
    assert flagged.count == 7


def test_escalations_mark_the_neighbourhood_and_later_prompts_go_to_level2(replica, publisher) -> None:
    # What live traffic does: Level-1 answers the light RM scores low (escalated, not final), then the
    # Level-2 answer the strong RM scores high. One history on one scale: its variance marks (R11).
    base = f"Summarize the key points about the French revolution {uuid.uuid4().hex[:6]}."
    cluster = [base, base + " Thanks!", base + " Keep it short."][: replica.settings.min_marked_neighbours]
    hashes = [submit(replica.stub, prompt).prompt_hash for prompt in cluster]
    for prompt_hash in hashes:
        for i, value in enumerate([0.5, 1.0]):
            publisher.publish(topics.REWARDS_SCORED, reward(prompt_hash, value, i, final=False, rm="light-1"))
        publisher.publish(topics.REWARDS_SCORED,
                          reward(prompt_hash, 4.5, 2, rm="strong-1", scorer=common_pb2.SCORER_STRONG))
    publisher.flush()
    for prompt_hash in hashes:
        eventually(lambda h=prompt_hash: replica.engine.store.get_mark(h), "the high-uncertainty marks")
    stats = replica.engine.store.get_stats(hashes[0])
    assert stats is not None and dict(stats.rm_versions) == {"light": "light-1", "strong": "strong-1"}
    again = submit(replica.stub, base + " Please.")  # its nearest neighbours are marked
    assert again.decision == common_pb2.DECISION_LEVEL_2 and "high-uncertainty" in again.reason
    assert replica.stub.Stats(scheduler_pb2.StatsRequest(), timeout=10).high_uncertainty_marks >= 1


def test_a_neighbourhood_whose_level1_answers_are_escalated_routes_before_generating(
        infra: StrataSettings, encoder: Encoder, publisher: Publisher) -> None:
    # The light RM escalated every Level-1 answer to four paraphrases; their rewards vary too little to mark
    # the neighbourhood (a hard subject: Level-2 scores low as well) and too much to be reused.
    on = scheduler_settings(infra, route_before_escalation_rate=0.8)  # off by default
    with Replica(on, encoder) as replica:
        base = f"Derive the closed form of the integral of x squared sine x {uuid.uuid4().hex[:6]}."
        cluster = [base, base + " Thanks!", base + " Keep it short.", base + " Step by step."]
        hashes = [submit(replica.stub, prompt).prompt_hash for prompt in cluster]
        for prompt_hash in hashes:
            for i, value in enumerate([1.0, 2.3, 1.0, 2.3]):
                publisher.publish(topics.REWARDS_SCORED, reward(prompt_hash, value, i, final=False, escalated=True))
        publisher.flush()
        for prompt_hash in hashes:
            eventually(lambda h=prompt_hash: (s := replica.engine.store.get_stats(h)) and s.level1_escalated >= 4,
                       "the Level-1 record")
        again = submit(replica.stub, base + " Please.")
        assert again.decision == common_pb2.DECISION_LEVEL_2 and "before generating" in again.reason, again.reason


def test_peoples_labels_of_level1_answers_ride_on_a_later_paraphrase_to_the_reward_service(
        replica: Replica, publisher: Publisher, infra: StrataSettings) -> None:
    # Three paraphrases, each with Level-1 answers the light RM passed (rewards neither low- nor high-variance);
    # people then labelled two answers of each bad and one good, one label delivered twice.
    base = f"Explain how a bloom filter answers membership queries {uuid.uuid4().hex[:6]}."
    cluster = [base, base + " Thanks!", base + " Keep it short."]
    hashes = [submit(replica.stub, prompt).prompt_hash for prompt in cluster]
    for prompt_hash in hashes:
        for i, value in enumerate([1.0, 2.3, 1.0, 2.3]):
            publisher.publish(topics.REWARDS_SCORED, reward(prompt_hash, value, i))
    publisher.flush()
    for prompt_hash in hashes:
        eventually(lambda h=prompt_hash: (s := replica.engine.store.get_stats(h)) and s.count >= 4, "the rewards")
    for prompt_hash in hashes:
        for i, score in enumerate([0.5, 1.0, 4.0]):
            label = events_pb2.AnnotationCompleted(
                prompt_hash=prompt_hash, response_hash=content_hash(f"response {i} of {prompt_hash}"),
                annotator_id="ann-1", score=score, tier=common_pb2.TIER_LEVEL_1, policy_version=1)
            label.completed_at.GetCurrentTime()
            publisher.publish(topics.ANNOTATIONS_COMPLETED, label)
            if i == 0:
                publisher.publish(topics.ANNOTATIONS_COMPLETED, label)  # redelivered: counted once
        gold = events_pb2.AnnotationCompleted(prompt_hash=prompt_hash, response_hash="c" * 64, annotator_id="ann-1",
                                              score=0.0, tier=common_pb2.TIER_LEVEL_1, gold=True)
        publisher.publish(topics.ANNOTATIONS_COMPLETED, gold)  # a gold item is no label
    publisher.flush()
    for prompt_hash in hashes:
        eventually(lambda h=prompt_hash: (s := replica.engine.store.get_stats(h)) and s.level1_labelled >= 3,
                   "the labels")
    stats = replica.engine.store.get_stats(hashes[0])
    assert stats is not None and (stats.level1_labelled, stats.level1_bad) == (3.0, 2.0) and stats.count == 4
    reader = TailReader(infra, [topics.PROMPTS_LEVEL0], client_id="test-tail-record")
    reader.seek_to_end()
    labels_sum = REGISTRY.get_sample_value("strata_scheduler_level1_record_labels_sum") or 0.0
    try:
        again = submit(replica.stub, base + " Please.")
        assert again.decision == common_pb2.DECISION_LEVEL_1, again.reason
        seen: dict[str, events_pb2.PromptRouted] = {}

        def routed() -> bool:
            seen.update((m.prompt_hash, m) for _, m in reader.poll(0.2))
            return again.prompt_hash in seen

        eventually(routed, "the routed event")
    finally:
        reader.close()
    record = seen[again.prompt_hash].level1_record
    assert (record.labelled, record.bad) == (9.0, 6.0)
    # The operator sees how many labels stand behind the records the routes carry.
    assert REGISTRY.get_sample_value("strata_scheduler_level1_record_labels_sum") == labels_sum + 9.0


def test_one_high_variance_prompt_marks_its_cluster_and_a_later_paraphrase_goes_to_level2(
        infra: StrataSettings, encoder: Encoder, publisher: Publisher) -> None:
    # R11 as the article has it (cluster_marking, off by default): the variance marks the prompt's
    # cluster, not only the prompt. One marked neighbour is below min_marked_neighbours (3), so only
    # the cluster's mark escalates.
    with Replica(scheduler_settings(infra, cluster_marking=True), encoder) as replica:
        base = f"Describe the water cycle for a school project {uuid.uuid4().hex[:6]}."
        leader = submit(replica.stub, base)
        assert leader.decision == common_pb2.DECISION_LEVEL_1
        store = replica.engine.store
        assert store.neighbour_state([leader.prompt_hash]).clusters[leader.prompt_hash] == leader.prompt_hash
        for i, value in enumerate([0.5, 4.5, 1.0]):
            publisher.publish(topics.REWARDS_SCORED, reward(leader.prompt_hash, value, i, rm="light-1"))
        publisher.flush()
        state = eventually(lambda: (s := store.neighbour_state([leader.prompt_hash])).cluster_marks[leader.prompt_hash]
                           and s, "the cluster's mark")
        assert state.marks[leader.prompt_hash] is not None
        later = submit(replica.stub, base.removesuffix(".") + ", please.")
        assert later.decision == common_pb2.DECISION_LEVEL_2, later.reason
        assert "cluster" in later.reason and leader.prompt_hash[:12] in later.reason
        assert store.neighbour_state([later.prompt_hash]).clusters[later.prompt_hash] == leader.prompt_hash


def seed_paraphrases(engine: SchedulerEngine, stub) -> list[str]:
    """Submit the paraphrases (each rolled out and indexed) and give each stable rewards."""
    hashes = [submit(stub, text).prompt_hash for text in PARAPHRASES]
    now = time.time()
    for digest in hashes:
        for i, value in enumerate([3.9, 4.0, 4.1]):
            engine.store.apply_reward(digest, f"resp-{i}", RewardObservation(value, 1, "rm-test", now), now)
    return hashes


def test_known_neighbourhood_skips_and_reused_reward_reaches_watch(replica: Replica) -> None:
    seed_paraphrases(replica.engine, replica.stub)
    response = submit(replica.stub, QUERY, request_id="skip-1")
    assert response.decision == common_pb2.DECISION_SKIP, response.reason
    assert response.low_variance_neighbours >= 7 and response.HasField("reused_reward")
    assert response.reused_reward == pytest.approx(4.0, abs=1e-6)
    stream = replica.stub.Watch(scheduler_pb2.WatchRequest(prompt_hash=response.prompt_hash), timeout=TIMEOUT_S)
    event = next(iter(stream))
    stream.cancel()
    assert event.WhichOneof("event") == "reward"
    assert event.reward.scorer == common_pb2.SCORER_REUSED and event.reward.final
    assert event.reward.reward == pytest.approx(4.0) and event.reward.request_id == "skip-1"
    assert response.prompt_hash not in replica.engine.index  # skipped prompts are not indexed
    stats = replica.stub.Stats(scheduler_pb2.StatsRequest(), timeout=10)
    assert stats.decisions["skip"] >= 1 and 0 < stats.skip_rate < 1 and stats.index_size == len(replica.engine.index)


def test_audited_skips_are_rolled_out_and_scored_against_the_reused_reward(
        infra: StrataSettings, encoder: Encoder, publisher: Publisher) -> None:
    with Replica(scheduler_settings(infra, audit_share=1.0), encoder) as auditing:
        seed_paraphrases(auditing.engine, auditing.stub)
        # Not QUERY: its rewards here must not reach another test's Watch of QUERY.
        response = submit(auditing.stub, "Would you explain how binary search works?", request_id="audit-1",
                          n_samples=2)
        assert response.decision == common_pb2.DECISION_LEVEL_1 and "audit" in response.reason
        assert not response.HasField("reused_reward")
        for i, value in enumerate([2.5, 3.5]):  # fresh mean 3.0 against the reused 4.0
            message = reward(response.prompt_hash, value, i)
            message.request_id = "audit-1"
            publisher.publish(topics.REWARDS_SCORED, message)
        publisher.publish(topics.REWARDS_SCORED, reward(response.prompt_hash, 0.0, 5))  # another request
        publisher.flush()
        # After the first fresh reward the error is 1.5; after both, 1.0.
        stats = eventually(lambda: (s := auditing.stub.Stats(scheduler_pb2.StatsRequest(), timeout=10))
                           and s.HasField("audit_reuse_mae") and abs(s.audit_reuse_mae - 1.0) < 1e-6 and s,
                           "the audit's fresh rewards")
        assert (stats.audits, stats.audits_scored) == (1, 1)
        assert stats.decisions["skip"] == 0 and stats.decisions["level_1"] == len(PARAPHRASES) + 1
        assert stats.audit_precision == 0.0
        assert stats.audit_tolerance == auditing.settings.audit_tolerance
        assert not stats.HasField("audit_reuse_mae_ci95")  # one scored audit: no interval
        # The audit erred by more than the tolerance on its two (n_samples) rewards: the paraphrases whose
        # rewards it reused are out of reuse, and a neighbour that would have skipped on them does not.
        assert stats.audit_distrusts == 1
        # Each paraphrase it reused gets its own similarity floor: its cosine to the audited prompt.
        vector = auditing.engine.encoder.encode(["Would you explain how binary search works?"])[0]
        paraphrases = [content_hash(text) for text in PARAPHRASES]
        floors = auditing.engine.store.neighbour_state(paraphrases).similarity_floors
        reused = [h for h in paraphrases if floors[h] is not None]
        assert stats.audit_similarity_floors == len(reused) >= auditing.settings.min_low_variance_neighbours
        for h in reused:
            cosine = float(auditing.engine.store.get_embeddings([h])[0] @ vector)
            assert floors[h] == pytest.approx(cosine, abs=1e-4)
        later = submit(auditing.stub, "Would you kindly explain how binary search works?", request_id="after-1")
        assert later.decision == common_pb2.DECISION_LEVEL_1 and not later.reason.startswith("Level-1 (audit")
        assert "audit erred" in later.reason, later.reason


def test_strata_submit_prints_decision_and_the_final_reward(replica: Replica, tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    submit_cmd.register(parser.add_subparsers())
    address = f"127.0.0.1:{replica.running.port}"
    args = parser.parse_args(["submit", "--address", address, "--timeout", "30", QUERY])
    assert args.func(args) == 0  # a known neighbourhood: skipped, its reused reward is final at once
    out = capsys.readouterr().out
    assert "decision=skip" in out and "final_reward=4.000" in out
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Give me the gist of the Roman empire."}\n{"prompt": ""}\n', encoding="utf-8")
    args = parser.parse_args(["submit", "--address", address, "--no-wait", "--file", str(prompts)])
    assert args.func(args) == 1  # one refused
    out = capsys.readouterr().out
    assert "decision=level-1 tier=level-1" in out and "refused: requests[1].prompt: must not be empty" in out



def test_strata_submit_watches_more_prompts_than_its_stream_cap(replica: Replica, tmp_path, capsys) -> None:
    # Twelve skips of a known neighbourhood: each final at once, so the four watch threads open
    # stream after stream faster than the server releases the closed ones; refused streams retry.
    parser = argparse.ArgumentParser()
    submit_cmd.register(parser.add_subparsers())
    prompts = tmp_path / "skips.jsonl"
    prompts.write_text("".join(f'{{"prompt": "{QUERY}"}}\n' for _ in range(12)), encoding="utf-8")
    args = parser.parse_args(["submit", "--address", f"127.0.0.1:{replica.running.port}", "--timeout", "60",
                              "--file", str(prompts)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.count("decision=skip") == 12 and out.count("final_reward=") == 12, out

# -- state in Redis: restart and replicas -------------------------------------------------------------

def test_restart_from_redis_makes_the_same_decisions(replica: Replica, encoder: Encoder) -> None:
    probes = [QUERY, PARAPHRASES[0], "What dose of ibuprofen should I take?", "Write code to reverse a linked list."]
    before = replica.engine.route(probes)
    restarted = Replica(replica.settings, encoder)  # a fresh process would see exactly this: Redis only
    try:
        assert len(restarted.engine.index) == len(replica.engine.index)
        after = restarted.engine.route(probes)
    finally:
        restarted.stop()
    assert [r.decision for r in after] == [r.decision for r in before]
    assert before[0].decision.route is Route.SKIP


def test_a_float_state_is_served_in_its_own_vector_space_by_the_auto_default(infra: StrataSettings) -> None:
    settings = scheduler_settings(infra, audit_share=0.0)
    float_encoder = Encoder(backend="onnx")
    client = redis.Redis.from_url(settings.redis_address)
    try:
        SchedulerStore(client, settings).claim_encoder(float_encoder.encoder_id)  # built before auto was the default
    finally:
        client.close()
    auto = Encoder()  # the default: int8 on a CPU, unless the state says otherwise
    assert auto.backend == "onnx-int8"
    upgraded = Replica(settings, auto)  # reads the state's claim as it starts
    try:
        assert auto.backend == "onnx" and auto.encoder_id == float_encoder.encoder_id
        assert submit(upgraded.stub, QUERY).prompt_hash == content_hash(QUERY)  # served, not refused
        query = upgraded.engine.encoder.encode([QUERY])
        assert np.abs(query - float_encoder.encode([QUERY])).max() < 1e-4
    finally:
        upgraded.stop()


def test_a_state_of_another_encoder_is_refused(infra: StrataSettings) -> None:
    settings = scheduler_settings(infra)
    client = redis.Redis.from_url(settings.redis_address)
    try:
        store = SchedulerStore(client, settings)
        assert store.claimed_encoder() is None  # a fresh state
        store.claim_encoder("another-model/384")
        store.claim_encoder("another-model/384")  # the same encoder again: fine
        with pytest.raises(RuntimeError, match="holds vectors of encoder 'another-model/384', not 'mine/384'"):
            store.claim_encoder("mine/384")
        assert store.claimed_encoder() == "another-model/384"  # the refused claim wrote nothing
    finally:
        client.close()


def test_two_replicas_share_new_prompts(replica: Replica, encoder: Encoder) -> None:
    other = Replica(replica.settings, encoder)
    try:
        new = submit(replica.stub, f"Walk me through planting tomatoes {uuid.uuid4()}").prompt_hash
        eventually(lambda: new in other.engine.index, "the prompt in the other replica's index")
        back = submit(other.stub, f"Walk me through pruning roses {uuid.uuid4()}").prompt_hash
        eventually(lambda: back in replica.engine.index, "the prompt in the first replica's index")
    finally:
        other.stop()


# -- faults -------------------------------------------------------------------------------------------

def test_redis_down_fails_fast_with_unavailable_and_recovers(infra: StrataSettings, encoder: Encoder,
                                                            tmp_path) -> None:
    port = free_port()
    settings = scheduler_settings(infra, redis_url=f"redis://127.0.0.1:{port}/0")
    down = Replica(settings, encoder)
    server = None
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            submit(down.stub, "Explain how a hash map works.")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Redis is unavailable" in caught.value.details()
        assert time.monotonic() - started < 5.0
        # Redis comes back on the same port: the next Submit rebuilds the index and is accepted.
        server = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=port)
        eventually(lambda: _answers(client), "the restarted Redis")
        client.close()
        response = submit(down.stub, "Explain how a hash map works.")
        assert response.decision == common_pb2.DECISION_LEVEL_1
        assert ContentStore(redis.Redis(port=port), 60, 1 << 20).contains(response.prompt_hash)
    finally:
        down.stop()
        if server is not None:
            server.terminate()
            server.wait(10)



def test_kafka_outage_never_loses_an_accepted_prompt(infra: StrataSettings, encoder: Encoder, tmp_path) -> None:
    """A broker of its own (the session's stays up): stopped mid-run, then started again on its data.

    Submit answers only after ``acks=all``; while Kafka is down it answers UNAVAILABLE instead of
    accepting, and every prompt it did accept is in the topic once the broker is back.
    """
    own = StrataSettings(state_dir=tmp_path / "state", kafka_port=free_port(), kafka_controller_port=free_port(),
                         redis_url=infra.redis_address, topic_partitions=1, infra_start_timeout_s=120)
    infra_up(own)
    replica = None
    try:
        replica = Replica(scheduler_settings(own, publish_timeout_s=3.0), encoder)
        accepted = [submit(replica.stub, f"Explain how a bloom filter works, case {i} {uuid.uuid4()}").prompt_hash
                    for i in range(3)]
        kafka_broker.stop(own)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            submit(replica.stub, f"Explain how a trie works {uuid.uuid4()}")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
        assert "not accepted" in caught.value.details()
        assert time.monotonic() - started < 3.0 + 10.0  # the publish timeout, not a hang
        kafka_broker.start(own)
        accepted += [eventually(lambda: _submitted(replica, f"Explain how a heap works {uuid.uuid4()}"),
                                "a Submit accepted after the broker restart")]
        published = _prompt_hashes(own.kafka_address, topics.PROMPTS_LEVEL0.name)
        assert set(accepted) <= published, "an accepted prompt is missing from the topic"
    finally:
        if replica is not None:
            replica.stop()
        infra_down(own, purge=True)


def _submitted(replica: Replica, prompt: str) -> str | None:
    try:
        return submit(replica.stub, prompt).prompt_hash
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return None  # the producer is still reconnecting to the restarted broker


def _prompt_hashes(bootstrap: str, topic_name: str) -> set[str]:
    """Every prompt hash in ``topic_name``, read from the beginning until the end offsets."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        partitions = [TopicPartition(topic_name, p) for p in sorted(consumer.partitions_for_topic(topic_name))]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        hashes: set[str] = set()
        for record in consumer:
            hashes.add(decode(topics.PROMPTS_LEVEL0, record.value).prompt_hash)
            if all(consumer.position(tp) >= end[tp] for tp in partitions):
                break
        return hashes
    finally:
        consumer.close()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_service_parts_shape(replica: Replica) -> None:
    parts: ServiceParts = replica.parts
    assert parts.name == "svc_scheduler" and len(parts.workers) == 1
    assert parts.workers[0].group_id == replica.settings.stats_group_id


def test_a_reward_seen_again_is_not_folded_twice(replica: Replica) -> None:
    # The same (prompt, response, RM version) arrives twice: e.g. two requests whose seeded samples
    # are identical, or a redelivery. The second is a no-op that still answers with the statistics.
    digest = submit(replica.stub, "What does a seen-twice reward do to the statistics?").prompt_hash
    now = time.time()
    observation = RewardObservation(3.5, 1, "rm-test", now)
    first = replica.engine.store.apply_reward(digest, "resp-same", observation, now)
    second = replica.engine.store.apply_reward(digest, "resp-same", observation, now)
    assert first.applied and not second.applied
    assert second.stats is not None and second.stats.count == first.stats.count == 1


def test_an_indexed_prompt_is_decided_on_its_stored_vector(replica: Replica, encoder: Encoder,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen = f"Explain how a heap keeps its order. ({uuid.uuid4().hex[:6]})"
    submit(replica.stub, seen)  # a rollout: the prompt and its vector are indexed
    assert content_hash(seen) in replica.engine.index
    new = f"How do tides work? ({uuid.uuid4().hex[:6]})"
    encoded: list[str] = []
    real = encoder.encode_counted

    def counting(texts):
        encoded.extend(texts)
        return real(texts)

    monkeypatch.setattr(encoder, "encode_counted", counting)
    routed = replica.engine.route([seen, new])
    assert encoded == [new]  # the seen prompt's vector came from Redis, not from the encoder
    assert np.abs(np.stack([r.vector for r in routed]) - real([seen, new])[0]).max() < 1e-4
    assert routed[0].encoder_charge.tokens == 0 and routed[1].encoder_charge.tokens > 0  # no encoding, no cost


def test_the_door_sheds_rollouts_while_a_tier_is_behind_and_still_serves_skips(
        infra: StrataSettings, encoder: Encoder) -> None:
    # A tier that has fallen behind, for real: a consumer group with a live member, its commits 100
    # events short of its topic's end and not advancing.
    topic = Topic(f"test.shed.{uuid.uuid4().hex[:8]}", events_pb2.PromptRouted)
    ensure_topics(infra, 1, topics=[topic])
    group = f"test-shed-tier-{uuid.uuid4().hex[:8]}"
    overrides = {"backlog_groups": group, "shed_backlog_wait_s": 5.0, "shed_min_backlog": 64, "backlog_poll_s": 0.2,
                 "backlog_window_s": 2.0, "audit_share": 0.0}
    with Replica(scheduler_settings(infra, **overrides), encoder) as door:
        seed_paraphrases(door.engine, door.stub)  # before the tier falls behind: rolled out
        member = KafkaConsumer(**kafka_connection(infra), group_id=group, enable_auto_commit=False,
                               auto_offset_reset="earliest")
        try:
            # Subscribed once the topic's partitions are known: a group joined before would assign it none.
            eventually(lambda: member.partitions_for_topic(topic.name), "the new topic's metadata")
            member.subscribe([topic.name])
            eventually(lambda: member.poll(timeout_ms=200) is not None and member.assignment(), "the member's join")
            partition = TopicPartition(topic.name, 0)
            commit_once_stable(member, {partition: OffsetAndMetadata(0, "", -1)})
            producer = KafkaProducer(**kafka_connection(infra))
            for _ in range(100):
                producer.send(topic.name, value=b"queued", partition=0)
            producer.flush()
            producer.close()
            # Stalled once a whole window (2 s) of readings saw the 100 events and no commit.
            shed = eventually(lambda: (seen := door.engine.shed()) and seen.stage.lag == 100 and seen,
                              "the door to see the tier's backlog")
            assert shed.stage.group == group
            shed_before = REGISTRY.get_sample_value("strata_scheduler_shed_total", {"group": group}) or 0.0
            fresh = f"How do I season a cast iron pan? ({uuid.uuid4().hex[:8]})"

            with pytest.raises(grpc.RpcError) as refused:
                submit(door.stub, fresh, request_id="shed-1")
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = refused.value.details()
            assert "a rollout stage has 100 events queued" in details and group not in details  # no internals
            assert "skips are served" in details and "retry in" in details
            hint_ms = int(dict(refused.value.trailing_metadata() or ())[RETRY_PUSHBACK_KEY])
            # Nothing drains: the longest hint, stretched by this call's draw; the message says the same wait.
            longest = door.settings.max_retry_after_s
            assert longest * 1000 <= hint_ms <= longest * (1 + door.settings.shed_retry_jitter) * 1000
            assert f"retry in {hint_ms / 1000:.1f} s" in details
            assert door.engine.content.find_texts([content_hash(fresh)]) == {}  # nothing kept for it

            # A skip needs no tier: served.
            skipped = submit(door.stub, QUERY, request_id="shed-skip")
            assert skipped.decision == common_pb2.DECISION_SKIP, skipped.reason

            batch = door.stub.SubmitBatch(scheduler_pb2.SubmitBatchRequest(requests=[
                scheduler_pb2.SubmitRequest(prompt="How do I season a carbon steel wok?"),
                scheduler_pb2.SubmitRequest(prompt=QUERY)]), timeout=30)
            assert batch.results[0].error.startswith("requests[0]: RESOURCE_EXHAUSTED: the rollout tiers are behind")
            assert batch.results[1].response.decision == common_pb2.DECISION_SKIP
            assert REGISTRY.get_sample_value("strata_scheduler_shed_total", {"group": group}) == shed_before + 2
            # A client that honours each retry hint pays none of its Submit rate for being shed: with a burst
            # of 2 and almost no refill, four refusals in a row, each for the backlog, never for the rate.
            servicer = door.parts.bindings[0].servicer
            servicer.submit_rate = RateLimiter(rate=0.001, burst=2)
            hints_clock = [0.0]
            servicer.retry_hints = RetryHints(clock=lambda: hints_clock[0])
            for attempt in range(4):
                hints_clock[0] += 1000.0  # past the last hint: the client waited as told
                with pytest.raises(grpc.RpcError) as again:
                    submit(door.stub, fresh, request_id=f"shed-waited-{attempt}")
                assert "rollout tiers are behind" in again.value.details(), again.value.details()
            # One that comes straight back pays for each refusal (each an encoder pass): its rate stops it.
            servicer.submit_rate = RateLimiter(rate=0.001, burst=2)
            refusals = []
            for attempt in range(3):
                with pytest.raises(grpc.RpcError) as again:
                    submit(door.stub, fresh, request_id=f"shed-early-{attempt}")
                refusals.append(again.value.details())
            assert all("rollout tiers are behind" in r for r in refusals[:2])
            assert "over its Submit rate" in refusals[2], refusals[2]
            servicer.submit_rate = RateLimiter(door.settings.submit_rate_per_client,
                                               door.settings.submit_burst_per_client)

            # The tier catches up: the door opens again.
            commit_once_stable(member, {partition: OffsetAndMetadata(100, "", -1)})
            eventually(lambda: door.engine.shed() is None, "the door to see the tier caught up")
            accepted = submit(door.stub, fresh, request_id="shed-2")
            assert accepted.decision == common_pb2.DECISION_LEVEL_1
        finally:
            member.close(autocommit=False)
