"""The escalation signals of the Level-1 answers people label, kept for refitting the rule (issue 61, item 2).

The rule (``svc_reward.escalation_rule``) is fitted on labelled Level-1 answers. Live, the labels are the
desk's scores of the share ``annotate_level1_share`` of Level-1 answers, drawn by response hash whatever
their route: a fair sample of what Level-1 writes. A refresh turn (``strata rm refresh``) re-scores those
answers with its candidate light RM, but the other signals came with the rollout event and are gone by
then: the generator's log-probabilities, its token count and limit, the neighbourhood's record. The worker
keeps them here, one small JSON per drawn answer, for as long as the answer's text lives in the content store.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import redis

from strata.v1 import events_pb2
from svc_reward.escalation_rule import Signals

SIGNALS_PREFIX = "strata:reward:signals:"  # + response hash


@dataclass(frozen=True)
class StoredSignals:
    """What a Level-1 rollout event says of its answer, beyond the text and the light RM's score."""

    logprob_mean: float | None
    logprob_min: float | None
    response_tokens: int
    max_new_tokens: int          # 0: unknown
    record_labelled: float | None  # None: the event carried no neighbourhood record
    record_bad: float
    policy_version: int

    @classmethod
    def of(cls, event: events_pb2.RolloutGenerated) -> StoredSignals:
        return cls(
            event.response_logprob_mean if event.HasField("response_logprob_mean") else None,
            event.response_logprob_min if event.HasField("response_logprob_min") else None,
            event.response_tokens,
            event.sampling.max_new_tokens if event.sampling.HasField("max_new_tokens") else 0,
            event.level1_record.labelled if event.HasField("level1_record") else None,
            event.level1_record.bad, event.policy_version)

    def signals(self, light: float, spread: float, response: str) -> Signals:
        """The rule's signals once a light RM has scored ``response``."""
        return Signals(light, spread, self.logprob_mean, self.logprob_min, self.response_tokens,
                       self.max_new_tokens, response, self.record_labelled, self.record_bad)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str | bytes) -> StoredSignals:
        """ValueError when ``raw`` is not one."""
        try:
            data: dict[str, Any] = json.loads(raw)
            return cls(_optional(data["logprob_mean"]), _optional(data["logprob_min"]), int(data["response_tokens"]),
                       int(data["max_new_tokens"]), _optional(data["record_labelled"]), float(data["record_bad"]),
                       int(data["policy_version"]))
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not stored escalation signals: {exc}") from exc


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)


def add_signals(pipe: Any, kept: Iterable[tuple[str, StoredSignals]], ttl_s: int) -> None:
    """Queue the signals of each (response hash, signals) on ``pipe`` (a Redis pipeline), expiring with the texts.
    Keyed by the answer alone: a second delivery writes the same value."""
    for response_hash, stored in kept:
        pipe.set(SIGNALS_PREFIX + response_hash, stored.to_json(), ex=ttl_s)


def read_signals(client: redis.Redis, response_hashes: Iterable[str]) -> dict[str, StoredSignals]:
    """The stored signals of those answers that have them (expired, never drawn or unreadable: left out)."""
    hashes = list(dict.fromkeys(response_hashes))
    if not hashes:
        return {}
    found: dict[str, StoredSignals] = {}
    for response_hash, raw in zip(hashes, client.mget([SIGNALS_PREFIX + h for h in hashes]), strict=True):
        if raw is None:
            continue
        try:
            found[response_hash] = StoredSignals.from_json(raw)
        except ValueError:
            continue
    return found

