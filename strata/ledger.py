"""The cost ledger (R4): tokens and device-seconds per tier, in Redis, and the saving it implies.

Writers (the generators) add each rollout once, right after claiming it (see
``svc_generator.worker``); readers (``strata report``, the demo) compute the tier mix and the saving
against sending everything to Level-2. Pure arithmetic lives in :func:`summarise`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import redis

_KEY = "strata:ledger:tier:{tier}"
COUNTS_KEY = "strata:ledger:counts"
TIERS = (1, 2)


@dataclass(frozen=True)
class TierCost:
    tier: int
    rollouts: int
    tokens: int
    device_seconds: float

    @property
    def seconds_per_token(self) -> float | None:
        return self.device_seconds / self.tokens if self.tokens else None


@dataclass(frozen=True)
class CostSummary:
    tiers: tuple[TierCost, ...]
    counts: Mapping[str, int]             # e.g. escalations, finals, skips
    total_device_seconds: float
    all_level2_device_seconds: float | None   # every token at Level-2's per-token cost
    saving: float | None                  # 1 - actual / all-Level-2

    def tier(self, tier: int) -> TierCost:
        return next(t for t in self.tiers if t.tier == tier)


def record_rollout(client: redis.Redis, tier: int, tokens: int, device_seconds: float) -> None:
    with client.pipeline(transaction=True) as pipe:
        key = _KEY.format(tier=tier)
        pipe.hincrby(key, "rollouts", 1)
        pipe.hincrby(key, "tokens", tokens)
        pipe.hincrbyfloat(key, "device_seconds", device_seconds)
        pipe.execute()


def count(client: redis.Redis, name: str, amount: int = 1) -> None:
    client.hincrby(COUNTS_KEY, name, amount)


def summarise(tiers: list[TierCost], counts: Mapping[str, int], level2_seconds_per_token: float | None = None
              ) -> CostSummary:
    """Tier mix and saving. Level-2's per-token cost comes from its own rollouts unless given."""
    total = sum(t.device_seconds for t in tiers)
    tokens = sum(t.tokens for t in tiers)
    per_token = level2_seconds_per_token
    if per_token is None:
        per_token = next((t.seconds_per_token for t in tiers if t.tier == 2), None)
    all_l2 = per_token * tokens if per_token is not None and tokens else None
    saving = 1.0 - total / all_l2 if all_l2 else None
    return CostSummary(tuple(tiers), dict(counts), total, all_l2, saving)


def read(client: redis.Redis, level2_seconds_per_token: float | None = None) -> CostSummary:
    tiers = []
    for tier in TIERS:
        raw = {k.decode(): v.decode() for k, v in client.hgetall(_KEY.format(tier=tier)).items()}
        tiers.append(TierCost(tier, int(raw.get("rollouts", 0)), int(raw.get("tokens", 0)),
                              float(raw.get("device_seconds", 0.0))))
    counts = {k.decode(): int(v) for k, v in client.hgetall(COUNTS_KEY).items()}
    return summarise(tiers, counts, level2_seconds_per_token)
