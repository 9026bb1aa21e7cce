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
