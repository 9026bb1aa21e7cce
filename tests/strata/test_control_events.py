"""Control events are checked before a follower acts on them: confined paths, checksums required,
a policy version that matches the checkpoint's own (strata.contract.control, the watchers)."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from strata.bus import Topic, topics
from strata.bus.admin import ensure_topics, topic_cleanup_policy
from strata.bus.producer import Publisher
from strata.config import StrataSettings
from strata.contract.checksums import POLICY_META_FILE, POLICY_WEIGHTS_FILE, policy_checksum
from strata.contract.control import ControlEventError, check_rm_update, confined_path
from strata.v1 import events_pb2
from svc_generator.policy_watch import PolicyWatcher


def checkpoint(root: Path, version: int) -> Path:
    directory = root / f"v{version}"
    directory.mkdir(parents=True)
    (directory / POLICY_WEIGHTS_FILE).write_bytes(f"weights of v{version}".encode())
    (directory / POLICY_META_FILE).write_text(json.dumps({"version": version, "step": version}))
    return directory


class RecordingBatcher:
    def __init__(self) -> None:
        self.requested: list[tuple[str, int]] = []

    def request_weights(self, path: str, version: int) -> None:
        self.requested.append((path, version))

    def reset_version_floor(self) -> None:
        pass


def update(directory: Path | str, version: int, checksum: str | None = None) -> events_pb2.PolicyUpdated:
    return events_pb2.PolicyUpdated(policy_version=version, checkpoint_path=str(directory), lineage="run-1",
                                    checksum=checksum if checksum is not None else policy_checksum(directory))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


def test_a_verified_update_inside_the_root_is_handed_to_the_batcher(root: Path) -> None:
    batcher = RecordingBatcher()
    watcher = PolicyWatcher("unused:9092", batcher, checkpoint_root=root)  # type: ignore[arg-type]
    v3 = checkpoint(root, 3)
    assert watcher.offer(update(v3, 3))
    assert batcher.requested == [(str(v3), 3)]


def test_bad_policy_updates_are_refused_and_a_later_real_one_still_loads(root: Path, tmp_path: Path) -> None:
    batcher = RecordingBatcher()
    watcher = PolicyWatcher("unused:9092", batcher, checkpoint_root=root)  # type: ignore[arg-type]
    v1, v2 = checkpoint(root, 1), checkpoint(root, 2)
    foreign = checkpoint(tmp_path / "elsewhere", 5)
    bad = [
        update(v1, 2**63 - 1, policy_checksum(v1)),    # a huge version no real update could beat
        update(foreign, 5),                            # foreign weights outside the root
        update(root / ".." / "elsewhere" / "v5", 5),   # the same through ..
        update(f"{v1}\x00/etc", 1, policy_checksum(v1)),  # a NUL byte
        update(v1, 1, ""),                             # no checksum
        update(v1, 1, "0" * 64),                       # a checksum of other files
        update(root / "v9", 9, "a" * 64),              # a checkpoint that is not there
    ]
    assert [watcher.offer(event) for event in bad] == [False] * len(bad)
    assert watcher.rejected == len(bad)
    assert batcher.requested == []
    assert watcher.offer(update(v2, 2))  # the follower is not frozen: the real next version loads
    assert batcher.requested == [(str(v2), 2)]


def test_rm_updates_need_a_checksum_and_paths_in_the_root(tmp_path: Path) -> None:
    root = tmp_path / "rms"
    (root / "light-1").mkdir(parents=True)
    assert check_rm_update("light-1", [str(root / "light-1")], "a" * 64, root) == [(root / "light-1").resolve()]
    for version, paths, checksum, words in [
        ("light-1", [str(root / "light-1")], "", "checksum"),
        ("light-1", ["/etc"], "a" * 64, "outside"),
        ("", [str(root / "light-1")], "a" * 64, "rm_version"),
        ("x" * 500, [str(root / "light-1")], "a" * 64, "rm_version"),
        ("light-1", [], "a" * 64, "no model path"),
        ("light-1", [str(root / "light-1")] * 17, "a" * 64, "at most 16"),
    ]:
        with pytest.raises(ControlEventError, match=words):
            check_rm_update(version, paths, checksum, root)


def test_without_a_root_any_absolute_path_is_allowed_but_nul_never(tmp_path: Path) -> None:
    assert confined_path(str(tmp_path), None) == tmp_path.resolve()
    with pytest.raises(ControlEventError, match="control characters"):
        confined_path("/tmp/a\x00b", None)


def dead_letters_of(infra: StrataSettings, topic: Topic) -> list[dict[str, bytes]]:
    """The headers of every record in ``topic``'s DLQ."""
    consumer = KafkaConsumer(bootstrap_servers=infra.kafka_address, group_id=None, enable_auto_commit=False)
    try:
        partition = TopicPartition(topic.dlq, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        end = consumer.end_offsets([partition])[partition]
        headers: list[dict[str, bytes]] = []
        while consumer.position(partition) < end:
            for batch in consumer.poll(timeout_ms=1000).values():
                headers.extend(dict(record.headers) for record in batch)
        return headers
    finally:
        consumer.close()


def test_control_topics_are_compacted_also_when_created_before(infra: StrataSettings) -> None:
    assert topic_cleanup_policy(infra, topics.POLICY_UPDATED.name) == "compact"
    assert topic_cleanup_policy(infra, topics.RM_UPDATED.name) == "compact"
    old = Topic(f"test.policy.{uuid.uuid4().hex[:10]}", events_pb2.PolicyUpdated, key_field="policy_version")
    ensure_topics(infra, 1, topics=[old])  # as an older release created it: deleted after retention
    assert topic_cleanup_policy(infra, old.name) == "delete"
    ensure_topics(infra, 1, topics=[Topic(old.name, old.message_type, old.key_field, compacted=True)])
    assert topic_cleanup_policy(infra, old.name) == "compact"


def test_a_bad_control_event_is_dead_lettered_once_and_never_read_again(infra: StrataSettings, root: Path,
                                                                       tmp_path: Path) -> None:
    topic = Topic(f"test.policy.{uuid.uuid4().hex[:10]}", events_pb2.PolicyUpdated, key_field="policy_version",
                  compacted=True)
    ensure_topics(infra, 1, topics=[topic])
    v1, v3 = checkpoint(root, 1), checkpoint(root, 3)
    publisher = Publisher(infra)
    try:
        publisher.publish_and_wait(topic, update(v1, 1))
        publisher.publish_and_wait(topic, update(checkpoint(tmp_path / "elsewhere", 2), 2))  # outside the root
        publisher.publish_raw(topic.name, b"9", b"\xff not protobuf")  # undecodable, newest of all

        first = PolicyWatcher(infra, RecordingBatcher(), topic=topic, checkpoint_root=root, dead_letters=publisher)
        first.connect()
        assert first.catch_up()  # the newest usable event wins, past the two refused ones
        assert first._batcher.requested == [(str(v1), 1)]  # type: ignore[attr-defined]
        first.close()
        refused = dead_letters_of(infra, topic)
        assert sorted(h["strata-dlq-stage"] for h in refused) == [b"control", b"decode"]
        assert {h["strata-dlq-source-offset"] for h in refused} == {b"1", b"2"}

        second = PolicyWatcher(infra, RecordingBatcher(), topic=topic, checkpoint_root=root, dead_letters=publisher)
        second.connect()  # a restart: the refused events are skipped, not refused and dead-lettered again
        assert second.catch_up()
        assert second.rejected == 0
        assert len(dead_letters_of(infra, topic)) == 2

        publisher.publish_and_wait(topic, update(v1, 2**62, policy_checksum(v1)))  # a forged version, live
        deadline = time.monotonic() + 30
        while second.rejected == 0 and time.monotonic() < deadline:
            second.poll_once(0.5)
        assert len(dead_letters_of(infra, topic)) == 3
        publisher.publish_and_wait(topic, update(v3, 3))  # the follower is not frozen by it
        batcher = second._batcher  # type: ignore[attr-defined]
        while 3 not in [version for _, version in batcher.requested] and time.monotonic() < deadline:
            second.poll_once(0.5)
        assert batcher.requested[-1] == (str(v3), 3)
        second.close()
    finally:
        publisher.close()
