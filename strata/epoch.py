"""The epoch marker: how a Redis that came back empty is recognised.

Redis keeps its data across a restart (append-only file), but it can still come back empty: a lost
volume, a ``FLUSHALL``, a new instance behind the same address. The **epoch marker**, a Redis hash
under ``strata:epoch`` (``id``, ``created_at``, ``created_by``, and ``recovered_at`` once
``strata recover redis`` has run), is written when missing by ``strata infra up``, by ``strata
recover redis`` and by each service at start (:func:`mark_start`). A Redis younger than Kafka's
history has a missing marker, or one created after the oldest event the data topics retain:
``strata_tools.recover.assess`` says which, and accounts per prompt for what was lost.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import redis

log = logging.getLogger(__name__)

MARKER_KEY = "strata:epoch"
# Producers stamp events with their own clocks: a marker this much younger than an event still
# counts as older (a client a few seconds behind must not make a fresh Redis look like a lost one).
CLOCK_SLACK_S = 60.0


def iso_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the marker: pure --------------------------------------------------------------------------


@dataclass(frozen=True)
class Marker:
    """The epoch marker of one Redis: written once, when it is missing."""

    id: str                      # random: a Redis replaced by another one has another id
    created_at: float            # unix seconds
    created_by: str              # "strata infra up", "svc_scheduler", "strata recover redis", ...
    recovered_at: float | None = None  # when `strata recover redis` rebuilt what Kafka allows

    @classmethod
    def from_fields(cls, fields: Mapping[Any, Any]) -> Marker | None:
        """The marker from HGETALL's answer; None when there is none (or it is not one)."""
        text = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in fields.items()}
        try:
            recovered = text.get("recovered_at")
            return cls(text["id"], float(text["created_at"]), text.get("created_by", ""),
                       float(recovered) if recovered else None)
        except (KeyError, ValueError):
            return None


# -- the marker: Redis -------------------------------------------------------------------------

# Create the marker when it is missing, in one step (two starts at once write one marker); return it.
_ENSURE_MARKER = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'id', ARGV[1], 'created_at', ARGV[2], 'created_by', ARGV[3])
end
return redis.call('HGETALL', KEYS[1])
"""


def read_marker(client: redis.Redis) -> Marker | None:
    return Marker.from_fields(client.hgetall(MARKER_KEY))


def ensure_marker(client: redis.Redis, created_by: str, clock: Callable[[], float] = time.time
                  ) -> tuple[Marker, bool]:
    """The marker, written now when missing; True when this call wrote it. Redis errors propagate."""
    new_id = uuid.uuid4().hex[:16]
    raw = client.eval(_ENSURE_MARKER, 1, MARKER_KEY, new_id, repr(clock()), created_by)
    marker = Marker.from_fields(dict(zip(raw[::2], raw[1::2], strict=True)))
    if marker is None:  # someone wrote something else under the key: say so, never overwrite it
        raise ValueError(f"{MARKER_KEY} in Redis is not an epoch marker")
    return marker, marker.id == new_id


def mark_start(client: redis.Redis, service: str) -> Marker | None:
    """For a service's start: write the marker when it is missing and say so; never fails the start
    (Redis down: the service waits it out as usual, and the next start or `strata recover` writes it)."""
    try:
        marker, created = ensure_marker(client, service)
    except (redis.RedisError, ValueError) as exc:
        log.warning("epoch marker %s not checked: %s", MARKER_KEY, exc)
        return None
    if created:
        log.warning("Redis had no %s marker: wrote %s. A new Redis needs nothing more; one that came back "
                    "empty while Kafka has history: run `strata recover redis`", MARKER_KEY, marker.id)
    return marker


def mark_recovered(client: redis.Redis, at: float) -> None:
    client.hset(MARKER_KEY, "recovered_at", repr(at))
