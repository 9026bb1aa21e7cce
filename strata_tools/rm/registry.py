"""The RM registry as the tools run it: listing, promotion (R7) and the refresh loop's record.

The registry itself is the reward service's (``svc_reward.registry``: versions, their entries and
calibrations, in Redis); svc_reward registers what it serves and needs nothing more. People and the
tools also list versions (``strata rm list``), promote one (``strata rm promote``, the refresh loop)
and keep the last refresh turn's summary: :class:`RmRegistryAdmin` adds these to the same keys.

``promote`` publishes ``RewardModelUpdated`` on ``strata.rm.updated`` and waits for Kafka's
acknowledgement; every svc_reward replica follows that topic (``svc_reward.rm_watch``) and swaps
its light RM between two batches. Only light versions are promoted: they are what the hot path
serves (the strong RM is a deployment setting, ``--strong-rm``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

import redis

from strata.bus import Publisher, Topic, topics
from strata.contract.checksums import weights_checksum
from strata.v1 import events_pb2
from svc_reward.registry import RegistryError, RmRegistry, RmVersion


class ChecksumMismatchError(RegistryError):
    """The weights on disk are not the ones that were registered."""


def update_event(entry: RmVersion) -> events_pb2.RewardModelUpdated:
    """The ``strata.rm.updated`` event announcing ``entry``."""
    event = events_pb2.RewardModelUpdated(
        rm_version=entry.version, path=entry.path, ensemble_paths=list(entry.paths), checksum=entry.checksum,
        metrics={k: float(v) for k, v in entry.metrics.items() if isinstance(v, int | float)},
    )
    event.published_at.GetCurrentTime()
    return event


class RmRegistryAdmin(RmRegistry):
    """The registry with what the tools do to it besides registering: list, promote, the refresh record."""

    def list(self, kind: str | None = None) -> list[RmVersion]:
        """Every version, newest first (optionally one kind)."""
        names = [n.decode() for n in self._redis.zrevrange(self._key("versions"), 0, -1)]
        raws = self._redis.mget([self._key("version", n) for n in names]) if names else []
        entries = [RmVersion.from_json(r) for r in raws if r is not None]
        return [e for e in entries if kind is None or e.kind == kind]

    def promoted(self) -> str | None:
        """The light version promoted last (what svc_reward serves once it has caught up)."""
        raw = self._redis.get(self._key("promoted"))
        return raw.decode() if raw is not None else None

    def promote(self, version: str, publisher: Publisher, verify: bool = True,
                topic: Topic[events_pb2.RewardModelUpdated] = topics.RM_UPDATED) -> events_pb2.RewardModelUpdated:
        """Publish ``version`` on ``strata.rm.updated`` (durable on return), then record it.

        With ``verify``, the weights on disk must still match the registered checksum (the replicas
        check it again before loading).
        """
        entry = self.get(version)
        if entry.kind != "light":
            raise RegistryError(f"{version} is a {entry.kind} RM: only light versions are hot-swapped "
                                "(set the strong RM with svc_reward's --strong-rm)")
        if verify:
            try:
                actual = weights_checksum(entry.paths)
            except OSError as exc:
                raise RegistryError(f"cannot read the weights of {version}: {exc}") from exc
            if actual != entry.checksum:
                raise ChecksumMismatchError(f"the weights of {version} changed on disk since registration "
                                            f"(registered {entry.checksum[:12]}, now {actual[:12]})")
        event = update_event(entry)
        publisher.publish_and_wait(topic, event)
        now = time.time()
        def record(pipe: redis.client.Pipeline) -> None:
            pipe.set(self._key("promoted"), version)
            pipe.lpush(self._key("promotions"), json.dumps({"version": version, "at": now}))

        # The entry, the promoted pointer and the history move together, in one transaction.
        self._update(version, lambda e: RmVersion(**{**asdict(e), "paths": e.paths, "promoted_at": now}), record)
        return event

    def record_refresh(self, summary: dict[str, Any]) -> None:
        """Keep the last ``strata rm refresh`` turn's summary (its label count paces the next turn)."""
        self._redis.set(self._key("refresh", "last"), json.dumps(summary))

    def last_refresh(self) -> dict[str, Any] | None:
        raw = self._redis.get(self._key("refresh", "last"))
        return json.loads(raw) if raw is not None else None
