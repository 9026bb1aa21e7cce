"""The debug-rollout store (R14): full samples, kept apart from everything training reads.

The rollout log keeps three fields (prompt hash, response hash, reward) and logs show hashes only.
With ``--debug-rollout`` (``STRATA_DEBUG_ROLLOUT=1``) a service may also keep the *full* sample here,
to read a bad run's actual texts. The store is deliberately separate:

- its own Redis keys, ``strata:debug:*`` (the content store is ``strata:content:*``), with a short
  TTL and a bounded index, so turning it on cannot fill Redis;
- write-mostly: nothing under ``svc_learner`` or the RM training code imports this module (a test
  checks it), so a debug sample can never feed training;
- samples are plain JSON, read with ``DebugStore.recent``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import redis

from strata import redis_client
from strata.hashing import content_hash

PREFIX = "strata:debug:"
SAMPLE_KEY = PREFIX + "rollout:{prompt_hash}:{response_hash}"
INDEX_KEY = PREFIX + "rollouts"  # sorted set: sample key -> time recorded


@dataclass(frozen=True)
class DebugSample:
    prompt: str
    response: str
    tier: int
    policy_version: int
    model_id: str = ""
    sampling: Mapping[str, Any] = field(default_factory=dict)  # the parameters in effect
    reward: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    recorded_at: float = 0.0

    @property
    def prompt_hash(self) -> str:
        return content_hash(self.prompt)

    @property
    def response_hash(self) -> str:
        return content_hash(self.response)


class DebugStore:
    def __init__(self, client: redis.Redis, ttl_s: int = 24 * 3600, max_samples: int = 10_000) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._max_samples = max_samples

    @classmethod
    def from_url(cls, url: str, ttl_s: int = 24 * 3600, max_samples: int = 10_000) -> DebugStore:
        return cls(redis_client.connect(url, socket_timeout=10), ttl_s, max_samples)

    def record(self, sample: DebugSample) -> str:
        """Keep ``sample`` (overwrites the same prompt/response pair); returns its key."""
        key = SAMPLE_KEY.format(prompt_hash=sample.prompt_hash, response_hash=sample.response_hash)
        now = sample.recorded_at or time.time()
        payload = json.dumps({**asdict(sample), "recorded_at": now}, ensure_ascii=False)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(key, payload, ex=self._ttl_s)
            pipe.zadd(INDEX_KEY, {key: now})
            pipe.zremrangebyrank(INDEX_KEY, 0, -self._max_samples - 1)  # keep the newest max_samples
            pipe.expire(INDEX_KEY, self._ttl_s)
            pipe.execute()
        return key

    def recent(self, n: int = 20) -> list[DebugSample]:
        """The newest ``n`` samples still alive, newest first."""
        keys = cast("list[bytes]", self._redis.zrevrange(INDEX_KEY, 0, n - 1))
        if not keys:
            return []
        samples = []
        for raw in self._redis.mget(keys):
            if raw is not None:
                samples.append(DebugSample(**json.loads(raw)))
        return samples

    def clear(self) -> int:
        """Delete every debug sample; returns how many keys went."""
        keys = list(self._redis.scan_iter(match=PREFIX + "*", count=500))
        return int(self._redis.delete(*keys)) if keys else 0


def debug_store_for(settings: Any, client: redis.Redis) -> DebugStore | None:
    """The store when the process runs with ``debug_rollout`` on, else None (the normal case)."""
    return DebugStore(client) if getattr(settings, "debug_rollout", False) else None
