"""`strata dlq` against the real broker: list and show by hash and reason, replay once, dropped values."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata, TopicPartition

from strata.bus import Delivery, Publisher, Topic, Worker
from strata.bus.dlq import REPLAYED_FROM, ReplayMark
from strata.bus.security import kafka_connection
from strata.bus.topics import ALL_TOPICS
from strata.config import StrataSettings
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2
from strata_tools.cli import dlq_cmd
from strata_tools.cli.main import main

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0
Cli = Callable[..., tuple[int, str, str]]


def routed(text: str, reason: str = "") -> events_pb2.PromptRouted:
    return events_pb2.PromptRouted(prompt_hash=content_hash(text), tier=common_pb2.TIER_LEVEL_1, n_samples=1,
                                   reason=reason)


@pytest.fixture
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra, client_id="test-dlq", linger_ms=0)
    yield pub
    pub.close()


@pytest.fixture
def cli(infra: StrataSettings, fresh_topic: Topic, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Cli:
    """``strata dlq ARGS`` in-process on the test cluster, the test's topic known: (code, stdout, stderr)."""
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setattr(dlq_cmd, "known_topics", lambda: (*ALL_TOPICS, fresh_topic))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["dlq", *argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def end_offsets(infra: StrataSettings, name: str) -> dict[TopicPartition, int]:
    consumer = KafkaConsumer(**kafka_connection(infra), enable_auto_commit=False)
    try:
        return consumer.end_offsets([TopicPartition(name, p) for p in consumer.partitions_for_topic(name)])
    finally:
        consumer.close()


def records_since(infra: StrataSettings, start: dict[TopicPartition, int]) -> list:
    """The records of ``start``'s partitions from those offsets up to their end now (poll with a deadline)."""
    consumer = KafkaConsumer(**kafka_connection(infra), enable_auto_commit=False)
    try:
        end = consumer.end_offsets(list(start))
        consumer.assign(list(start))
        for tp, offset in start.items():
            consumer.seek(tp, offset)
        found: list = []
        deadline = time.monotonic() + TIMEOUT_S
        while any(consumer.position(tp) < end[tp] for tp in start):
            assert time.monotonic() < deadline, "records not read in time"
            for records in consumer.poll(timeout_ms=200).values():
                found.extend(records)
        return sorted(found, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def publish_dead_letter(publisher: Publisher, topic: Topic, key: bytes, value: bytes, source: tuple[int, int],
                        dropped_from: bytes | None = None) -> None:
    """A dead letter with the headers ``strata.bus.worker`` writes (``dropped_from``: its value was too large)."""
    headers = [
        ("strata-dlq-source-topic", topic.name.encode()),
        ("strata-dlq-source-partition", str(source[0]).encode()),
        ("strata-dlq-source-offset", str(source[1]).encode()),
        ("strata-dlq-stage", b"handler"),
        ("strata-dlq-error", b"ValueError: no such policy version"),
        ("strata-dlq-attempts", b"3"),
        ("strata-dlq-group", b"svc-test"),
    ]
    if dropped_from is not None:
        note = f"{len(dropped_from)} bytes, sha256 {hashlib.sha256(dropped_from).hexdigest()}; too large with headers"
        headers.append(("strata-dlq-value-dropped", note.encode()))
    publisher.publish_raw(topic.dlq, key, value, headers)


def summary_row(out: str, dlq_topic: str) -> list[str]:
    [row] = [line.split() for line in out.splitlines() if line.startswith(dlq_topic + " ")]
    return row


def test_list_and_show_give_hashes_and_reasons_never_texts(infra, publisher, fresh_topic, cli) -> None:
    secret = "SECRET PROMPT TEXT " * 20  # 380 characters: a text that must not be printed
    poison_key = content_hash(f"poison {uuid.uuid4()}").encode()
    poison = b"\xff\xff\xff\xff not protobuf"
    publisher.publish_raw(fresh_topic.name, poison_key, poison)
    failing = routed(f"fails {uuid.uuid4()}", reason=secret)
    publisher.publish_and_wait(fresh_topic, failing)

    def rejects(delivery: Delivery) -> None:
        raise ValueError("cannot use this event")

    group = f"g-{uuid.uuid4().hex[:6]}"
    worker = Worker(infra, group, {fresh_topic: rejects}, publisher)
    worker.connect()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while worker.dead_lettered < 2:
            assert time.monotonic() < deadline, "not dead-lettered in time"
            worker.poll_once(0.2)
    finally:
        worker.close()

    code, out, _ = cli("list")
    assert code == 0
    assert summary_row(out, fresh_topic.dlq)[1:] == ["2", "0", "2"]
    assert summary_row(out, "strata.rewards.scored.dlq")  # the real topics are listed too

    code, out, _ = cli("list", fresh_topic.name)
    assert code == 0 and out.startswith(f"{fresh_topic.dlq}: 2 dead letters, 0 replayed\n")
    assert poison_key.decode() in out and failing.prompt_hash in out and group in out
    assert "SECRET" not in out

    code, out, _ = cli("list", fresh_topic.dlq, "--json")
    rows = {row["stage"]: row for row in map(json.loads, out.splitlines())}
    assert rows["decode"]["key"] == poison_key.decode() and rows["decode"]["value_bytes"] == len(poison)
    assert rows["decode"]["error"].startswith("not a PromptRouted")
    handler = rows["handler"]
    assert handler["key"] == failing.prompt_hash and handler["attempts"] == infra.max_delivery_attempts
    assert handler["error"] == "ValueError: cannot use this event" and handler["group"] == group
    assert handler["source_topic"] == fresh_topic.name and handler["replayed"] is False
    assert handler["value_bytes"] == len(failing.SerializeToString()) and handler["value_dropped"] is None

    code, out, _ = cli("show", fresh_topic.name, handler["offset"])
    assert code == 0
    assert f'"prompt_hash": "{failing.prompt_hash}"' in out
    assert f"<elided: {len(secret)} chars, sha256 {hashlib.sha256(secret.encode()).hexdigest()}>" in out
    assert "strata-dlq-stage" in out and "SECRET" not in out

    code, out, _ = cli("show", fresh_topic.dlq, rows["decode"]["offset"])
    assert code == 0
    assert "undecodable (not a PromptRouted" in out
    assert f"{len(poison)} B, sha256 {hashlib.sha256(poison).hexdigest()}" in out

    code, out, _ = cli("replay", fresh_topic.name, "--all", "--dry-run")
    assert code == 1  # poison stays poison: not republished
    assert out.splitlines()[-1].startswith(
        f"would replay 1 of 2 dead letters from {fresh_topic.dlq} (1 not replayable: undecodable, it would be "
        "dead-lettered again (not a PromptRouted")


def test_replay_republishes_the_original_bytes_once(infra, publisher, fresh_topic, cli) -> None:
    events = [routed(f"replay {i} {uuid.uuid4()}") for i in range(2)]
    for i, event in enumerate(events):
        publish_dead_letter(publisher, fresh_topic, event.prompt_hash.encode(), event.SerializeToString(), (0, i))
    before = end_offsets(infra, fresh_topic.name)

    code, out, _ = cli("replay", fresh_topic.name, "--all", "--dry-run")
    assert code == 0 and out.splitlines()[-1] == f"would replay 2 of 2 dead letters from {fresh_topic.dlq}"
    assert end_offsets(infra, fresh_topic.name) == before

    code, out, _ = cli("replay", fresh_topic.dlq, "--all")
    assert code == 0 and out.splitlines()[-1] == f"replayed 2 of 2 dead letters from {fresh_topic.dlq}"
    replayed = records_since(infra, before)
    assert sorted((r.key, r.value) for r in replayed) == sorted(
        (e.prompt_hash.encode(), e.SerializeToString()) for e in events)
    assert sorted(dict(r.headers)[REPLAYED_FROM] for r in replayed) == [
        f"{fresh_topic.dlq}@0".encode(), f"{fresh_topic.dlq}@1".encode()]

    after = end_offsets(infra, fresh_topic.name)
    code, out, _ = cli("replay", fresh_topic.name, "--all")
    assert code == 0 and out.splitlines()[-1] == (
        f"replayed 0 of 2 dead letters from {fresh_topic.dlq} (2 already replayed, skipped: --again replays them)")
    assert end_offsets(infra, fresh_topic.name) == after
    code, out, _ = cli("list")
    assert summary_row(out, fresh_topic.dlq)[1:] == ["2", "2", "0"]

    code, out, _ = cli("replay", fresh_topic.name, "--offset", "1", "--again")
    assert code == 0 and out.splitlines()[-1] == f"replayed 1 of 1 dead letters from {fresh_topic.dlq}"
    [again] = records_since(infra, after)
    assert (again.key, again.value) == (events[1].prompt_hash.encode(), events[1].SerializeToString())


def test_a_dropped_value_is_replayed_from_its_source_offset_or_reported_gone(
    infra, publisher, fresh_topic, cli
) -> None:
    # Two events of one prompt (one partition); retention then removes the first one.
    gone, kept = routed(f"dropped {uuid.uuid4()}"), routed(f"dropped {uuid.uuid4()}")
    gone.prompt_hash = kept.prompt_hash
    gone.n_samples = 7
    key = kept.prompt_hash.encode()
    publisher.publish_and_wait(fresh_topic, gone)
    publisher.publish_and_wait(fresh_topic, kept)
    start = dict.fromkeys(end_offsets(infra, fresh_topic.name), 0)
    first, second = records_since(infra, start)
    tp = TopicPartition(fresh_topic.name, first.partition)
    admin = KafkaAdminClient(**kafka_connection(infra))
    try:
        admin.delete_records({tp: second.offset})
    finally:
        admin.close()
    publish_dead_letter(publisher, fresh_topic, key, b"", (first.partition, first.offset), dropped_from=first.value)
    publish_dead_letter(publisher, fresh_topic, key, b"", (second.partition, second.offset),
                        dropped_from=second.value)
    before = end_offsets(infra, fresh_topic.name)

    code, out, _ = cli("show", fresh_topic.name, "1")
    assert code == 0 and f"read back from {fresh_topic.name}[{tp.partition}]@{second.offset}" in out
    assert '"n_samples": 1' in out
    code, out, _ = cli("show", fresh_topic.name, "0")
    assert code == 0 and f"source offset {first.offset} no longer retained" in out

    code, out, _ = cli("replay", fresh_topic.name, "--all")
    assert code == 1  # something could not be replayed
    assert out.splitlines()[-1] == (
        f"replayed 1 of 2 dead letters from {fresh_topic.dlq} (1 not replayable: value dropped and source "
        f"offset {first.offset} no longer retained)")
    [replayed] = records_since(infra, before)
    assert (replayed.key, replayed.value) == (key, kept.SerializeToString())

    code, out, _ = cli("replay", fresh_topic.name, "--all")
    assert out.splitlines()[-1] == (
        f"replayed 0 of 2 dead letters from {fresh_topic.dlq} (1 already replayed, skipped: --again replays them, "
        f"1 not replayable: value dropped and source offset {first.offset} no longer retained)")
    code, out, _ = cli("list")
    assert summary_row(out, fresh_topic.dlq)[1:] == ["2", "1", "1"]


def test_errors_name_the_topic_the_offset_and_the_address(infra, publisher, fresh_topic, cli, monkeypatch) -> None:
    code, _, err = cli("list", "strata.nope")
    assert code == 2 and "unknown topic 'strata.nope'" in err and "strata.rewards.scored" in err

    code, _, err = cli("show", fresh_topic.name, "0")
    assert code == 2 and f"offset 0 is out of range: {fresh_topic.dlq} holds no dead letters" in err
    event = routed(f"range {uuid.uuid4()}")
    publish_dead_letter(publisher, fresh_topic, event.prompt_hash.encode(), event.SerializeToString(), (0, 0))
    before = end_offsets(infra, fresh_topic.name)
    code, _, err = cli("replay", fresh_topic.name, "--offset", "0", "7")
    assert code == 2 and f"offset 7 is out of range: {fresh_topic.dlq} holds offsets 0-0" in err
    assert end_offsets(infra, fresh_topic.name) == before  # nothing published before the check

    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    started = time.monotonic()
    code, _, err = cli("list")
    assert code == 2 and "Kafka at 127.0.0.1:1 is unreachable" in err
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(("mark", "added", "beginning", "expected"), [
    (ReplayMark(), [0, 1], 0, ReplayMark(2)),
    (ReplayMark(), [3, 5], 0, ReplayMark(0, frozenset({3, 5}))),
    (ReplayMark(0, frozenset({3, 5})), [0, 1, 2], 0, ReplayMark(4, frozenset({5}))),
    (ReplayMark(), [6], 5, ReplayMark(5, frozenset({6}))),  # what retention deleted is nothing to replay
    (ReplayMark(), [5], 5, ReplayMark(6)),
])
def test_replay_mark_keeps_a_prefix_and_the_offsets_above_it(mark, added, beginning, expected) -> None:
    updated = mark.add(added, beginning)
    assert updated == expected
    assert ReplayMark.parse(OffsetAndMetadata(updated.below, updated.metadata(), -1)) == expected
