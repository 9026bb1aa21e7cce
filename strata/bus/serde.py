"""Protobuf serialisation per topic.

A topic carries exactly one message type; encoding checks the type, decoding checks that the bytes
parse as that type and that the Kafka key matches the key field. Anything else is a poison message
(:class:`PoisonMessageError`) that the worker sends to the dead-letter topic.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError

from strata.bus.topics import M, Topic


class PoisonMessageError(Exception):
    """A message that can never be processed: undecodable, or inconsistent with its key."""


def encode(topic: Topic[M], message: M) -> bytes:
    if not isinstance(message, topic.message_type):
        raise TypeError(
            f"topic {topic.name} carries {topic.message_type.__name__}, not {type(message).__name__}"
        )
    if not str(getattr(message, topic.key_field)):
        raise ValueError(f"{topic.message_type.__name__}.{topic.key_field} must be set: it is the Kafka key")
    return message.SerializeToString(deterministic=True)


def decode(topic: Topic[M], value: bytes | None, key: bytes | None = None) -> M:
    if value is None:
        raise PoisonMessageError("empty value (tombstone) on a topic that carries events")
    message = topic.message_type()
    try:
        message.ParseFromString(value)
    except DecodeError as exc:
        raise PoisonMessageError(f"not a {topic.message_type.__name__}: {exc}") from exc
    if key is not None and key != topic.key_of(message):
        # Protobuf parsing is lenient: stray bytes can parse into a message with the wrong fields.
        # The key is written from the key field by the producer, so a mismatch means corruption.
        raise PoisonMessageError(
            f"key {key[:80]!r} does not match {topic.message_type.__name__}.{topic.key_field}"
        )
    return message
