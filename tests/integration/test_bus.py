"""The bus against the real broker: delivery, commit-after-success, redelivery, dead letters."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from kafka import KafkaConsumer

from strata.bus import Delivery, Publisher, Topic, TransientError, Worker
from strata.bus.admin import ensure_topics
from strata.bus.follow import VersionFollower
from strata.bus.security import kafka_connection
from strata.config import StrataSettings
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0


def routed(text: str) -> events_pb2.PromptRouted:
    message = events_pb2.PromptRouted(prompt_hash=content_hash(text), tier=common_pb2.TIER_LEVEL_1, n_samples=1)
    message.routed_at.GetCurrentTime()
    return message


@pytest.fixture
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra, client_id="test")
    yield pub
    pub.close()


def poll_until(worker: Worker, done: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    """Drive the worker's loop until ``done()``; fail after the timeout (no sleeps)."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "condition not reached in time"
        worker.poll_once(0.2)


def make_worker(infra: StrataSettings, topic: Topic, group: str, handler, publisher: Publisher) -> Worker:
    worker = Worker(infra, group, {topic: handler}, publisher)
    worker.connect()
    return worker


def read_dlq(infra: StrataSettings, topic: Topic, count: int) -> list:
    consumer = KafkaConsumer(topic.dlq, **kafka_connection(infra), auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(TIMEOUT_S * 1000))
    records = []
    try:
        for record in consumer:
            records.append(record)
            if len(records) == count:
                break
    finally:
        consumer.close()
    return records


def test_published_event_reaches_the_group(infra, publisher, fresh_topic) -> None:
    sent = [routed(f"prompt {i} {uuid.uuid4()}") for i in range(5)]
    for message in sent:
        publisher.publish(fresh_topic, message)
    publisher.flush()
    seen: list[Delivery] = []
    worker = make_worker(infra, fresh_topic, f"g-{uuid.uuid4().hex[:6]}", seen.append, publisher)
    try:
        poll_until(worker, lambda: len(seen) == len(sent))
    finally:
        worker.close()
    assert sorted(d.message.prompt_hash for d in seen) == sorted(m.prompt_hash for m in sent)
    assert all(d.key == d.message.prompt_hash.encode() for d in seen)
    assert all(d.attempt == 1 for d in seen)


def test_failed_handler_leaves_offset_uncommitted_and_committed_is_not_redelivered(
    infra, publisher, fresh_topic
) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    ok_message, failing_message = routed(f"ok {uuid.uuid4()}"), routed(f"fails {uuid.uuid4()}")
    publisher.publish_and_wait(fresh_topic, ok_message)
    publisher.publish_and_wait(fresh_topic, failing_message)

    handled: list[str] = []
    failures: list[str] = []

    def flaky(delivery: Delivery) -> None:
        if delivery.message.prompt_hash == failing_message.prompt_hash:
            failures.append(delivery.message.prompt_hash)
            raise TransientError("Redis is down")  # an outage: retried, never dead-lettered
        handled.append(delivery.message.prompt_hash)

    first = make_worker(infra, fresh_topic, group, flaky, publisher)
    try:
        poll_until(first, lambda: handled == [ok_message.prompt_hash] and len(failures) >= 2)
    finally:
        first.close()  # "crash": leaves the group with the failing offset uncommitted

    redelivered: list[Delivery] = []
    second = make_worker(infra, fresh_topic, group, redelivered.append, publisher)
    try:
        poll_until(second, lambda: len(redelivered) >= 1)
        # A few more polls while owning every partition: the committed message must not come back.
        assert len(second.assignment()) == infra.topic_partitions
        for _ in range(5):
            second.poll_once(0.2)
    finally:
        second.close()
    assert [d.message.prompt_hash for d in redelivered] == [failing_message.prompt_hash]
    assert first.dead_lettered == 0


def test_undecodable_message_goes_to_dlq_and_the_next_is_processed(infra, publisher, fresh_topic) -> None:
    poison_key = content_hash(f"poison {uuid.uuid4()}").encode()
    publisher.publish_raw(fresh_topic.name, poison_key, b"\xff\xff\xff\xff not protobuf")
    good = routed(f"after poison {uuid.uuid4()}")
    # Same key, same partition: the good message is behind the poison one.
    good.prompt_hash = poison_key.decode()
    publisher.publish_and_wait(fresh_topic, good)

    seen: list[Delivery] = []
    worker = make_worker(infra, fresh_topic, f"g-{uuid.uuid4().hex[:6]}", seen.append, publisher)
    try:
        poll_until(worker, lambda: len(seen) == 1)
    finally:
        worker.close()
    assert seen[0].message == good
    assert worker.dead_lettered == 1

    [dead] = read_dlq(infra, fresh_topic, 1)
    headers = dict(dead.headers)
    assert dead.value == b"\xff\xff\xff\xff not protobuf"
    assert dead.key == poison_key
    assert headers["strata-dlq-stage"] == b"decode"
    assert headers["strata-dlq-source-topic"] == fresh_topic.name.encode()
    assert b"not a PromptRouted" in headers["strata-dlq-error"]


def test_handler_that_keeps_failing_is_dead_lettered_after_max_attempts(infra, publisher, fresh_topic) -> None:
    bad, good = routed(f"bug {uuid.uuid4()}"), routed(f"fine {uuid.uuid4()}")
    good.prompt_hash = bad.prompt_hash  # same partition, behind the bad one
    good.n_samples = 2
    publisher.publish_and_wait(fresh_topic, bad)
    publisher.publish_and_wait(fresh_topic, good)
    attempts: list[int] = []
    handled: list[Delivery] = []

    def buggy(delivery: Delivery) -> None:
        if delivery.message.n_samples == 1:
            attempts.append(delivery.attempt)
            raise ValueError("handler bug")
        handled.append(delivery)

    worker = make_worker(infra, fresh_topic, f"g-{uuid.uuid4().hex[:6]}", buggy, publisher)
    try:
        poll_until(worker, lambda: len(handled) == 1)
    finally:
        worker.close()
    assert attempts == list(range(1, infra.max_delivery_attempts + 1))
    [dead] = read_dlq(infra, fresh_topic, 1)
    assert dict(dead.headers)["strata-dlq-stage"] == b"handler"
    assert dict(dead.headers)["strata-dlq-attempts"] == str(infra.max_delivery_attempts).encode()


def test_run_stops_on_event_and_commits(infra, publisher, fresh_topic) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    message = routed(f"run {uuid.uuid4()}")
    publisher.publish_and_wait(fresh_topic, message)
    stop = threading.Event()
    seen: list[Delivery] = []

    def handle(delivery: Delivery) -> None:
        seen.append(delivery)
        stop.set()

    Worker(infra, group, {fresh_topic: handle}, publisher).run(stop)  # returns once stopped
    assert len(seen) == 1
    again: list[Delivery] = []
    follower = make_worker(infra, fresh_topic, group, again.append, publisher)
    try:
        poll_until(follower, lambda: len(follower.assignment()) == infra.topic_partitions)
        for _ in range(5):
            follower.poll_once(0.3)
    finally:
        follower.close()
    assert again == []


def test_batch_handler_gets_events_together_and_a_bad_one_is_isolated(infra, publisher, fresh_topic) -> None:
    messages = [routed(f"batch {i} {uuid.uuid4()}") for i in range(6)]
    bad = messages[3]
    poison_key = content_hash(f"poison {uuid.uuid4()}").encode()
    for message in messages:
        publisher.publish(fresh_topic, message)
    publisher.publish_raw(fresh_topic.name, poison_key, b"\xff\xff\xff")
    publisher.flush()

    batch_sizes: list[int] = []
    handled: list[str] = []

    def handle_batch(deliveries: list[Delivery]) -> None:
        batch_sizes.append(len(deliveries))
        if any(d.message.prompt_hash == bad.prompt_hash for d in deliveries):
            raise ValueError("one bad event in the batch")
        handled.extend(d.message.prompt_hash for d in deliveries)

    worker = Worker(infra, f"g-{uuid.uuid4().hex[:6]}", publisher=publisher, batch_handlers={fresh_topic: handle_batch})
    worker.connect()
    try:
        poll_until(worker, lambda: len(handled) == len(messages) - 1 and worker.dead_lettered == 2)
    finally:
        worker.close()
    assert max(batch_sizes) > 1, "events that arrived together were not handled as one batch"
    assert sorted(handled) == sorted(m.prompt_hash for m in messages if m is not bad)
    dead = read_dlq(infra, fresh_topic, 2)
    stages = sorted(dict(r.headers)["strata-dlq-stage"] for r in dead)
    assert stages == [b"decode", b"handler"]
    assert {r.key for r in dead} == {poison_key, bad.prompt_hash.encode()}


class _Recorder(VersionFollower[events_pb2.PolicyUpdated]):
    """Takes even versions only, as a watcher refuses a version whose weights do not verify."""

    def __init__(self, bootstrap: str, topic: Topic[events_pb2.PolicyUpdated]) -> None:
        super().__init__(bootstrap, topic)
        self.offered: list[int] = []

    def apply(self, event: events_pb2.PolicyUpdated) -> bool:
        self.offered.append(event.policy_version)
        return event.policy_version % 2 == 0


def test_a_version_follower_catches_up_to_the_newest_and_skips_poison(infra: StrataSettings) -> None:
    topic = Topic(f"test.follow.{uuid.uuid4().hex[:8]}", events_pb2.PolicyUpdated, key_field="policy_version")
    ensure_topics(infra, 1, topics=[topic])
    publisher = Publisher(infra, client_id="test-follow")
    try:
        for version in (1, 2):
            publisher.publish(topic, events_pb2.PolicyUpdated(policy_version=version))
        publisher.flush()
        publisher.publish_raw(topic.name, None, b"\xff not a protobuf")  # poison, last on the partition
        follower = _Recorder(infra, topic)
        follower.connect()
        try:
            assert follower.catch_up()  # only the newest decodable announcement: v2
            assert follower.offered == [2]
            publisher.publish(topic, events_pb2.PolicyUpdated(policy_version=3))
            publisher.flush()
            deadline = time.monotonic() + 30
            while follower.offered == [2]:
                assert time.monotonic() < deadline, "the follower never saw v3"
                follower.poll_once(0.5)
            assert follower.offered == [2, 3]  # offered, refused by apply: the caller keeps v2
        finally:
            follower.close()
    finally:
        publisher.close()


@pytest.mark.parametrize("outage", [
    redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist"),
], ids=["down", "oom", "disk-full"])
def test_a_redis_outage_waits_past_max_attempts_and_is_never_dead_lettered(infra, publisher, fresh_topic,
                                                                           outage: Exception) -> None:
    # redis-py's errors are not Python's ConnectionError: before strata.bus.errors they counted as a
    # handler bug, and the event was dead-lettered after max_delivery_attempts.
    message = routed(f"during an outage {uuid.uuid4()}")
    publisher.publish_and_wait(fresh_topic, message)
    attempts: list[int] = []

    def redis_down_for_a_while(delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        if len(attempts) <= infra.max_delivery_attempts + 1:
            raise outage

    worker = make_worker(infra, fresh_topic, f"g-{uuid.uuid4().hex[:6]}", redis_down_for_a_while, publisher)
    try:
        poll_until(worker, lambda: len(attempts) == infra.max_delivery_attempts + 2)
    finally:
        worker.close()
    assert worker.dead_lettered == 0
    assert worker.handled == 1


def test_a_record_near_the_size_limit_is_dead_lettered_without_its_bytes(infra, publisher, fresh_topic) -> None:
    # With the DLQ headers, a record just under the 1 MiB limit no longer fits: publishing its copy
    # failed and the worker crashed on the same record at every restart.
    big = routed(f"big {uuid.uuid4()}")
    big.reason = "x" * 1_047_300  # the record fits the 1 MiB limit; with 2 KB of DLQ headers it does not
    key, value = big.prompt_hash.encode(), big.SerializeToString()
    publisher.publish_raw(fresh_topic.name, key, value)

    def rejects(delivery: Delivery) -> None:
        raise ValueError("cannot use this event: " + "y" * 3000)

    worker = make_worker(infra, fresh_topic, f"g-{uuid.uuid4().hex[:6]}", rejects, publisher)
    try:
        poll_until(worker, lambda: worker.dead_lettered == 1)
    finally:
        worker.close()
    [dead] = read_dlq(infra, fresh_topic, 1)
    headers = dict(dead.headers)
    assert dead.value in (b"", None) and dead.key == key
    assert headers["strata-dlq-value-dropped"].startswith(f"{len(value)} bytes, sha256 ".encode())
    assert headers["strata-dlq-source-offset"] == b"0"


def test_a_rebalance_that_finishes_between_short_polls_is_applied(infra: StrataSettings) -> None:
    """kafka-python 3.0 drops a JoinGroup/SyncGroup round that a metadata change started and that
    finished after its poll gave up: the member keeps no partitions and never asks again
    (strata/bus/kafka_fixes.py). Partitions added under a consumer polling in 1 ms slices start
    exactly that round; every partition must be served once it is over."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewPartitions

    topic = Topic(f"test.{uuid.uuid4().hex[:10]}", events_pb2.PromptRouted)
    ensure_topics(infra, 1, topics=[topic])
    consumer = KafkaConsumer(**kafka_connection(infra), group_id=f"g-{uuid.uuid4().hex[:6]}",
                             auto_offset_reset="earliest", enable_auto_commit=False, metadata_max_age_ms=300,
                             session_timeout_ms=infra.consumer_session_timeout_ms,
                             heartbeat_interval_ms=infra.consumer_heartbeat_interval_ms)
    admin = KafkaAdminClient(**kafka_connection(infra))
    producer = KafkaProducer(**kafka_connection(infra))
    try:
        consumer.subscribe([topic.name])
        deadline = time.monotonic() + TIMEOUT_S
        while not consumer.assignment():
            assert time.monotonic() < deadline, "the first assignment never came"
            consumer.poll(timeout_ms=200)
        admin.create_partitions({topic.name: NewPartitions(4)})
        for partition in range(4):
            producer.send(topic.name, b"x", partition=partition).get(timeout=30)
        served: set[int] = set()
        deadline = time.monotonic() + TIMEOUT_S
        while served != {0, 1, 2, 3}:
            assert time.monotonic() < deadline, f"served {sorted(served)}, assigned {consumer.assignment()}"
            served |= {tp.partition for tp in consumer.poll(timeout_ms=1)}
    finally:
        producer.close()
        admin.close()
        consumer.close(autocommit=False)
