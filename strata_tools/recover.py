"""A Redis that came back empty: what the epoch marker and Kafka say, and what each prompt lost.

Kafka keeps every event within retention (the compacted control topics keep every version for ever),
and events carry hashes only, so after Redis lost its data Kafka says *which* prompts and responses
there were, but not their texts. :func:`assess` reads the epoch marker (``strata.epoch``) against
the oldest event the data topics retain; :class:`History` folds the events of the prompt, rollout
and reward topics into what each prompt's requests did, and :func:`losses` says per prompt hash
whether its text and its responses' texts are gone and whether a request was still in flight and can
no longer finish. All pure; ``strata recover redis`` (``strata_tools.cli.recover_cmd``) does the I/O,
and ``strata.bus.scan.TopicScan`` reads the topics.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.bus import topics
from strata.bus.topics import Topic
from strata.contract.identity import request_identity
from strata.epoch import CLOCK_SLACK_S, MARKER_KEY, Marker, iso_time
from strata.v1 import common_pb2, events_pb2


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


# -- the verdict: pure -----------------------------------------------------------------------------


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
    rule a client waits on, ``strata_tools.train.request_done``).
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
