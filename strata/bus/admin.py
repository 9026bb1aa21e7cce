"""Topic creation: every Strata topic and its dead-letter twin, idempotently."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata

from strata.bus.security import KafkaTarget, kafka_connection
from strata.bus.topics import ALL_TOPICS, SINGLE_PARTITION_TOPICS, Topic

log = logging.getLogger(__name__)

COMPACT = {"cleanup.policy": "compact"}


def ensure_topics(
    cluster: KafkaTarget,
    partitions: int,
    topics: Iterable[Topic] = ALL_TOPICS,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
    min_insync_replicas: int | None = None,
) -> list[str]:
    """Create missing topics (and their ``.dlq`` twins); return the names created.

    Compacted topics get ``cleanup.policy=compact``, also when they exist already with Kafka's
    default (deletion after 7 days), so an upgraded cluster stops losing its control events.
    ``min_insync_replicas`` (with producers' ``acks=all``): how many copies an event must have before
    its publisher hears it is written; unset, the broker's default. Existing topics keep theirs:
    changing a live topic's replication is an operator's reassignment, not a start-up step.
    """
    topic_list = list(topics)
    wanted: dict[str, int] = {}
    for topic in topic_list:
        wanted[topic.name] = 1 if topic.name in SINGLE_PARTITION_TOPICS else partitions
        wanted[topic.dlq] = 1
    compacted = {topic.name for topic in topic_list if topic.compacted}
    isr = {"min.insync.replicas": str(min_insync_replicas)} if min_insync_replicas is not None else {}
    admin = KafkaAdminClient(**kafka_connection(cluster), client_id="strata-admin",
                             request_timeout_ms=int(timeout_s * 1000))
    try:
        existing = set(admin.list_topics())
        missing = [
            NewTopic(name=name, num_partitions=count, replication_factor=replication_factor,
                     topic_configs={**(COMPACT if name in compacted else {}), **isr})
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
        _compact_existing(admin, sorted((compacted & existing) - set(created)))
        return created
    finally:
        admin.close()


def _compact_existing(admin: KafkaAdminClient, names: list[str]) -> None:
    """Switch existing topics that should be compacted but are not."""
    for name in names:
        policy = _cleanup_policy(admin, name)
        if policy != "compact":
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs=COMPACT)])
            log.warning("topic %s had cleanup.policy=%s: now compacted, so its events outlive retention",
                        name, policy)


def _cleanup_policy(admin: KafkaAdminClient, name: str) -> str | None:
    resource = ConfigResource(ConfigResourceType.TOPIC, name, configs={"cleanup.policy": None})
    described = admin.describe_configs([resource], config_filter="all")  # {type: {name: {key: {...}}}}
    entry = described.get("topic", {}).get(name, {}).get("cleanup.policy")
    return entry["value"] if entry else None


def topic_cleanup_policy(cluster: KafkaTarget, name: str, timeout_s: float = 10.0) -> str | None:
    """The ``cleanup.policy`` a topic has (``delete`` or ``compact``); None if it is not known in time
    (a topic just created is described once its metadata has reached the broker)."""
    admin = KafkaAdminClient(**kafka_connection(cluster), client_id="strata-admin")
    deadline = time.monotonic() + timeout_s
    try:
        while (policy := _cleanup_policy(admin, name)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return policy
    finally:
        admin.close()


def start_group_at_end(cluster: KafkaTarget, group: str, topic_list: Iterable[Topic]) -> None:
    """Commit the end of each topic for a new consumer group before its worker starts, so that it
    skips the topic's history (a fresh group would replay it from the beginning)."""
    consumer = KafkaConsumer(**kafka_connection(cluster), group_id=group, enable_auto_commit=False)
    try:
        partitions = [
            TopicPartition(t.name, p) for t in topic_list for p in sorted(consumer.partitions_for_topic(t.name) or ())
        ]
        consumer.assign(partitions)
        consumer.seek_to_end(*partitions)
        consumer.commit({tp: OffsetAndMetadata(consumer.position(tp), "", -1) for tp in partitions})
    finally:
        consumer.close()


@dataclass(frozen=True)
class GroupPosition:
    """Where a consumer group stands on one topic, summed over the partitions it committed on."""

    committed: int  # offsets committed: how far it has worked (its advance over time is its drain rate)
    lag: int  # events published past its commits: what it has yet to do


class LagReader:
    """Consumer groups' committed offsets against the topics' ends, its clients kept open between
    reads (the scheduler's backlog gauge reads every second; :func:`consumer_lags` reads once). Short
    timeouts: callers must answer even with Kafka down; errors propagate."""

    def __init__(self, cluster: KafkaTarget, client_id: str = "strata", timeout_ms: int = 4000) -> None:
        self.timeout_ms = timeout_ms
        self.admin = KafkaAdminClient(**kafka_connection(cluster), request_timeout_ms=timeout_ms,
                                      bootstrap_timeout_ms=min(timeout_ms, 3000), client_id=client_id)
        try:
            self.consumer = KafkaConsumer(**kafka_connection(cluster), group_id=None, enable_auto_commit=False,
                                          client_id=client_id, request_timeout_ms=max(timeout_ms, 1000))
        except Exception:
            self.admin.close()
            raise

    def positions(self, groups: Iterable[str]) -> dict[tuple[str, str], GroupPosition]:
        """(group, topic) -> its position; groups with no commits are left out."""
        groups = list(groups)
        # kafka-python 3: {group: {TopicPartition: OffsetAndMetadata}} (older: list_consumer_group_offsets)
        offsets = self.admin.list_group_offsets(dict.fromkeys(groups)) if groups else {}
        out: dict[tuple[str, str], GroupPosition] = {}
        for group in groups:
            committed = {tp: meta for tp, meta in (offsets.get(group) or {}).items() if meta.offset >= 0}
            if not committed:
                continue
            # kafka-python lists offsets only for partitions in its metadata cache and leaves the others out
            # of the answer: load each topic's partitions first.
            for topic in sorted({tp.topic for tp in committed}):
                self.consumer.partitions_for_topic(topic)
            ends = self.consumer.end_offsets(list(committed), timeout_ms=self.timeout_ms)
            for tp, meta in committed.items():
                if tp not in ends:  # the broker gave no end offset (kafka-python leaves it out): unknown
                    log.debug("no end offset for %s[%d]: group %s's lag there is unknown", tp.topic, tp.partition,
                              group)
                    continue
                key = (group, tp.topic)
                before = out.get(key, GroupPosition(0, 0))
                out[key] = GroupPosition(before.committed + meta.offset,
                                         before.lag + max(0, ends[tp] - meta.offset))
        return out

    def active(self, groups: Iterable[str]) -> set[str]:
        """The groups that have members now (a group whose consumers are all gone keeps its commits)."""
        groups = list(groups)
        described = self.admin.describe_groups(groups) if groups else {}
        return {group for group, info in described.items() if not info.get("error") and info.get("members")}

    def close(self) -> None:
        self.admin.close()
        self.consumer.close()


def consumer_lags(cluster: KafkaTarget, groups: Iterable[str], client_id: str = "strata",
                  timeout_ms: int = 4000) -> dict[tuple[str, str], int]:
    """(group, topic) -> events published but not yet committed by the group (groups with no commits
    are left out). Short timeouts: callers (a status line, a Prometheus scrape) must answer even with
    Kafka down; errors propagate."""
    reader = LagReader(cluster, client_id, timeout_ms)
    try:
        return {key: position.lag for key, position in reader.positions(groups).items()}
    finally:
        reader.close()


def resume_offsets(cluster: KafkaTarget, group: str, topic: Topic) -> dict[int, int]:
    """Per partition, where ``group`` resumes on ``topic``: its committed offset, else the beginning."""
    consumer = KafkaConsumer(**kafka_connection(cluster), group_id=group, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic.name, p) for p in sorted(consumer.partitions_for_topic(topic.name) or ())]
        beginning = consumer.beginning_offsets(partitions)
        offsets = {}
        for tp in partitions:
            committed = consumer.committed(tp)
            offsets[tp.partition] = committed if committed is not None else beginning[tp]
        return offsets
    finally:
        consumer.close(autocommit=False)


def events_retained(cluster: KafkaTarget, topic: Topic) -> int:
    """How many events ``topic`` holds now (end minus beginning offsets, over its partitions)."""
    consumer = KafkaConsumer(**kafka_connection(cluster), enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic.name, p) for p in sorted(consumer.partitions_for_topic(topic.name) or ())]
        beginning, end = consumer.beginning_offsets(partitions), consumer.end_offsets(partitions)
        return sum(end[tp] - beginning[tp] for tp in partitions)
    finally:
        consumer.close(autocommit=False)


class GroupLag:
    """Whether a consumer group has committed everything published so far on some topics."""

    def __init__(self, cluster: KafkaTarget, group: str, topic_list: Iterable[Topic]) -> None:
        self.group = group
        self._admin = KafkaAdminClient(**kafka_connection(cluster), client_id=f"{group}-lag")
        self._consumer = KafkaConsumer(**kafka_connection(cluster), enable_auto_commit=False)
        self._partitions = [
            TopicPartition(t.name, p) for t in topic_list for p in sorted(self._consumer.partitions_for_topic(t.name))
        ]

    def end_offsets(self) -> dict:
        """The end of every partition now: everything published and acknowledged so far."""
        return self._consumer.end_offsets(self._partitions)

    def behind(self, end: dict) -> int:
        """Events before ``end`` that the group has not committed."""
        committed = self._admin.list_group_offsets({self.group: self._partitions})[self.group]
        return sum(max(0, offset - committed[tp].offset) if tp in committed else offset for tp, offset in end.items())

    def wait_caught_up(self, timeout_s: float, check: Callable[[], None] | None = None,
                       poll_s: float = 0.02) -> None:
        """Until the group has committed everything published before this call; ``check`` may raise to
        stop waiting (its consumer failed). TimeoutError after ``timeout_s``."""
        end = self.end_offsets()
        deadline = time.monotonic() + timeout_s
        while (behind := self.behind(end)) > 0:
            if check is not None:
                check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumer group {self.group} is still {behind} events behind "
                                   f"after {timeout_s:.0f} s")
            time.sleep(poll_s)  # interval between reads of a real condition, not a stand-in for sync

    def close(self) -> None:
        self._consumer.close()
        self._admin.close()


def groups_reading(cluster: KafkaTarget, topic_names: Iterable[str], client_id: str = "strata-check") -> list[str]:
    """Consumer groups with live members reading any of ``topic_names``, as "group (topics)"."""
    wanted = set(topic_names)
    admin = KafkaAdminClient(**kafka_connection(cluster), client_id=client_id)
    try:
        active = [g["group_id"] for g in admin.list_groups() if g.get("group_state") not in ("Empty", "Dead")]
        found = []
        for group, info in (admin.describe_groups(active) if active else {}).items():
            for member in info.get("members") or []:
                metadata = member.get("member_metadata")
                read = wanted & set(metadata.get("topics") or []) if isinstance(metadata, dict) else set()
                if read:
                    found.append(f"{group} ({', '.join(sorted(read))})")
                    break
        return found
    finally:
        admin.close()


def delete_groups(cluster: KafkaTarget, groups: Iterable[str], client_id: str = "strata-cleanup") -> None:
    """Delete consumer groups, best effort: an empty group's offsets expire anyway."""
    with contextlib.suppress(KafkaError):
        admin = KafkaAdminClient(**kafka_connection(cluster), client_id=client_id)
        try:
            admin.delete_groups(list(groups))
        finally:
            admin.close()
