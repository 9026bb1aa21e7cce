"""Kafka client connection settings: the bootstrap address plus SASL / TLS, from one place.

Every KafkaProducer, KafkaConsumer and KafkaAdminClient in Strata is built with
``**kafka_connection(settings)``, so a cluster that wants SASL or TLS gets it from every client,
not from most of them. docs/security.md describes the settings.
"""

from __future__ import annotations

from typing import Any

from strata.config import StrataSettings

# What a function that builds a Kafka client accepts: the settings (address and security), or a bare
# bootstrap string for a plaintext cluster (scripts, tests against an unauthenticated broker).
KafkaTarget = StrataSettings | str


def kafka_client_options(settings: StrataSettings) -> dict[str, Any]:
    """kafka-python keyword arguments for the settings' security protocol: only those that apply.

    The same keywords work for KafkaProducer, KafkaConsumer and KafkaAdminClient. kafka-python
    reads ``sasl_plain_username`` / ``sasl_plain_password`` for SCRAM too.
    """
    protocol = settings.kafka_security_protocol
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol.startswith("SASL_"):
        # The settings validator guarantees both are set for a SASL protocol.
        assert settings.kafka_sasl_username is not None and settings.kafka_sasl_password is not None
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        options["sasl_plain_username"] = settings.kafka_sasl_username
        options["sasl_plain_password"] = settings.kafka_sasl_password.get_secret_value()
    if protocol.endswith("SSL"):
        files = {"ssl_cafile": settings.kafka_ssl_cafile, "ssl_certfile": settings.kafka_ssl_certfile,
                 "ssl_keyfile": settings.kafka_ssl_keyfile}
        options.update({key: str(path) for key, path in files.items() if path is not None})
    return options


def kafka_connection(cluster: KafkaTarget) -> dict[str, Any]:
    """``bootstrap_servers`` and the security keywords: the first arguments of every Kafka client."""
    if isinstance(cluster, str):
        return {"bootstrap_servers": cluster}
    return {"bootstrap_servers": cluster.kafka_address, **kafka_client_options(cluster)}
