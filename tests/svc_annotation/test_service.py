"""The annotation desk against the real Kafka and Redis.

Two levels: the store and servicer on their own (a fresh key prefix per test, a gRPC server on port 0,
a recording publisher for the loop), and the whole service in-process (its own consumer group and
prefix) fed AnnotationRequested events over Kafka. Time is a fake clock the tests move; waits poll
real I/O with deadlines.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis

from strata import ledger
from strata.bus import Publisher, topics
from strata.bus.admin import start_group_at_end
from strata.bus.producer import PublishError
from strata.bus.tail import TailReader
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.rpc import ServiceBinding, start_server
from strata.rpc_auth import CallerIdentity, TokenTable, token_line, with_bearer
from strata.service import ServiceParts, start_service, stop_service
from strata.v1 import annotation_pb2, annotation_pb2_grpc, common_pb2, events_pb2
from strata_tools.infra.process import free_port
from strata_tools.stack.control import health
from svc_annotation.__main__ import build
from svc_annotation.config import AnnotationSettings
from svc_annotation.core import GoldItem, Rules, is_double
from svc_annotation.servicer import SERVICE_NAME, AnnotationServicer
from svc_annotation.store import AnnotationStore
from svc_annotation.worker import DeskLoop, item_of

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
TTL_S = 600.0
DEADLINE_S = 3600.0


class Clock:
    """Epoch seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def eventually(condition: Callable[[], object], what: str, timeout_s: float = TIMEOUT_S) -> object:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # poll interval of a condition read from Redis or Kafka, not a stand-in for sync


def sample(content: ContentStore, double: bool | None = None, double_share: float = 0.5, awaiting: bool = True,
           provisional: bool = True, unsafe: bool = False) -> events_pb2.AnnotationRequested:
    """A Level-2 sample sent to annotation as the reward service sends it; ``double`` picks the
    sample index so that the item is (or is not) double-annotated."""
    tag = uuid.uuid4().hex[:8]
    prompt_hash = content.put(f"Is it safe to mix bleach and vinegar? {tag}")
    response_hash = content.put(f"No: it releases chlorine gas. {tag}")
    request_id = f"req-{tag}"
    for index in range(200):
        reward = events_pb2.RewardScored(
            prompt_hash=prompt_hash, response_hash=response_hash, tier=common_pb2.TIER_LEVEL_2, policy_version=3,
            rm_version="strong-test", reward=4.25, reward_std=0.1, scorer=common_pb2.SCORER_STRONG, final=False,
            sample_index=index, response_tokens=9, request_id=request_id, unsafe=unsafe,
            directions=[common_pb2.Direction(name="explain_principle", score=0.7)], awaiting_annotation=awaiting,
        )
        reward.scored_at.FromSeconds(1_700_000_000)
        event = events_pb2.AnnotationRequested(
            prompt_hash=prompt_hash, response_hash=response_hash, tier=common_pb2.TIER_LEVEL_2, policy_version=3,
            rm_version="strong-test", model_reward=4.25, reason="level-2 sample, awaiting annotation",
        )
        event.requested_at.FromSeconds(1_700_000_001)
        if provisional:
            event.provisional.CopyFrom(reward)
        item = item_of(event, 0.0, Rules(double_share, 0.0, TTL_S, DEADLINE_S))
        if double is None or is_double(item.item_id, double_share) == double:
            return event
    raise AssertionError("no sample index gives the wanted kind of item")


def item_id(event: events_pb2.AnnotationRequested) -> str:
    return item_of(event, 0.0, Rules(0.0, 0.0, TTL_S, DEADLINE_S)).item_id


@pytest.fixture
def content(redis_client: redis.Redis, infra: StrataSettings) -> ContentStore:
    return ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)


# -- the store and servicer on their own -------------------------------------------------------------

class RecordingPublisher:
    """Records what is published; the acknowledgement fails while ``broken``."""

    def __init__(self) -> None:
        self.published: list[tuple[str, object]] = []
        self.broken = False

    def publish(self, topic, message):
        self.published.append((topic.name, message))

    def wait(self, futures) -> None:
        if self.broken:
            raise PublishError("event not acknowledged by Kafka: KafkaTimeoutError")

    def of(self, topic) -> list:
        return [m for name, m in self.published if name == topic.name]


class Desk:
    """A store with its own prefix and clock, its servicer on a gRPC server, and its loop."""

    def __init__(self, client: redis.Redis, content: ContentStore, double_share: float = 0.0, gold_share: float = 0.0,
                 tokens: TokenTable | None = None, server_settings: StrataSettings | None = None,
                 gold: list[GoldItem] | None = None) -> None:
        self.clock = Clock()
        self.store = AnnotationStore(client, content, f"test:ann:{uuid.uuid4().hex[:8]}",
                                     Rules(double_share, gold_share, TTL_S, DEADLINE_S), 7 * 24 * 3600, self.clock)
        self.publisher = RecordingPublisher()
        self.loop = DeskLoop(self.store, self.publisher, client, "test", 0.05, 64, 30.0, gold or [])  # type: ignore[arg-type]
        servicer = AnnotationServicer(self.store, CallerIdentity(tokens))
        self.server = start_server([ServiceBinding(annotation_pb2_grpc.add_AnnotationServicer_to_server, servicer,
                                                   SERVICE_NAME)], 0, server_settings)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = annotation_pb2_grpc.AnnotationStub(self.channel)

    def queue(self, event: events_pb2.AnnotationRequested) -> str:
        item = item_of(event, self.clock(), self.store.rules)
        assert self.store.enqueue(item)
        self.clock.advance(1)  # the queue's order is the enqueue time's: the order of these calls
        return item.item_id

    def next(self, who: str) -> annotation_pb2.NextResponse:
        return self.stub.Next(annotation_pb2.NextRequest(annotator_id=who), timeout=10)

    def score(self, who: str, item: str, score: float, **flags: bool) -> annotation_pb2.AnnotationScoreResponse:
        return self.stub.Score(annotation_pb2.AnnotationScoreRequest(annotator_id=who, item_id=item, score=score,
                                                                     **flags), timeout=10)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0.5)


@pytest.fixture
def desk(redis_client: redis.Redis, content: ContentStore) -> Iterator[Desk]:
    running = Desk(redis_client, content)
    yield running
    running.close()


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_next_hands_out_the_oldest_item_with_its_texts_and_the_same_one_again(desk: Desk, content) -> None:
    first, second = sample(content), sample(content)
    first_id = desk.queue(first)
    desk.queue(second)
    offer = desk.next("ann")
    assert offer.has_item and offer.item_id == first_id
    assert offer.prompt == content.get_text(first.prompt_hash)
    assert offer.response == content.get_text(first.response_hash)
    assert offer.assigned_until.ToNanoseconds() == int((desk.clock() + TTL_S) * 1e9)
    assert desk.next("ann").item_id == first_id  # asked again: the same open assignment
    assert desk.next("bob").item_id == item_id(second)  # the first's one slot is held
    assert not desk.next("cid").has_item  # both held: nothing for a third annotator
    status = desk.store.status()
    assert (status.queue_depth, status.assigned, status.enqueued) == (2, 2, 2)
    assert status.annotators["ann"].assignments == 1 and status.annotators["ann"].has_open_assignment


def test_a_stale_assignment_returns_to_the_queue(desk: Desk, content) -> None:
    item = desk.queue(sample(content))
    assert desk.next("ann").item_id == item
    desk.clock.advance(TTL_S + 1)
    assert desk.next("bob").item_id == item  # ann's went stale: bob gets the item
    late = refused(lambda: desk.score("ann", item, 3.0))
    assert late.code() == grpc.StatusCode.FAILED_PRECONDITION and "went to another annotator" in late.details()
    assert desk.score("bob", item, 2.0).scored_by_you == 1
    assert desk.store.item(item).state == "complete"  # type: ignore[union-attr]


def test_a_stale_assignment_nobody_took_still_takes_its_score(desk: Desk, content) -> None:
    item = desk.queue(sample(content))
    assert desk.next("ann").item_id == item
    desk.clock.advance(TTL_S + 1)
    assert desk.next("ann").item_id == item  # renewed for the same annotator
    desk.clock.advance(TTL_S + 1)
    assert desk.score("ann", item, 4.0).scored_by_you == 1  # stale, but its slot is still free


def test_bad_scores_are_refused_with_the_right_code_and_nothing_is_recorded_twice(desk: Desk, content) -> None:
    item = desk.queue(sample(content))
    other = desk.queue(sample(content))
    assert desk.next("ann").item_id == item
    for bad, words in ((7.0, "score: must be in [0, 5], got 7"), (math.nan, "score: must be a finite number"),
                       (-1.0, "score: must be in [0, 5]"), (math.inf, "finite")):
        error = refused(lambda bad=bad: desk.score("ann", item, bad))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and words in error.details()
    unknown = refused(lambda: desk.score("ann", "0" * 32, 3.0))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND and "no item" in unknown.details()
    malformed = refused(lambda: desk.score("ann", "../etc", 3.0))
    assert malformed.code() == grpc.StatusCode.INVALID_ARGUMENT and malformed.details().startswith("item_id:")
    not_mine = refused(lambda: desk.score("ann", other, 3.0))
    assert not_mine.code() == grpc.StatusCode.FAILED_PRECONDITION and "not assigned to ann" in not_mine.details()
    nobody = refused(lambda: desk.score("", item, 3.0))
    assert nobody.code() == grpc.StatusCode.INVALID_ARGUMENT and nobody.details().startswith("annotator_id:")
    assert desk.score("ann", item, 3.5).scored_by_you == 1
    again = refused(lambda: desk.score("ann", item, 1.0))
    assert again.code() == grpc.StatusCode.ALREADY_EXISTS and "first score stands" in again.details()
    closed = refused(lambda: desk.score("bob", item, 1.0))
    assert closed.code() == grpc.StatusCode.FAILED_PRECONDITION and "closed" in closed.details()
    status = desk.store.status()
    assert status.annotators["ann"].scored == 1 and status.annotators["ann"].mean_score == 3.5
    assert (status.completed, status.queue_depth) == (1, 1)
    desk.loop.step()
    [completed] = desk.publisher.of(topics.ANNOTATIONS_COMPLETED)
    assert (completed.annotator_id, completed.score) == ("ann", 3.5)


def test_eight_annotators_racing_for_one_slot_get_it_once(desk: Desk, content) -> None:
    item = desk.queue(sample(content))
    barrier = threading.Barrier(8)
    offers: dict[str, str] = {}

    def ask(who: str) -> None:
        barrier.wait()
        reply = desk.next(who)
        if reply.has_item:
            offers[who] = reply.item_id

    threads = [threading.Thread(target=ask, args=(f"ann{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert list(offers.values()) == [item]
    assert desk.store.status().assigned == 1


def test_a_double_item_goes_to_two_annotators_and_its_final_is_their_mean(redis_client, content) -> None:
    desk = Desk(redis_client, content, double_share=0.5)
    try:
        event = sample(content, double=True, unsafe=False)
        item = desk.queue(event)
        assert desk.next("ann").item_id == item
        assert desk.next("bob").item_id == item  # a second slot
        assert not desk.next("cid").has_item  # no third
        desk.score("ann", item, 4.0)
        desk.clock.advance(5)
        desk.score("bob", item, 3.0, unsafe=True)
        desk.publisher.broken = True
        with pytest.raises(PublishError):
            desk.loop.step()  # not acknowledged: nothing is marked, the next pass publishes again
        desk.publisher.broken, desk.publisher.published = False, []
        desk.loop.step()
        desk.loop.step()  # acknowledged and marked: nothing twice
        completions = desk.publisher.of(topics.ANNOTATIONS_COMPLETED)
        assert sorted((c.annotator_id, c.score, c.unsafe) for c in completions) == [("ann", 4.0, False),
                                                                                     ("bob", 3.0, True)]
        [final] = desk.publisher.of(topics.REWARDS_SCORED)
        assert (final.final, final.awaiting_annotation, final.scorer) == (True, False, common_pb2.SCORER_HUMAN)
        assert (final.reward, final.reward_std, final.annotator_id, final.unsafe) == (3.5, 0.5, "ann,bob", True)
        assert (final.request_id, final.sample_index) == (event.provisional.request_id, event.provisional.sample_index)
        assert final.scored_at.ToNanoseconds() == int(desk.clock() * 1e9)
        [logged] = desk.publisher.of(topics.ROLLOUT_LOG)
        assert (logged.prompt_hash, logged.response_hash, logged.reward) == (event.prompt_hash, event.response_hash,
                                                                             3.5)
    finally:
        desk.close()


def test_at_the_deadline_an_item_closes_with_the_scores_it_has(redis_client, content) -> None:
    desk = Desk(redis_client, content, double_share=0.5)
    try:
        half = desk.queue(sample(content, double=True))
        none = desk.queue(sample(content, double=False))
        assert desk.next("ann").item_id == half
        desk.score("ann", half, 2.0)
        assert desk.next("ann").item_id == none  # held, never scored
        desk.clock.advance(DEADLINE_S + 1)
        assert not desk.next("bob").has_item  # past the deadline nothing is handed out
        desk.loop.step()
        finals = {f.response_hash: f for f in desk.publisher.of(topics.REWARDS_SCORED)}
        human = finals[desk.store.item(half).response_hash]  # type: ignore[union-attr]
        assert (human.scorer, human.reward, human.annotator_id, human.final) == (common_pb2.SCORER_HUMAN, 2.0, "ann",
                                                                                 True)
        provisional = finals[desk.store.item(none).response_hash]  # type: ignore[union-attr]
        assert (provisional.scorer, provisional.reward, provisional.annotator_id) == (common_pb2.SCORER_STRONG, 4.25,
                                                                                      "")
        assert (provisional.final, provisional.awaiting_annotation) == (True, False)
        assert provisional.scored_at.seconds == 1_700_000_000  # the provisional reward as it was
        late = refused(lambda: desk.score("ann", none, 4.0))
        assert late.code() == grpc.StatusCode.FAILED_PRECONDITION and "deadline passed" in late.details()
        status = desk.store.status()
        assert (status.completed, status.expired, status.queue_depth) == (1, 1, 0)
    finally:
        desk.close()


def test_without_an_awaiting_provisional_reward_only_the_scores_are_published(desk: Desk, content) -> None:
    old = desk.queue(sample(content, provisional=False))  # an older reward service: its strong reward was final
    final_already = desk.queue(sample(content, awaiting=False))
    for item in (old, final_already):
        assert desk.next("ann").item_id == item
        desk.score("ann", item, 1.0)
    desk.clock.advance(DEADLINE_S + 1)
    desk.loop.step()
    assert len(desk.publisher.of(topics.ANNOTATIONS_COMPLETED)) == 2
    # Each score names the tier of the answer it scored (the scheduler's Level-1 record reads only Level-1's).
    assert {e.tier for e in desk.publisher.of(topics.ANNOTATIONS_COMPLETED)} == {common_pb2.TIER_LEVEL_2}
    assert desk.publisher.of(topics.REWARDS_SCORED) == [] and desk.publisher.of(topics.ROLLOUT_LOG) == []


def test_gold_items_are_mixed_in_hidden_and_never_rewards(redis_client, content) -> None:
    gold = [GoldItem(f"What is 2 + 2? {uuid.uuid4()}", "4", 5.0), GoldItem(f"Capital of France? {uuid.uuid4()}",
                                                                          "Berlin", 0.0)]
    desk = Desk(redis_client, content, gold_share=1.0, gold=gold)
    try:
        real = desk.queue(sample(content))
        desk.loop.step()  # loads the gold set
        assert desk.store.status().gold_items == 2
        first = desk.next("ann")
        assert first.item_id.startswith("gold-") and first.prompt == gold[0].prompt
        assert "gold" not in annotation_pb2.NextResponse.DESCRIPTOR.fields_by_name
        desk.score("ann", first.item_id, 4.0)
        second = desk.next("ann")
        assert second.prompt == gold[1].prompt
        desk.score("ann", second.item_id, 1.0)
        assert desk.next("ann").item_id == real  # every gold item scored once: the real queue
        assert desk.next("bob").item_id == first.item_id  # each annotator scores each gold item
        desk.loop.step()
        desk.loop.step()
        completions = desk.publisher.of(topics.ANNOTATIONS_COMPLETED)
        assert sorted((c.score, c.gold) for c in completions) == [(1.0, True), (4.0, True)]
        assert desk.publisher.of(topics.REWARDS_SCORED) == []
        status = desk.store.status()
        assert (status.annotators["ann"].gold_scored, status.annotators["ann"].scored) == (2, 0)
        assert desk.store.load_gold(gold[:1]) == [first.item_id]  # the file shrank: the other retires
        retired = refused(lambda: desk.score("bob", second.item_id, 3.0))
        assert retired.code() == grpc.StatusCode.FAILED_PRECONDITION
    finally:
        desk.close()


def test_the_annotator_is_the_tokens_client(redis_client, content, tmp_path: Path) -> None:
    ann_token, bob_token = "ann-token-0123456789", "bob-token-0123456789"
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"{token_line('ann', ann_token)}\n{token_line('bob', bob_token)}\n")
    desk = Desk(redis_client, content, tokens=TokenTable.load(tokens_file),
                server_settings=StrataSettings(grpc_tokens_file=tokens_file))
    try:
        item = desk.queue(sample(content))
        missing = refused(lambda: desk.next(""))
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in missing.details()
        with with_bearer(grpc.insecure_channel(f"127.0.0.1:{desk.server.port}"), "wrong-token-0123456789") as wrong:
            error = refused(lambda: annotation_pb2_grpc.AnnotationStub(wrong).Next(annotation_pb2.NextRequest(),
                                                                                    timeout=10))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED and "unknown bearer token" in error.details()
        with with_bearer(grpc.insecure_channel(f"127.0.0.1:{desk.server.port}"), ann_token) as channel:
            stub = annotation_pb2_grpc.AnnotationStub(channel)
            assert stub.Next(annotation_pb2.NextRequest(), timeout=10).item_id == item
            posing = refused(lambda: stub.Next(annotation_pb2.NextRequest(annotator_id="bob"), timeout=10))
            assert posing.code() == grpc.StatusCode.PERMISSION_DENIED and "your token is ann's" in posing.details()
            stub.Score(annotation_pb2.AnnotationScoreRequest(item_id=item, score=2.0), timeout=10)
        assert desk.store.status().annotators["ann"].scored == 1
    finally:
        desk.close()


# -- the whole service, fed over Kafka ---------------------------------------------------------------

class Events:
    """Every event of the output topics since the module started."""

    def __init__(self, infra: StrataSettings) -> None:
        self.reader = TailReader(infra, [topics.ANNOTATIONS_COMPLETED, topics.REWARDS_SCORED, topics.ROLLOUT_LOG],
                                 client_id=f"test-annotation-{uuid.uuid4().hex[:6]}")
        self.reader.seek_to_end()
        self.seen: list[tuple[str, object]] = []

    def of(self, topic, response_hash: str) -> list:
        return [m for name, m in self.seen if name == topic.name and m.response_hash == response_hash]  # type: ignore[attr-defined]

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + TIMEOUT_S
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.seen.extend((topic.name, message) for topic, message in self.reader.poll(0.2))

    def drain(self) -> None:
        """Read everything published so far."""
        ends = self.reader.end_offsets()
        self.wait_for(lambda: self.reader.reached(ends), "the end of the output topics")


class Service:
    def __init__(self, settings: AnnotationSettings) -> None:
        self.clock = Clock()
        self.parts: ServiceParts = build(settings, clock=self.clock)
        self.servicer: AnnotationServicer = self.parts.bindings[0].servicer
        self.store = self.servicer.store
        self.running = start_service(self.parts)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.running.port}")
        self.stub = annotation_pb2_grpc.AnnotationStub(self.channel)

    @property
    def worker(self):
        return self.parts.workers[0]

    def stop(self) -> None:
        self.channel.close()
        stop_service(self.parts, self.running, grace_s=0.5)


@pytest.fixture(scope="module")
def service_settings(infra: StrataSettings) -> AnnotationSettings:
    tag = uuid.uuid4().hex[:8]
    settings = AnnotationSettings(**{**infra.model_dump(), "grpc_port": 0, "group_id": f"test-annotation-{tag}",
                                     "redis_prefix": f"test:annotation:{tag}", "double_share": 0.5,
                                     "gold_share": 0.0, "loop_interval_s": 0.05, "assignment_ttl_s": TTL_S,
                                     "annotation_deadline_s": DEADLINE_S, "web_port": 0})
    start_group_at_end(infra.kafka_address, settings.group_id, [topics.ANNOTATIONS_REQUESTED])
    return settings


@pytest.fixture(scope="module")
def service(service_settings: AnnotationSettings) -> Iterator[Service]:
    running = Service(service_settings)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def events(infra: StrataSettings) -> Events:
    return Events(infra)


@pytest.fixture(scope="module")
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra, client_id="test-annotation")
    yield pub
    pub.close()


def queued(service: Service, event: events_pb2.AnnotationRequested) -> str:
    wanted = item_id(event)
    eventually(lambda: service.store.item(wanted), f"item {wanted} queued")
    return wanted


def settled(service: Service, item: str) -> bool:
    return all(ready.item.item_id != item for ready in service.store.outbox(1000))


def test_scores_given_over_grpc_close_the_loop_on_kafka(service: Service, events: Events, publisher: Publisher,
                                                        content, redis_client) -> None:
    event = sample(content, double=False)
    finals_before = int(redis_client.hget(ledger.COUNTS_KEY, "final_tier2") or 0)
    publisher.publish_and_wait(topics.ANNOTATIONS_REQUESTED, event)
    item = queued(service, event)
    offer = service.stub.Next(annotation_pb2.NextRequest(annotator_id="ann"), timeout=10)
    assert offer.item_id == item and offer.response == content.get_text(event.response_hash)
    service.stub.Score(annotation_pb2.AnnotationScoreRequest(annotator_id="ann", item_id=item, score=1.5,
                                                             off_topic=True), timeout=10)
    events.wait_for(lambda: events.of(topics.REWARDS_SCORED, event.response_hash), "the final reward")
    eventually(lambda: settled(service, item), "the item settled")
    events.drain()
    [completed] = events.of(topics.ANNOTATIONS_COMPLETED, event.response_hash)
    assert (completed.annotator_id, completed.score, completed.off_topic, completed.gold) == ("ann", 1.5, True, False)
    assert (completed.request_id, completed.policy_version, completed.rm_version) == (
        event.provisional.request_id, 3, "strong-test")
    [final] = events.of(topics.REWARDS_SCORED, event.response_hash)
    assert (final.final, final.scorer, final.reward, final.annotator_id) == (True, common_pb2.SCORER_HUMAN, 1.5, "ann")
    assert [r.reward for r in events.of(topics.ROLLOUT_LOG, event.response_hash)] == [1.5]
    assert int(redis_client.hget(ledger.COUNTS_KEY, "final_tier2") or 0) == finals_before + 1
    status = service.stub.Status(annotation_pb2.StatusRequest(), timeout=10)
    assert status.annotators["ann"].scored >= 1 and status.completed >= 1


def test_two_annotators_agree_over_kafka_and_one_final_reward_comes_out(service: Service, events: Events,
                                                                        publisher: Publisher, content) -> None:
    event = sample(content, double=True)
    publisher.publish_and_wait(topics.ANNOTATIONS_REQUESTED, event)
    item = queued(service, event)
    for who, score in (("ann", 4.0), ("bob", 5.0)):
        assert service.stub.Next(annotation_pb2.NextRequest(annotator_id=who), timeout=10).item_id == item
        service.stub.Score(annotation_pb2.AnnotationScoreRequest(annotator_id=who, item_id=item, score=score),
                           timeout=10)
    events.wait_for(lambda: events.of(topics.REWARDS_SCORED, event.response_hash), "the final reward")
    eventually(lambda: settled(service, item), "the item settled")
    events.drain()
    assert sorted(c.annotator_id for c in events.of(topics.ANNOTATIONS_COMPLETED, event.response_hash)) == ["ann",
                                                                                                            "bob"]
    [final] = events.of(topics.REWARDS_SCORED, event.response_hash)
    assert (final.reward, final.annotator_id, final.scorer) == (4.5, "ann,bob", common_pb2.SCORER_HUMAN)


def test_a_redelivered_request_adds_nothing(service: Service, publisher: Publisher, content) -> None:
    event = sample(content, double=False)
    handled = service.worker.handled
    enqueued = service.store.status().enqueued
    for _ in range(2):
        publisher.publish_and_wait(topics.ANNOTATIONS_REQUESTED, event)
    eventually(lambda: service.worker.handled >= handled + 2, "both deliveries handled")
    assert service.store.status().enqueued == enqueued + 1
    item = item_id(event)
    assert service.stub.Next(annotation_pb2.NextRequest(annotator_id="cid"), timeout=10).item_id == item
    service.stub.Score(annotation_pb2.AnnotationScoreRequest(annotator_id="cid", item_id=item, score=3.0), timeout=10)
    assert not service.stub.Next(annotation_pb2.NextRequest(annotator_id="dan"), timeout=10).has_item


def test_a_request_whose_texts_are_missing_is_dead_lettered(service: Service, publisher: Publisher, content) -> None:
    event = sample(content)
    event.response_hash = event.provisional.response_hash = "f" * 64  # never stored
    dead = service.worker.dead_lettered
    publisher.publish_and_wait(topics.ANNOTATIONS_REQUESTED, event)
    eventually(lambda: service.worker.dead_lettered > dead, "the request dead-lettered")
    assert service.store.item(item_id(event)) is None


def test_past_the_deadline_the_provisional_reward_becomes_final(service: Service, events: Events,
                                                                publisher: Publisher, content) -> None:
    event = sample(content, double=False)
    publisher.publish_and_wait(topics.ANNOTATIONS_REQUESTED, event)
    item = queued(service, event)
    service.clock.advance(DEADLINE_S + 1)
    events.wait_for(lambda: events.of(topics.REWARDS_SCORED, event.response_hash), "the provisional reward as final")
    eventually(lambda: settled(service, item), "the item settled")
    events.drain()
    [final] = events.of(topics.REWARDS_SCORED, event.response_hash)
    assert (final.final, final.awaiting_annotation, final.scorer, final.reward) == (True, False,
                                                                                    common_pb2.SCORER_STRONG, 4.25)
    assert events.of(topics.ANNOTATIONS_COMPLETED, event.response_hash) == []
    assert service.stub.Status(annotation_pb2.StatusRequest(), timeout=10).expired >= 1


# -- the entry point ---------------------------------------------------------------------------------

def test_python_m_svc_annotation_serves_loads_gold_and_stops_on_sigterm(infra: StrataSettings,
                                                                         tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    gold = tmp_path / "gold.jsonl"
    gold.write_text('{"prompt": "What is 2 + 2?", "response": "4", "score": 5}\n\n')
    group = f"test-annotation-main-{tag}"
    start_group_at_end(infra.kafka_address, group, [topics.ANNOTATIONS_REQUESTED])
    port = free_port()
    env = {**os.environ, "STRATA_KAFKA_BOOTSTRAP": infra.kafka_address, "STRATA_REDIS_URL": infra.redis_address}
    argv = [sys.executable, "-m", "svc_annotation", "--grpc-port", str(port), "--group-id", group,
            "--redis-prefix", f"test:annotation:main:{tag}", "--loop-interval-s", "0.1",
            "--web-port", "0"]
    log = tmp_path / "svc_annotation.log"
    with log.open("w") as out:
        process = subprocess.Popen([*argv, "--gold-items-path", str(gold)], env=env, stdout=out, stderr=out)
    try:
        eventually(lambda: health(port) or process.poll() is not None, "the service's health check")
        assert process.poll() is None, log.read_text()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = annotation_pb2_grpc.AnnotationStub(channel)
            eventually(lambda: stub.Status(annotation_pb2.StatusRequest(), timeout=5).gold_items == 1,
                       "the gold set loaded")
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)

    gold.write_text('{"prompt": "What is 2 + 2?", "response": "4", "score": 5}\n{"prompt": "secret", "score": 9}\n')
    failed = subprocess.run([*argv, "--gold-items-path", str(gold)], env=env, capture_output=True, text=True,
                            timeout=60)
    assert failed.returncode != 0 and f"{gold}:2: response must be a non-empty string" in failed.stderr
    assert "secret" not in failed.stderr
