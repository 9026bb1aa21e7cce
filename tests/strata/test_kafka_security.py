"""kafka_client_options / kafka_connection: the settings turned into kafka-python keywords."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from strata.bus.security import kafka_client_options, kafka_connection
from strata.config import StrataSettings


@pytest.fixture(autouse=True)
def _no_security_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # `make test-auth` sets these; the cases below spell out their own.
    for name in StrataSettings.model_fields:
        if name.startswith(("kafka_", "redis_")):
            monkeypatch.delenv(f"STRATA_{name.upper()}", raising=False)


def test_plaintext_sets_only_the_protocol() -> None:
    settings = StrataSettings(kafka_bootstrap="k1:9092,k2:9092")
    assert kafka_client_options(settings) == {"security_protocol": "PLAINTEXT"}
    assert kafka_connection(settings) == {"bootstrap_servers": "k1:9092,k2:9092", "security_protocol": "PLAINTEXT"}
    assert kafka_connection("k:9092") == {"bootstrap_servers": "k:9092"}  # a bare address: plaintext


def test_sasl_plaintext_on_the_managed_broker() -> None:
    settings = StrataSettings(kafka_port=19999, kafka_security_protocol="SASL_PLAINTEXT",
                              kafka_sasl_username="svc", kafka_sasl_password="pw")
    assert kafka_connection(settings) == {
        "bootstrap_servers": "127.0.0.1:19999", "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "svc", "sasl_plain_password": "pw",
    }


def test_sasl_ssl_with_scram_and_a_private_ca() -> None:
    settings = StrataSettings(kafka_bootstrap="kafka.example:9093", kafka_security_protocol="SASL_SSL",
                              kafka_sasl_mechanism="SCRAM-SHA-512", kafka_sasl_username="svc",
                              kafka_sasl_password="pw", kafka_ssl_cafile=Path("/etc/strata/ca.pem"))
    assert kafka_client_options(settings) == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "svc",
        "sasl_plain_password": "pw", "ssl_cafile": "/etc/strata/ca.pem",
    }


def test_ssl_with_a_client_certificate() -> None:
    settings = StrataSettings(kafka_bootstrap="kafka.example:9093", kafka_security_protocol="SSL",
                              kafka_ssl_cafile="/ca.pem", kafka_ssl_certfile="/client.pem",
                              kafka_ssl_keyfile="/client.key")
    assert kafka_client_options(settings) == {
        "security_protocol": "SSL", "ssl_cafile": "/ca.pem", "ssl_certfile": "/client.pem",
        "ssl_keyfile": "/client.key",
    }


@pytest.mark.parametrize("client", [KafkaProducer, KafkaConsumer, KafkaAdminClient])
def test_every_client_type_takes_every_keyword(client: type) -> None:
    # kafka-python rejects unknown keywords at construction; check the names against each client's
    # defaults without connecting anywhere.
    settings = StrataSettings(kafka_bootstrap="k:9093", kafka_security_protocol="SASL_SSL",
                              kafka_sasl_username="u", kafka_sasl_password="p", kafka_ssl_cafile="/ca.pem",
                              kafka_ssl_certfile="/c.pem", kafka_ssl_keyfile="/c.key")
    assert set(kafka_connection(settings)) <= set(client.DEFAULT_CONFIG)
