"""Tier numbers: the protobuf tier enum as the 1 / 2 that ledgers, settings and logs use."""

from __future__ import annotations

from strata.v1 import common_pb2

# The generator tiers that produce rollouts (Level-0 is the probe: it proposes directions, no rollout).
TIER_NUMBER: dict[int, int] = {common_pb2.TIER_LEVEL_1: 1, common_pb2.TIER_LEVEL_2: 2}
# ...and back: the wire enum of a tier number.
TIER_ENUM: dict[int, int] = {number: enum for enum, number in TIER_NUMBER.items()}
