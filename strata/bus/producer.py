"""Publishing events: protobuf per topic, prompt hash as key, ``acks=all``, idempotent producer."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.producer.future import FutureRecordMetadata

from strata.bus.security import KafkaTarget, kafka_connection
from strata.bus.serde import encode
from strata.bus.topics import M, Topic
from strata.telemetry import BUS_PUBLISHED

log = logging.getLogger(__name__)


class PublishError(ConnectionError):
    """The broker did not acknowledge an event in time; the event may not be durable."""


class Publisher:
    """Thread-safe (kafka-python's producer is) publisher of Strata events."""

    def __init__(self, cluster: KafkaTarget, client_id: str = "strata", linger_ms: int = 5) -> None:
        self._producer = KafkaProducer(
            **kafka_connection(cluster),
            client_id=client_id,
            acks="all",
            # Broker-side dedupe of producer retries: a retried send is written once.
            enable_idempotence=True,
            linger_ms=linger_ms,
            retries=2**31 - 1,
            delivery_timeout_ms=30_000,
            request_timeout_ms=15_000,
        )

    def publish(self, topic: Topic[M], message: M) -> FutureRecordMetadata:
        """Send without waiting; the returned future resolves when the broker acknowledged."""
        value = encode(topic, message)
        future = self._producer.send(topic.name, value=value, key=topic.key_of(message))
        BUS_PUBLISHED.labels(topic=topic.name).inc()
        return future

    def publish_and_wait(self, topic: Topic[M], message: M, timeout_s: float = 30.0) -> None:
        """Send and wait for ``acks=all``: on return the event is durable."""
        self.wait([self.publish(topic, message)], timeout_s)

    def publish_raw(
        self, topic_name: str, key: bytes | None, value: bytes | None,
        headers: Sequence[tuple[str, bytes]] = (), timeout_s: float = 30.0,
    ) -> None:
        """Send bytes as they are (dead-lettering) and wait for the acknowledgement."""
        future = self._producer.send(topic_name, value=value, key=key, headers=list(headers))
        self.wait([future], timeout_s)

    @staticmethod
    def wait(futures: Sequence[FutureRecordMetadata], timeout_s: float = 30.0) -> None:
        for future in futures:
            try:
                future.get(timeout=timeout_s)
            except KafkaError as exc:
                raise PublishError(f"event not acknowledged by Kafka: {exc}") from exc

    def flush(self, timeout_s: float = 30.0) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.close(timeout=timeout_s)
