"""Redis URLs, plain and through Sentinel, and the cluster-shape settings (no Redis or Kafka needed)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from strata.config import StrataSettings
from strata.redis_client import parse_sentinel_url, sentinel_url


def test_a_sentinel_url_names_every_sentinel_the_primary_the_db_and_the_login() -> None:
    url = sentinel_url("10.0.0.1:26379,sentinel-b:26380", "strata", "svc", "p@ss:w/rd", db=2)
    address = parse_sentinel_url(url)
    assert address.sentinels == (("10.0.0.1", 26379), ("sentinel-b", 26380))
    assert (address.primary, address.db) == ("strata", 2)
    assert (address.username, address.password) == ("svc", "p@ss:w/rd")


@pytest.mark.parametrize(("url", "named"), [
    ("redis+sentinel://host/strata", "host:port"),
    ("redis+sentinel://h:1/", "primary name"),
    ("redis+sentinel://h:1/strata/zero", "db"),
    ("redis://h:1/0", r"redis\+sentinel"),
])
def test_a_malformed_sentinel_url_is_refused_naming_the_part(url: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_sentinel_url(url)


def test_the_replication_defaults_follow_the_local_broker_count() -> None:
    single = StrataSettings()
    assert (single.replication_factor, single.min_insync_replicas) == (1, 1)
    three = StrataSettings(kafka_brokers=3, kafka_port=30000, kafka_controller_port=30001)
    assert (three.replication_factor, three.min_insync_replicas) == (3, 2)
    assert three.kafka_address == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    external = StrataSettings(kafka_bootstrap="b1:9092,b2:9092,b3:9092", topic_replication_factor=3)
    assert (external.replication_factor, external.min_insync_replicas) == (3, 2)


@pytest.mark.parametrize(("fields", "named"), [
    ({"topic_replication_factor": 3}, "needs as many brokers"),
    ({"kafka_brokers": 3, "topic_min_insync_replicas": 4}, "topic_min_insync_replicas"),
    ({"kafka_brokers": 3, "kafka_bootstrap": "b:9092"}, "kafka_brokers is for the local Kafka"),
    ({"redis_replicas": 1, "redis_url": "redis://r:6379/0"}, "redis_replicas is for the local Redis"),
    ({"redis_sentinels": "s:26379", "redis_url": "redis://r:6379/0"}, "set one"),
])
def test_an_impossible_cluster_shape_is_refused_naming_the_setting(fields: dict, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        StrataSettings(**fields)


def test_the_local_sentinels_become_the_redis_address() -> None:
    settings = StrataSettings(redis_replicas=1, redis_port=40000)
    assert settings.redis_replica_ports() == [40001]
    assert settings.redis_sentinel_ports() == [40002, 40003, 40004]
    address = parse_sentinel_url(settings.redis_address)
    assert address.sentinels == (("127.0.0.1", 40002), ("127.0.0.1", 40003), ("127.0.0.1", 40004))
    assert settings.redis_managed
    assert not StrataSettings(redis_sentinels="s:26379").redis_managed


def test_an_empty_address_is_unset_so_an_override_can_clear_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_REDIS_URL", "")
    monkeypatch.setenv("STRATA_REDIS_SENTINELS", "sentinel-1:26379,sentinel-2:26379")
    settings = StrataSettings()
    assert settings.redis_url is None
    assert parse_sentinel_url(settings.redis_address).sentinels[1] == ("sentinel-2", 26379)
