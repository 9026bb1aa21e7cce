"""`strata infra up | down | status` on the real Kafka and Redis started by the session fixture."""

from __future__ import annotations

import socket
import uuid

import pytest
from kafka import KafkaConsumer

from strata.bus import Publisher
from strata.bus.admin import ensure_topics
from strata.bus.security import kafka_connection
from strata.bus.topics import Topic
from strata.config import StrataSettings
from strata.hashing import content_hash
from strata.v1 import events_pb2
from strata_tools.cli.main import main as strata_main
from strata_tools.infra import InfraError, down, status, up
from strata_tools.infra.process import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def managed(infra: StrataSettings) -> StrataSettings:
    if not (infra.kafka_managed and infra.redis_managed):
        pytest.skip("infra is external (STRATA_KAFKA_BOOTSTRAP / STRATA_REDIS_URL): nothing to start or stop")
    return infra


def _env_for(settings: StrataSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_STATE_DIR", str(settings.state_dir))
    monkeypatch.setenv("STRATA_KAFKA_PORT", str(settings.kafka_port))
    monkeypatch.setenv("STRATA_KAFKA_CONTROLLER_PORT", str(settings.kafka_controller_port))
    monkeypatch.setenv("STRATA_REDIS_PORT", str(settings.redis_port))
    monkeypatch.delenv("STRATA_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("STRATA_REDIS_URL", raising=False)


def test_status_reports_both_services_with_addresses(
    managed: StrataSettings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _env_for(managed, monkeypatch)
    assert strata_main(["infra", "status"]) == 0
    out = capsys.readouterr().out
    kafka_line = next(line for line in out.splitlines() if line.startswith("kafka"))
    redis_line = next(line for line in out.splitlines() if line.startswith("redis"))
    assert " up " in kafka_line and f"127.0.0.1:{managed.kafka_port}" in kafka_line
    # With a password (make test-auth) the address shows it masked: redis://user:***@127.0.0.1:port/0.
    assert " up " in redis_line and f"127.0.0.1:{managed.redis_port}/0" in redis_line
    assert (" none " in redis_line) != managed.redis_auth


def test_up_is_idempotent(managed: StrataSettings) -> None:
    before = {row.name: row.pid for row in status(managed)}
    after = {row.name: row.pid for row in up(managed)}
    assert before == after and all(after.values())


def test_down_then_up_keeps_kafka_and_redis_data(managed: StrataSettings, redis_client) -> None:
    topic = Topic(f"test.persist.{uuid.uuid4().hex[:8]}", events_pb2.PromptRouted)
    ensure_topics(managed, 1, topics=[topic])
    message = events_pb2.PromptRouted(prompt_hash=content_hash(f"persist {uuid.uuid4()}"))
    publisher = Publisher(managed)
    publisher.publish_and_wait(topic, message)
    publisher.close()
    redis_key = f"test:persist:{uuid.uuid4().hex}"
    redis_client.set(redis_key, b"kept")

    assert set(down(managed)) == {"kafka", "redis"}
    assert [row.state for row in status(managed)] == ["down", "down"]
    up(managed)

    consumer = KafkaConsumer(topic.name, **kafka_connection(managed), auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=30_000)
    try:
        record = next(iter(consumer))
    finally:
        consumer.close()
    assert events_pb2.PromptRouted.FromString(record.value) == message
    assert redis_client.get(redis_key) == b"kept"


def test_taken_port_is_a_clear_error(managed: StrataSettings, tmp_path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        other = StrataSettings(state_dir=tmp_path, kafka_port=port, redis_url=managed.redis_address)
        with pytest.raises(InfraError, match=f"port {port} \\(Kafka\\) is taken by another process"):
            up(other)


def test_down_stops_only_what_this_state_dir_started(managed: StrataSettings, tmp_path) -> None:
    stranger = StrataSettings(state_dir=tmp_path, kafka_port=managed.kafka_port, redis_port=managed.redis_port)
    assert down(stranger) == []
    assert all(row.healthy for row in status(managed))


def test_external_unreachable_cluster_is_reported(tmp_path) -> None:
    external = StrataSettings(state_dir=tmp_path, kafka_bootstrap=f"127.0.0.1:{free_port()}",
                              redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(InfraError, match=r"STRATA_REDIS_URL.*does not answer"):
        up(external)
    rows = status(external)
    assert [(row.managed, row.state) for row in rows] == [(False, "unreachable"), (False, "unreachable")]
