"""One classification of failures for every worker: transient (the world is broken: wait and retry,
never dead-letter) or permanent (the message is broken: retry a few times, then dead-letter).

Python's built-in ``ConnectionError``/``TimeoutError`` are not redis-py's, and not every
``KafkaError`` is worth waiting for (a record too large for the broker never fits), so the workers
ask :func:`is_transient` instead of catching a tuple of types.
"""

from __future__ import annotations

import redis
from kafka.errors import KafkaError, MessageSizeTooLargeError


class TransientError(Exception):
    """Raised by a handler when a dependency is down or busy: retry later, never dead-letter."""


# Redis answers that mean "not now": out of memory (maxmemory without eviction), a replica that is
# read-only after a failover, a cluster slot in migration. Connection and timeout errors (and
# BusyLoadingError, a subclass) mean Redis is unreachable or still loading its data.
_REDIS_TRANSIENT: tuple[type[BaseException], ...] = (
    redis.ConnectionError, redis.TimeoutError, redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError, redis.exceptions.MasterDownError, redis.exceptions.ClusterDownError,
)
# A Redis that cannot write its snapshot refuses writes with MISCONF until the disk has room again.
_REDIS_TRANSIENT_REPLIES = ("MISCONF", "LOADING", "BUSY ", "NOREPLICAS", "CLUSTERDOWN")


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` says a dependency is down or busy rather than that the message is bad."""
    if isinstance(exc.__cause__, KafkaError):
        return is_transient(exc.__cause__)  # a PublishError is as transient as the Kafka error behind it
    if isinstance(exc, KafkaError):
        # kafka-python marks what a retry can fix (leader moved, broker down, timeout); a record too
        # large for the broker, or an authorization failure, stays what it is.
        return bool(getattr(exc, "retriable", False))
    if isinstance(exc, (TransientError, ConnectionError, TimeoutError, *_REDIS_TRANSIENT)):
        return True
    if isinstance(exc, redis.ResponseError):
        return str(exc).startswith(_REDIS_TRANSIENT_REPLIES)
    return False


def is_too_large(exc: BaseException) -> bool:
    """True when Kafka refused a record for its size (also behind a PublishError): it never fits."""
    return any(isinstance(e, MessageSizeTooLargeError) for e in (exc, exc.__cause__))
