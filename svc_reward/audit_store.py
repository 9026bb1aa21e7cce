"""The reward service's audit state in Redis beside its tallies and labels (``strata.audit``): the defence's
shared state, its decisions and its re-distillation request; the alarm's served thresholds; how Level-1
answers escalate under the light RM in service.

Written by the reward worker (the defence by ``apply_step``); read by the worker, ``strata status``,
``strata diagnose``, the demo's report and ``strata rm refresh`` (the request).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import redis

from strata.audit import DEFENCE_KEY
from svc_reward.defence import DefenceState, DefenceStep

# -- the defence (svc_reward/defence.py) and its labels -------------------------------------------------

DECISIONS_KEY = "strata:reward:defence:decisions"  # newest first: {"at", "decision"}
# A re-distillation asked for: {"requested_at", "policy_version", "why", "labels": "strong" | "people"}
REDISTIL_KEY = "strata:reward:redistil"
THRESHOLDS_KEY = "strata:reward:audit:thresholds"  # the alarm's thresholds the reward service serves
# How Level-1 answers escalate under the light RM in service: {"rm_version", "line", "at"} (the worker's)
ESCALATION_KEY = "strata:reward:escalation:served"
KEPT_DECISIONS = 50


@dataclass(frozen=True)
class ServedThresholds:
    """The hacking alarm's thresholds as the reward service runs with them, for readers in another process
    (``strata status``, ``strata diagnose hacking``), whose environment may differ (a demo sets its own)."""

    min_audits: int
    gap_bound: float
    defence: bool


def write_thresholds(client: redis.Redis, thresholds: ServedThresholds) -> None:
    client.set(THRESHOLDS_KEY, json.dumps(asdict(thresholds)))


def read_thresholds(client: redis.Redis) -> ServedThresholds | None:
    """What the reward service wrote at its start; None when none ran on this Redis (or the value is not ours)."""
    raw = client.get(THRESHOLDS_KEY)
    try:
        data = json.loads(raw) if raw is not None else None
        return None if data is None else ServedThresholds(int(data["min_audits"]), float(data["gap_bound"]),
                                                          bool(data["defence"]))
    except (ValueError, KeyError, TypeError):
        return None


def write_escalation(client: redis.Redis, rm_version: str, line: str) -> None:
    client.set(ESCALATION_KEY, json.dumps({"rm_version": rm_version, "line": line, "at": time.time()}))


def read_escalation(client: redis.Redis) -> dict[str, Any] | None:
    """What the reward service last said it escalates by; None when none wrote it (or it is not ours)."""
    raw = client.get(ESCALATION_KEY)
    try:
        data = json.loads(raw) if raw is not None else None
        return data if isinstance(data, dict) and {"rm_version", "line"} <= set(data) else None
    except ValueError:
        return None


def read_defence(client: redis.Redis) -> DefenceState:
    return DefenceState.from_json(client.get(DEFENCE_KEY))


def apply_step(client: redis.Redis, step_from: Callable[[DefenceState], DefenceStep]) -> DefenceStep | None:
    """Read the shared state, step it, and write the step with its decision and request in one transaction;
    None when another replica wrote the state meanwhile (it took this step)."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(DEFENCE_KEY)
            state = DefenceState.from_json(pipe.get(DEFENCE_KEY))
            step = step_from(state)
            if step.state == state:
                pipe.unwatch()
                return step
            pipe.multi()
            pipe.set(DEFENCE_KEY, step.state.to_json())
            if step.decision is not None:
                pipe.lpush(DECISIONS_KEY, json.dumps({"at": time.time(), "decision": step.decision}))
                pipe.ltrim(DECISIONS_KEY, 0, KEPT_DECISIONS - 1)
            if step.redistil:
                pipe.set(REDISTIL_KEY, json.dumps({"requested_at": time.time(), "policy_version": step.state.acted_on,
                                                   "why": step.decision, "labels": step.labels}))
            pipe.execute()
            return step
        except redis.WatchError:
            return None


def read_decisions(client: redis.Redis, limit: int = 10) -> list[dict[str, Any]]:
    """The defence's newest decisions, newest first."""
    return [json.loads(raw) for raw in client.lrange(DECISIONS_KEY, 0, limit - 1)]


def redistil_request(client: redis.Redis) -> dict[str, Any] | None:
    raw = client.get(REDISTIL_KEY)
    return None if raw is None else json.loads(raw)


def clear_redistil(client: redis.Redis, answered: Mapping[str, Any]) -> bool:
    """Clear the request ``answered`` (as :func:`redistil_request` read it); a newer one, set by a second alarm
    while the turn ran, stays for the next check. True when it was cleared."""
    with client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(REDISTIL_KEY)
            raw = pipe.get(REDISTIL_KEY)
            if raw is None or json.loads(raw) != dict(answered):
                return False
            pipe.multi()
            pipe.delete(REDISTIL_KEY)
            pipe.execute()
            return True
        except redis.WatchError:  # set again between the read and the delete: that request is newer
            return False
