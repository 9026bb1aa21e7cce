"""Topic creation: every Strata topic and its dead-letter twin, idempotently."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

from strata.bus.topics import ALL_TOPICS, SINGLE_PARTITION_TOPICS, Topic

log = logging.getLogger(__name__)


def ensure_topics(
    bootstrap: str,
    partitions: int,
    topics: Iterable[Topic] = ALL_TOPICS,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create missing topics (and their ``.dlq`` twins); return the names created."""
    wanted: dict[str, int] = {}
    for topic in topics:
        wanted[topic.name] = 1 if topic.name in SINGLE_PARTITION_TOPICS else partitions
        wanted[topic.dlq] = 1
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="strata-admin",
                             request_timeout_ms=int(timeout_s * 1000))
    try:
        existing = set(admin.list_topics())
        missing = [
            NewTopic(name=name, num_partitions=count, replication_factor=replication_factor)
            for name, count in wanted.items()
            if name not in existing
        ]
        created: list[str] = []
        for new_topic in missing:
            try:
                admin.create_topics([new_topic], timeout_ms=int(timeout_s * 1000))
                created.append(new_topic.name)
            except TopicAlreadyExistsError:
                pass  # another process created it meanwhile
        if created:
            log.info("created %d topics: %s", len(created), ", ".join(created))
        return created
    finally:
        admin.close()


def start_group_at_end(bootstrap: str, group: str, topic_list: Iterable[Topic]) -> None:
    """Commit the end of each topic for a new consumer group before its worker starts, so that it
    skips the topic's history (a fresh group would replay it from the beginning)."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        partitions = [
            TopicPartition(t.name, p) for t in topic_list for p in sorted(consumer.partitions_for_topic(t.name) or ())
        ]
        consumer.assign(partitions)
        consumer.seek_to_end(*partitions)
        consumer.commit({tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in partitions})
    finally:
        consumer.close()


def consumer_lags(bootstrap: str, groups: Iterable[str], client_id: str = "strata",
                  timeout_ms: int = 4000) -> dict[tuple[str, str], int]:
    """(group, topic) -> events published but not yet committed by the group (groups with no commits
    are left out). Short timeouts: callers (a status line, a Prometheus scrape) must answer even with
    Kafka down; errors propagate."""
    from kafka import KafkaConsumer

    groups = list(groups)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms,
                             bootstrap_timeout_ms=min(timeout_ms, 3000), client_id=client_id)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             client_id=client_id)
    lags: dict[tuple[str, str], int] = {}
    try:
        # kafka-python 3: {group: {TopicPartition: OffsetAndMetadata}} (older: list_consumer_group_offsets)
        offsets = admin.list_group_offsets(dict.fromkeys(groups)) if groups else {}
        for group in groups:
            committed = {tp: meta for tp, meta in (offsets.get(group) or {}).items() if meta.offset >= 0}
            if not committed:
                continue
            ends = consumer.end_offsets(list(committed))
            for tp, meta in committed.items():
                key = (group, tp.topic)
                lags[key] = lags.get(key, 0) + max(0, ends[tp] - meta.offset)
    finally:
        admin.close()
        consumer.close()
    return lags
