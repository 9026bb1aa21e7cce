"""One classification of handler failures: transient ones wait, permanent ones are dead-lettered."""

from __future__ import annotations

import pytest
import redis
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, NotLeaderForPartitionError

from strata.bus.errors import TransientError, is_transient
from strata.bus.producer import PublishError
from strata.content_store import StoreUnavailableError


def published_with(cause: BaseException) -> PublishError:
    try:
        raise PublishError(f"event not acknowledged by Kafka: {cause}") from cause
    except PublishError as exc:
        return exc


@pytest.mark.parametrize("exc", [
    TransientError("learner busy"),
    ConnectionError("refused"), TimeoutError("slow"),
    redis.ConnectionError("Error 111 connecting"), redis.TimeoutError("Timeout reading"),
    redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'"),
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.ResponseError("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist"),
    StoreUnavailableError("Redis is down"),
    KafkaTimeoutError("Failed to update metadata"), NotLeaderForPartitionError(),
    published_with(KafkaTimeoutError("no ack")),
], ids=lambda e: type(e).__name__)
def test_a_dependency_that_is_down_or_busy_is_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [
    ValueError("bad"), KeyError("x"), redis.ResponseError("WRONGTYPE Operation against a key"),
    redis.DataError("Invalid input"), MessageSizeTooLargeError(),
    published_with(MessageSizeTooLargeError()),
], ids=lambda e: type(e).__name__)
def test_a_broken_message_is_permanent(exc: BaseException) -> None:
    assert not is_transient(exc)
