"""Thin layer over kafka-python: topics, protobuf serde, publisher, consumer-group worker."""

from strata.bus import kafka_fixes
from strata.bus.producer import Publisher, PublishError
from strata.bus.serde import PoisonMessageError, decode, encode
from strata.bus.topics import ALL_TOPICS, Topic
from strata.bus.worker import Delivery, TransientError, Worker

kafka_fixes.apply()  # before any consumer joins a group

__all__ = [
    "ALL_TOPICS",
    "Delivery",
    "PoisonMessageError",
    "PublishError",
    "Publisher",
    "Topic",
    "TransientError",
    "Worker",
    "decode",
    "encode",
]
