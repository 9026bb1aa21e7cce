"""The live audit's tallies in Redis: one hash per policy version, and a sorted set of the versions.

Written by the reward worker inside its rollout transaction (``add_to``); read by the worker's gauges,
``strata status``, ``strata diagnose`` and the demo's report (``read_versions``).
"""

from __future__ import annotations

from collections.abc import Mapping

import redis

from svc_reward.audit import AuditTally

VERSIONS_KEY = "strata:reward:audit:versions"


def tally_key(policy_version: int) -> str:
    return f"strata:reward:audit:v{policy_version}"


def add_to(pipe: redis.client.Pipeline, tallies: Mapping[int, AuditTally], ttl_s: int) -> None:
    """Queue the tallies' increments on ``pipe`` (the caller's transaction)."""
    for version, tally in tallies.items():
        key = tally_key(version)
        for name, value in tally.fields().items():
            if value:
                pipe.hincrbyfloat(key, name, value)
        pipe.expire(key, ttl_s)
        pipe.zadd(VERSIONS_KEY, {str(version): version})


def read_versions(client: redis.Redis, limit: int = 1000) -> list[tuple[int, AuditTally]]:
    """The newest ``limit`` policy versions with audits, oldest first, each with its tally (tallies whose
    hash expired are left out)."""
    newest = [int(v) for v in client.zrevrange(VERSIONS_KEY, 0, limit - 1)][::-1]
    with client.pipeline(transaction=False) as pipe:
        for version in newest:
            pipe.hgetall(tally_key(version))
        stored = pipe.execute()
    return [(version, AuditTally.from_fields(fields)) for version, fields in zip(newest, stored, strict=True) if fields]
