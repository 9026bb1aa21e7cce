"""Beyond one host, on this one: a three-broker Kafka with replicated topics and a Redis primary with a
replica and three Sentinels (`strata infra up --brokers 3 --redis-replicas 1`), each losing its
leader or primary to SIGKILL while Strata's own clients keep working."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaAdminClient, KafkaConsumer

from strata import redis_client
from strata.bus import Publisher, Topic
from strata.bus.admin import ensure_topics
from strata.bus.security import kafka_connection
from strata.config import StrataSettings
from strata.content_store import ContentStore, StoreUnavailableError
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2
from strata_tools.infra import down, kafka_broker, redis_server, status, up
from strata_tools.infra.process import free_port_block
from svc_generator.worker import claim

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StrataSettings]:
    kafka_base, redis_base = free_port_block(6), free_port_block(5)
    settings = StrataSettings(
        state_dir=Path(tmp_path_factory.mktemp("strata-cluster")), kafka_brokers=3, redis_replicas=1,
        kafka_port=kafka_base, kafka_controller_port=kafka_base + 1, redis_port=redis_base,
        topic_partitions=3,
    )
    up(settings)
    try:
        yield settings
    finally:
        down(settings, purge=True)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> float:
    """Seconds until ``condition()`` held; fails naming ``what`` after the timeout."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s:.0f} s"
        time.sleep(0.2)  # interval between reads of a real condition
    return time.monotonic() - started


def partitions(settings: StrataSettings, topic: str) -> list[dict]:
    admin = KafkaAdminClient(**kafka_connection(settings))
    try:
        return admin.describe_topics([topic])[0]["partitions"]
    finally:
        admin.close()


def routed(text: str) -> events_pb2.PromptRouted:
    return events_pb2.PromptRouted(prompt_hash=content_hash(text), tier=common_pb2.TIER_LEVEL_1, n_samples=1)


def read_all(settings: StrataSettings, topic: Topic, count: int) -> set[str]:
    consumer = KafkaConsumer(topic.name, **kafka_connection(settings), auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=int(TIMEOUT_S * 1000))
    seen: set[str] = set()
    try:
        for record in consumer:
            seen.add(events_pb2.PromptRouted.FromString(record.value).prompt_hash)
            if len(seen) >= count:
                break
    finally:
        consumer.close()
    return seen


def test_strata_topics_are_replicated_three_times_with_two_in_sync(cluster: StrataSettings) -> None:
    assert cluster.replication_factor == 3 and cluster.min_insync_replicas == 2
    for partition in partitions(cluster, "strata.rewards.scored"):
        assert sorted(partition["replica_nodes"]) == [1, 2, 3]
    rows = {row.name: row for row in status(cluster)}
    assert {"kafka-1", "kafka-2", "kafka-3", "redis", "redis-replica-1", "redis-sentinel-3"} <= set(rows)
    assert all(row.healthy for row in rows.values()), rows


def test_publishing_rides_out_the_leader_broker_killed(cluster: StrataSettings) -> None:
    topic = Topic(f"test.cluster.{uuid.uuid4().hex[:8]}", events_pb2.PromptRouted)
    ensure_topics(cluster, 1, topics=[topic], replication_factor=3, min_insync_replicas=2)
    publisher = Publisher(cluster, client_id="test-cluster")
    sent: set[str] = set()
    try:
        for i in range(20):
            message = routed(f"before {i}")
            publisher.publish_and_wait(topic, message)
            sent.add(message.prompt_hash)
        leader = partitions(cluster, topic.name)[0]["leader_id"]
        assert kafka_broker.stop_node(cluster, leader, kill=True)
        # acks=all with two of three in sync: every send after the crash is written, once.
        for i in range(20):
            message = routed(f"after {i}")
            publisher.publish_and_wait(topic, message, timeout_s=TIMEOUT_S)
            sent.add(message.prompt_hash)
        assert partitions(cluster, topic.name)[0]["leader_id"] != leader
        assert read_all(cluster, topic, len(sent)) == sent
    finally:
        publisher.close()
        kafka_broker.start_node(cluster, leader)
    wait_for(lambda: len(partitions(cluster, topic.name)[0]["isr_nodes"]) == 3, "the restarted broker back in sync")


def test_the_content_store_follows_sentinel_to_the_promoted_replica(cluster: StrataSettings) -> None:
    store = ContentStore.from_url(cluster.redis_address, cluster.content_ttl_s, cluster.content_max_bytes)
    before = store.put("written before the primary dies")
    first_primary = redis_server.current_primary_port(cluster)
    primary = next(node for node in redis_server.redis_nodes(cluster) if node.port == first_primary)
    # The replica must hold the write before the crash: replication is asynchronous (docs/deploy.md).
    store_client = redis_client.connect(redis_server.node_url(cluster, primary))
    try:
        store_client.execute_command("WAIT", 1, 5000)
    finally:
        store_client.close()
    assert redis_server.stop_node(cluster, primary, kill=True)

    def writes() -> bool:
        try:
            store.put("written after the failover")
            return True
        except (StoreUnavailableError, redis.RedisError):
            return False

    wait_for(writes, "a write through the Sentinels after the primary was killed")
    assert redis_server.current_primary_port(cluster) != first_primary
    assert store.get_text(before) == "written before the primary dies"

    redis_server.start_node(cluster, primary)
    restarted = redis_client.connect(redis_server.node_url(cluster, primary))
    try:
        # It comes back as a replica of the promoted node, never as a second primary.
        assert restarted.info("replication")["role"] == "slave"
    finally:
        restarted.close()


def test_a_generator_claim_is_on_the_replica_before_the_generator_goes_on(cluster: StrataSettings) -> None:
    client = redis_client.connect(cluster.redis_address, socket_timeout=10)
    key = f"strata:gen:claim:1:{uuid.uuid4().hex}:request:0"
    try:
        assert claim(client, key, b"the first response", 60, wait_replicas=1, wait_timeout_ms=5000)
        assert not claim(client, key, b"a second response", 60, wait_replicas=1, wait_timeout_ms=5000)
    finally:
        client.close()
    primary = redis_server.current_primary_port(cluster)
    replica_node = next(n for n in redis_server.redis_nodes(cluster) if n.role != "sentinel" and n.port != primary)
    replica = redis_client.connect(redis_server.node_url(cluster, replica_node))
    try:
        # WAIT returned once the replica had it: a failover from here on promotes a node that knows the claim.
        assert replica.get(key) == b"the first response"
    finally:
        replica.close()
