"""A Redis that came back empty: recognise it, and account per prompt for what it lost.

Redis keeps its data across a restart (append-only file), but it can still come back empty: a lost
volume, a ``FLUSHALL``, a new instance behind the same address. Kafka keeps every event within
retention (the compacted control topics keep every version for ever), and events carry hashes only,
so after such a loss Kafka says *which* prompts and responses there were, but not their texts.

Detection: the **epoch marker**, a Redis hash under ``strata:epoch`` (``id``, ``created_at``,
``created_by``, and ``recovered_at`` once ``strata recover redis`` has run), written when missing by
``strata infra up``, by ``strata recover redis`` and by each service at start (:func:`mark_start`).
A Redis is younger than Kafka's history when its marker is missing, or was created after the oldest
event the data topics retain: it came back empty (or predates the marker). :func:`assess` says which.

Accounting: :class:`History` folds the events of the prompt, rollout and reward topics into what
each prompt's requests did, and :func:`losses` says per prompt hash whether its text and its
responses' texts are gone and whether a request was still in flight and can no longer finish. Both
are pure; the marker functions are the I/O here, and ``strata.bus.scan.TopicScan`` reads the topics.

Layout of this module: topics, the marker (pure, then Redis), the history and the loss report
(pure).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import redis

from strata.bus import topics
from strata.bus.topics import Topic
from strata.contract.identity import request_identity
from strata.v1 import common_pb2, events_pb2

log = logging.getLogger(__name__)

MARKER_KEY = "strata:epoch"
# Producers stamp events with their own clocks: a marker this much younger than an event still
# counts as older (a client a few seconds behind must not make a fresh Redis look like a lost one).
CLOCK_SLACK_S = 60.0


@dataclass(frozen=True)
class RecoverTopics:
    """The topics a recovery reads (tests pass fresh ones)."""

    prompts: tuple[Topic[events_pb2.PromptRouted], ...] = (
        topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2)
    rollouts: Topic[events_pb2.RolloutGenerated] = topics.ROLLOUTS_GENERATED
    rewards: Topic[events_pb2.RewardScored] = topics.REWARDS_SCORED
    policy: Topic[events_pb2.PolicyUpdated] = topics.POLICY_UPDATED
    rm: Topic[events_pb2.RewardModelUpdated] = topics.RM_UPDATED

    @property
    def data(self) -> tuple[Topic[Any], ...]:
        """The topics Kafka deletes by age: their oldest event is how far back Kafka's history goes."""
        return (*self.prompts, self.rollouts, self.rewards)


def iso_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the epoch marker: pure --------------------------------------------------------------------------


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


INTACT = "intact"
CAME_BACK_EMPTY = "came back empty"
RECOVERED = "recovered"
NO_HISTORY = "no history"


@dataclass(frozen=True)
class Verdict:
    state: str   # INTACT | CAME_BACK_EMPTY | RECOVERED | NO_HISTORY
    detail: str  # one sentence for the operator

    @property
    def lost(self) -> bool:
        """Redis is younger than Kafka's history and nothing was rebuilt since."""
        return self.state == CAME_BACK_EMPTY


def assess(marker: Marker | None, oldest_event_s: float | None, texts_lost: int | None = None,
           slack_s: float = CLOCK_SLACK_S) -> Verdict:
    """What the marker and the oldest event the data topics retain say about this Redis. Pure.

    ``texts_lost``: texts of the events read so far that are gone though their TTL has not run out.
    A Redis younger than the marker-less releases (upgraded) has a missing or new marker too, but
    it lost nothing: with none lost it is intact.
    """
    if oldest_event_s is None:
        return Verdict(NO_HISTORY, "Kafka's prompt, rollout and reward topics hold no event: nothing was lost "
                                   "that Kafka could tell")
    since = f"Kafka holds events since {iso_time(oldest_event_s)}"
    if marker is None:
        why = f"no {MARKER_KEY} marker in Redis and {since}"
    else:
        created = f"{MARKER_KEY} {marker.id} created {iso_time(marker.created_at)} by {marker.created_by or '?'}"
        if marker.created_at <= oldest_event_s + slack_s:
            return Verdict(INTACT, f"{created}, before the oldest event Kafka holds ({iso_time(oldest_event_s)})")
        if marker.recovered_at is not None:
            return Verdict(RECOVERED, f"{created}, after {since}; recovered {iso_time(marker.recovered_at)}")
        why = f"{created}, after {since}"
    if texts_lost == 0:
        return Verdict(INTACT, f"{why}, but no text of those events is missing: Redis predates the marker")
    lost = "" if texts_lost is None else f"; {texts_lost} texts of those events are missing"
    return Verdict(CAME_BACK_EMPTY, f"{why}{lost}: Redis came back empty")


# -- the epoch marker: Redis -------------------------------------------------------------------------

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


# -- what Kafka says each prompt went through: pure --------------------------------------------------


@dataclass(frozen=True)
class RewardSeen:
    """What ``request_done`` reads of one ``RewardScored``."""

    tier: int
    scorer: int
    final: bool
    escalated: bool


@dataclass
class RequestHistory:
    routed: bool = False
    n_samples: int = 0  # what the client asked for (a Level-1 escalation's routing does not count)
    rewards: list[RewardSeen] = field(default_factory=list)
    rollouts: dict[tuple[int, int], str] = field(default_factory=dict)  # (tier, sample index) -> response hash
    scored: set[tuple[int, int]] = field(default_factory=set)          # (tier, sample index) with a reward


@dataclass
class PromptHistory:
    newest_ms: int = 0  # newest event of the prompt: its text was (re)written no later than this
    requests: dict[str, RequestHistory] = field(default_factory=dict)
    responses: dict[str, int] = field(default_factory=dict)  # response hash -> newest rollout event (ms)


class History:
    """The prompt, rollout and reward events Kafka retains, folded per prompt and request. Pure.

    Feed the prompt topics first, then rollouts, then rewards: a request without a client id is
    known downstream by the time it was routed (``strata.contract.identity``), and the probe
    re-stamps that time, so its routings are linked by their ``submitted_at``.
    """

    def __init__(self) -> None:
        self.prompts: dict[str, PromptHistory] = {}
        self._alias: dict[tuple[str, str], str] = {}  # (prompt, identity downstream) -> request key

    def _prompt(self, prompt_hash: str, timestamp_ms: int) -> PromptHistory:
        prompt = self.prompts.setdefault(prompt_hash, PromptHistory())
        prompt.newest_ms = max(prompt.newest_ms, timestamp_ms)
        return prompt

    def _request(self, prompt_hash: str, identity: str) -> RequestHistory:
        key = self._alias.get((prompt_hash, identity), identity)
        return self.prompts[prompt_hash].requests.setdefault(key, RequestHistory())

    def add_routed(self, message: events_pb2.PromptRouted, timestamp_ms: int) -> None:
        self._prompt(message.prompt_hash, timestamp_ms)
        identity = request_identity(message.request_id, message.routed_at.seconds, message.routed_at.nanos)
        if message.request_id:
            key = self._alias.get((message.prompt_hash, identity), identity)
        else:
            key = f"s{message.submitted_at.seconds}.{message.submitted_at.nanos}"
        self._alias[(message.prompt_hash, identity)] = key
        request = self.prompts[message.prompt_hash].requests.setdefault(key, RequestHistory())
        request.routed = True
        if message.escalated_from != common_pb2.TIER_LEVEL_1:  # an escalation is not what the client asked
            request.n_samples = max(request.n_samples, message.n_samples or 1)

    def add_rollout(self, message: events_pb2.RolloutGenerated, timestamp_ms: int) -> None:
        prompt = self._prompt(message.prompt_hash, timestamp_ms)
        prompt.responses[message.response_hash] = max(prompt.responses.get(message.response_hash, 0), timestamp_ms)
        request = self._request(message.prompt_hash, message.request_id)
        request.rollouts[(message.tier, message.sample_index)] = message.response_hash

    def add_reward(self, message: events_pb2.RewardScored, timestamp_ms: int) -> None:
        self._prompt(message.prompt_hash, timestamp_ms)
        request = self._request(message.prompt_hash, message.request_id)
        request.rewards.append(RewardSeen(message.tier, message.scorer, message.final, message.escalated))
        if message.response_hash:
            request.scored.add((message.tier, message.sample_index))

    def hashes(self) -> set[str]:
        """Every prompt and response hash whose text the content store should hold."""
        return set(self.prompts).union(*(p.responses for p in self.prompts.values()))


# -- what was lost, per prompt: pure -----------------------------------------------------------------

PRESENT, LOST, EXPIRED = "present", "lost", "expired"


@dataclass(frozen=True)
class PromptLoss:
    """One prompt after the loss: hashes and counts, never a text."""

    prompt_hash: str
    text: str               # PRESENT | LOST | EXPIRED (gone, but its TTL had run out anyway)
    responses: int          # response hashes Kafka retains for it
    responses_lost: int
    responses_expired: int
    requests: int           # requests seen
    in_flight: int          # routed and without all the rewards it will get
    resubmit: int           # of those, requests that can no longer finish: a text they still need is gone

    @property
    def affected(self) -> bool:
        return self.text == LOST or self.responses_lost > 0 or self.in_flight > 0


@dataclass(frozen=True)
class LossSummary:
    prompts: int
    texts_lost: int
    texts_expired: int
    responses_lost: int
    in_flight: int   # prompts with a request in flight
    resubmit: int    # prompts with a request that the client must submit again

    @classmethod
    def of(cls, losses: Sequence[PromptLoss]) -> LossSummary:
        return cls(len(losses), sum(p.text == LOST for p in losses), sum(p.text == EXPIRED for p in losses),
                   sum(p.responses_lost for p in losses), sum(p.in_flight > 0 for p in losses),
                   sum(p.resubmit > 0 for p in losses))


def text_state(present: bool, newest_ms: int, now_s: float, ttl_s: float) -> str:
    """A text the content store does not hold is lost, unless its TTL had run out anyway."""
    if present:
        return PRESENT
    return EXPIRED if newest_ms / 1000 < now_s - ttl_s else LOST


def cannot_finish(request: RequestHistory, prompt_text: str, responses: Mapping[str, str]) -> bool:
    """An in-flight request needs its prompt's text (every stage reads it) and the texts of its
    responses not scored yet (the reward service reads them)."""
    pending = [h for sample, h in request.rollouts.items() if sample not in request.scored]
    return prompt_text != PRESENT or any(responses[h] != PRESENT for h in pending)


def losses(history: History, present: Collection[str], now_s: float, content_ttl_s: float,
           request_done: Callable[[list[RewardSeen], int], bool]) -> list[PromptLoss]:
    """Per prompt, in hash order: which texts are gone and which requests were left in flight.

    ``present``: the hashes whose text the content store holds now (texts and token ids are written
    together, in one transaction, with one TTL: the text stands for both). ``request_done``: whether
    a request has all the rewards it will get, given its rewards and the samples it asked for (the
    rule a client waits on, ``strata.train.request_done``).
    """
    report = []
    for prompt_hash in sorted(history.prompts):
        prompt = history.prompts[prompt_hash]
        text = text_state(prompt_hash in present, prompt.newest_ms, now_s, content_ttl_s)
        responses = {h: text_state(h in present, ms, now_s, content_ttl_s) for h, ms in prompt.responses.items()}
        in_flight = [r for r in prompt.requests.values() if r.routed and not request_done(r.rewards, r.n_samples)]
        report.append(PromptLoss(
            prompt_hash, text, len(responses), sum(s == LOST for s in responses.values()),
            sum(s == EXPIRED for s in responses.values()), len(prompt.requests), len(in_flight),
            sum(cannot_finish(r, text, responses) for r in in_flight),
        ))
    return report
