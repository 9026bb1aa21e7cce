"""The RM version registry on the real Redis, promotion on the real Kafka."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaConsumer, TopicPartition
from rmutil import N_BINS, TINY
from transformers import PreTrainedTokenizerFast

from strata.bus import Publisher, Topic, decode, topics
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.contract.checksums import version_id, weights_checksum
from strata.hashing import content_hash
from strata.v1 import events_pb2
from strata_tools.cli.main import main
from strata_tools.rm.lifecycle import SourceUnavailableError, historical_rollouts
from strata_tools.rm.registry import ChecksumMismatchError, RmRegistryAdmin
from strata_tools.rm.strong import PSEUDO_LABELS_FILE
from strata_tools.rm.train import new_reward_model
from svc_reward.registry import RegistryError, UnknownVersionError, describe, register_served

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0


@pytest.fixture
def registry(redis_client: redis.Redis) -> RmRegistryAdmin:
    return RmRegistryAdmin(redis_client, prefix=f"test:rm:{uuid.uuid4().hex[:10]}")


@pytest.fixture
def publisher(infra: StrataSettings) -> Iterator[Publisher]:
    pub = Publisher(infra.kafka_address, client_id="test-rm-registry")
    yield pub
    pub.close()


def read_all(infra: StrataSettings, topic: Topic, expected: int) -> list[events_pb2.RewardModelUpdated]:
    """Every event of the single-partition ``topic``; waits until ``expected`` are there."""
    consumer = KafkaConsumer(bootstrap_servers=infra.kafka_address, enable_auto_commit=False, group_id=None)
    partition = TopicPartition(topic.name, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    events: list[events_pb2.RewardModelUpdated] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(events) < expected:
            assert time.monotonic() < deadline, f"only {len(events)} of {expected} events on {topic.name}"
            for records in consumer.poll(timeout_ms=200).values():
                events.extend(decode(topic, r.value, r.key) for r in records)
        assert consumer.end_offsets([partition])[partition] == expected, "more events than expected"
    finally:
        consumer.close()
    return events


def test_versions_are_content_addressed_like_the_service_reports_them(make_rm: Callable[..., Path]) -> None:
    a, b = make_rm("a", 3.5), make_rm("b", 4.5)
    single = describe("light", [a], metrics={"spearman/strong_eval": 0.93})
    assert single.version == version_id("light", weights_checksum([a]))  # what svc_reward calls the same weights
    assert single.checksum == weights_checksum([a]) and len(single.checksum) == 64
    ensemble = describe("light", [a, b])
    assert ensemble.paths == (str(a.resolve()), str(b.resolve()))
    assert ensemble.checksum not in (single.checksum, weights_checksum([b]))
    assert describe("strong", [a]).version.startswith("strong-")
    with pytest.raises(ValueError, match="kind"):
        describe("medium", [a])
    with pytest.raises(FileNotFoundError, match="no weights"):
        describe("light", [a.parent])


def test_register_get_list(registry: RmRegistryAdmin, make_rm: Callable[..., Path]) -> None:
    strong = registry.register(describe("strong", [make_rm("s", 2.0)], metrics={"spearman/oracle_eval": 0.95}))
    light = registry.register(describe("light", [make_rm("l", 3.5)], parent=strong.version,
                                       config={"steps": 10}))
    again = registry.register(describe("light", [make_rm("l", 3.5)], metrics={"other": 1.0}))
    assert again == light  # idempotent: the first registration stays
    assert registry.get(light.version).parent == strong.version
    assert registry.get(light.version).config == {"steps": 10}
    assert registry.get(strong.version).metrics == {"spearman/oracle_eval": 0.95}
    assert [e.version for e in registry.list()] == [light.version, strong.version]  # newest first
    assert [e.version for e in registry.list("strong")] == [strong.version]
    assert registry.promoted() is None
    with pytest.raises(UnknownVersionError, match="no RM version"):
        registry.get("light-000000000000")


def test_promote_publishes_a_durable_update_and_records_it(
    infra: StrataSettings, registry: RmRegistryAdmin, publisher: Publisher, rm_topic: Topic,
    make_rm: Callable[..., Path],
) -> None:
    a = registry.register(describe("light", [make_rm("a", 3.5)], metrics={"spearman/strong_eval": 0.91}))
    b = registry.register(describe("light", [make_rm("b1", 4.5), make_rm("b2", 4.0)]))
    registry.promote(a.version, publisher, topic=rm_topic)
    registry.promote(b.version, publisher, topic=rm_topic)
    first, second = read_all(infra, rm_topic, 2)
    assert (first.rm_version, first.path, list(first.ensemble_paths)) == (a.version, a.path, list(a.paths))
    assert first.checksum == a.checksum
    assert dict(first.metrics) == pytest.approx({"spearman/strong_eval": 0.91})
    assert first.published_at.seconds > 0
    assert second.rm_version == b.version and list(second.ensemble_paths) == list(b.paths)
    assert registry.promoted() == b.version
    assert registry.get(b.version).promoted_at is not None


def test_promote_refuses_strong_versions_and_changed_weights(
    infra: StrataSettings, registry: RmRegistryAdmin, publisher: Publisher, rm_topic: Topic,
    make_rm: Callable[..., Path],
) -> None:
    strong = registry.register(describe("strong", [make_rm("s", 2.0)]))
    with pytest.raises(RegistryError, match="only light versions"):
        registry.promote(strong.version, publisher, topic=rm_topic)
    path = make_rm("l", 3.5)
    light = registry.register(describe("light", [path]))
    make_rm("l", 1.0)  # other weights written over the registered ones
    with pytest.raises(ChecksumMismatchError, match="changed on disk"):
        registry.promote(light.version, publisher, topic=rm_topic)
    with pytest.raises(UnknownVersionError):
        registry.promote("light-000000000000", publisher, topic=rm_topic)
    assert registry.promoted() is None
    assert read_all(infra, rm_topic, 0) == []  # nothing was published


def test_historical_rollouts_come_from_the_rollout_log_and_the_content_store(
    infra: StrataSettings, redis_client: redis.Redis, publisher: Publisher,
) -> None:
    # What `strata rm train-strong` pseudo-labels and `strata rm distill` trains on (R5, R6).
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    tag = uuid.uuid4().hex[:8]
    logged = []
    for i in range(5):
        prompt, response = f"historical prompt {tag} {i}", f"historical response {tag} {i}"
        record = events_pb2.RolloutLogRecord(prompt_hash=store.put(prompt), response_hash=store.put(response),
                                             reward=i / 2)
        logged.append((prompt, response, i / 2))
        publisher.publish(topics.ROLLOUT_LOG, record)
    expired = events_pb2.RolloutLogRecord(prompt_hash=content_hash(f"gone {tag}"),
                                          response_hash=content_hash(f"gone too {tag}"), reward=1.0)
    publisher.publish(topics.ROLLOUT_LOG, expired)
    publisher.publish(topics.ROLLOUT_LOG, events_pb2.RolloutLogRecord(  # logged twice: one pair
        prompt_hash=content_hash(logged[0][0]), response_hash=content_hash(logged[0][1]), reward=0.0))
    publisher.flush()
    rows, n_expired = historical_rollouts(infra, limit=10_000)
    ours = sorted((r["prompt"], r["response"], r["logged_reward"]) for r in rows if tag in r["prompt"])
    assert ours == sorted(logged)
    assert n_expired >= 1
    with pytest.raises(SourceUnavailableError):
        historical_rollouts(infra.model_copy(update={"kafka_bootstrap": "127.0.0.1:1"}), limit=10)


def test_train_strong_pseudo_labels_logged_rollouts_and_registers(
    infra: StrataSettings, redis_client: redis.Redis, publisher: Publisher, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path, make_rm: Callable[..., Path],
) -> None:
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    tag = uuid.uuid4().hex[:8]
    publisher.publish_and_wait(topics.ROLLOUT_LOG, events_pb2.RolloutLogRecord(
        prompt_hash=store.put(f"logged prompt {tag}"), response_hash=store.put(f"logged response {tag}"), reward=2.0))
    data = tmp_path / "labelled.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"p{i}", "response": f"r{i}", "score": i / 2}) for i in range(8)))
    out = tmp_path / "strong"
    code = main(["rm", "train-strong", "--data", str(data), "--init", str(make_rm("init", 2.0)), "--steps", "2",
                 "--batch-size", "4", "--max-length", "32", "--max-rollouts", "1000", "--out", str(out),
                 "--threads", "1"])
    assert code == 0
    labels = [json.loads(line) for line in (out / PSEUDO_LABELS_FILE).read_text().splitlines()]
    ours = [row for row in labels if row["prompt"] == f"logged prompt {tag}"]
    assert len(ours) == 1 and ours[0]["logged_reward"] == 2.0
    assert 0.0 <= ours[0]["score"] <= 5.0 and len(ours[0]["logits"]) == 11
    entry = RmRegistryAdmin(redis_client).get(describe("strong", [out]).version)
    assert entry.kind == "strong" and entry.config["n_pseudo_labelled"] == len(labels)
    assert {"spearman/oracle_eval", "pearson/oracle_fresh"} <= set(entry.metrics)


def test_distill_from_log_re_distils_the_served_light_rm_and_compares_on_held_out_prompts(
    infra: StrataSettings, publisher: Publisher, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    tiny_tokenizer: PreTrainedTokenizerFast, rm_topic: Topic[events_pb2.RewardModelUpdated],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # One turn of the distillation loop (R6, R7) on a Redis database of its own, so that what is
    # "in service" is what this test promoted.
    redis_url = infra.redis_address.rsplit("/", 1)[0] + "/9"
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", redis_url)
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    registry = RmRegistryAdmin(client)
    strong, serving = tmp_path / "strong", tmp_path / "serving"
    for out, seed in ((strong, 3), (serving, 5)):
        new_reward_model(tiny_tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=seed).save_pretrained(out)
        tiny_tokenizer.save_pretrained(out)
    current = registry.register(describe("light", [serving]))
    registry.promote(current.version, publisher, topic=rm_topic)
    store = ContentStore(client, infra.content_ttl_s, infra.content_max_bytes)
    tag = uuid.uuid4().hex[:8]
    for i in range(80):
        prompt = f"How do I {'bake bread' if i % 2 else 'brew tea'} {tag} {i}?"
        response = f"{'First, check the flour.' if i % 3 else 'Tea is calm.'} Then {i % 7} more steps."
        publisher.publish(topics.ROLLOUT_LOG, events_pb2.RolloutLogRecord(
            prompt_hash=store.put(prompt), response_hash=store.put(response), reward=1.0))
    publisher.flush()

    code = main(["rm", "distill", "--from-log", "--strong", str(strong), "--no-zoo-pairs", "--augment", "none",
                 "--steps", "200", "--lr", "1e-2", "--batch-size", "16", "--max-length", "64", "--max-rollouts",
                 "1000", "--no-promote-if-better", "--out", str(tmp_path / "new"), "--threads", "1"])
    assert code == 0
    out = capsys.readouterr().out
    info = json.loads((tmp_path / "new" / "strata_rm.json").read_text())
    assert info["config"]["init"] == str(serving)  # warm start from the light RM in service
    assert info["parent"] == describe("strong", [strong]).version
    held = info["config"]["sources"]["rollout_log_held_out"]
    assert 0 < held < 80 and info["config"]["sources"]["rollout_log"] == 80 - held
    match = re.search(r"held-out logged pairs \((\d+)\): Spearman vs the strong RM (-?[\d.]+) .* -> (-?[\d.]+) "
                      r"\((light-\w+)\): (better|not better)", out)
    assert match is not None, out
    before, after = float(match[2]), float(match[3])
    assert int(match[1]) == held and match[5] == ("better" if after > before else "not better")
    assert after > before  # fitted to the strong RM's labels of the same kind of rollouts
    assert registry.get(match[4]).parent == describe("strong", [strong]).version
    assert registry.promoted() == current.version  # --no-promote-if-better: registered, not served

    client.close()

    # With the rollouts' texts gone from the content store there is nothing to distil on: refused with
    # the reason, nothing written.
    empty_url = infra.redis_address.rsplit("/", 1)[0] + "/10"
    empty = redis.Redis.from_url(empty_url)
    empty.flushdb()
    monkeypatch.setenv("STRATA_REDIS_URL", empty_url)
    RmRegistryAdmin(empty).register(current)
    RmRegistryAdmin(empty).promote(current.version, publisher, topic=rm_topic)
    code = main(["rm", "distill", "--from-log", "--strong", str(strong), "--no-zoo-pairs", "--augment", "none",
                 "--steps", "2", "--max-length", "64", "--max-rollouts", "1000", "--out", str(tmp_path / "none"),
                 "--threads", "1"])
    assert code == 2 and "no pairs to distil on" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    assert [e.version for e in RmRegistryAdmin(empty).list("light")] == [current.version]
    empty.close()


def test_the_served_rms_are_registered_with_the_teacher_the_light_one_names(
    registry: RmRegistryAdmin, make_rm: Callable[..., Path],
) -> None:
    strong, light = make_rm("strong", 2.0), make_rm("light", 3.0)
    teacher = describe("strong", [strong]).version
    (light / "strata_zoo.json").write_text(json.dumps({"role": "rm_light", "teacher": teacher}))
    register_served(registry, [light], strong)
    register_served(registry, [light], strong)  # every start of svc_reward: the same two versions
    assert sorted(e.kind for e in registry.list()) == ["light", "strong"]
    entry = registry.get(describe("light", [light]).version)
    assert entry.parent == teacher and registry.get(teacher).kind == "strong"
    assert entry.version == version_id("light", weights_checksum([light]))  # what the service reports on its rewards
    # A light RM that names no teacher (a user's) is registered without one; an ensemble too.
    other = make_rm("other", 1.0)
    register_served(registry, [other], None)
    assert registry.get(describe("light", [other]).version).parent is None
