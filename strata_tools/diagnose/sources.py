"""The edge of the checks: the live services' gRPC APIs, the rollout topic, the content store and a
generator's ``/metrics``. Everything here translates to the checks' plain types and back."""

from __future__ import annotations

import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strata import rpc
from strata.bus import topics
from strata.bus.scan import TopicScan
from strata.config import StrataSettings
from strata.content_store import ContentNotFoundError, ContentStore
from strata.contract.template import format_prompt
from strata.contract.tiers import TIER_ENUM
from strata.v1 import (
    common_pb2,
    events_pb2,
    generator_pb2,
    generator_pb2_grpc,
    learner_pb2,
    learner_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
)
from strata_tools.diagnose.items import Pair, ScoredBatch, chunks
from strata_tools.diagnose.shift import Rollout

MAX_SCORE_ITEMS = 256  # svc_reward's default max_items_per_request


class RewardClient:
    def __init__(self, address: str, timeout_s: float) -> None:
        self._channel = rpc.channel(address)
        self._stub = reward_pb2_grpc.RewardStub(self._channel)
        self._timeout_s = timeout_s

    def score(self, pairs: Sequence[Pair], strong: bool = False) -> ScoredBatch:
        rewards: list[float] = []
        spreads: list[float] = []
        version = ""
        for chunk in chunks(pairs, MAX_SCORE_ITEMS):
            reply = self._stub.Score(reward_pb2.ScoreRequest(
                items=[reward_pb2.ScoreItem(prompt=p.prompt, response=p.response) for p in chunk],
                scorer=common_pb2.SCORER_STRONG if strong else common_pb2.SCORER_LIGHT,
            ), timeout=self._timeout_s)
            rewards.extend(s.reward for s in reply.scores)
            spreads.extend(s.reward_std for s in reply.scores)
            version = reply.rm_version
        return ScoredBatch(rewards, spreads, version)

    def close(self) -> None:
        self._channel.close()


@dataclass(frozen=True)
class Generated:
    responses: list[str]
    sampling: common_pb2.SamplingParams   # parameters in effect, as the generator reports them
    model_id: str


class GeneratorClient:
    def __init__(self, address: str, timeout_s: float, chunk: int) -> None:
        self._channel = rpc.channel(address)
        self._stub = generator_pb2_grpc.GeneratorStub(self._channel)
        self._timeout_s = timeout_s
        self._chunk = chunk

    def generate(self, prompt: str, n: int, temperature: float | None = None, top_p: float | None = None
                 ) -> Generated:
        sampling = common_pb2.SamplingParams()
        if temperature is not None:
            sampling.temperature = temperature
        if top_p is not None:
            sampling.top_p = top_p
        responses: list[str] = []
        reply: Any = None
        while len(responses) < n:
            want = min(self._chunk, n - len(responses))
            reply = self._stub.Generate(generator_pb2.GenerateRequest(prompt=prompt, n_samples=want, sampling=sampling),
                                        timeout=self._timeout_s)
            responses.extend(g.response for g in reply.generations)
        return Generated(responses, reply.sampling, reply.model_id)

    def close(self) -> None:
        self._channel.close()


def learner_checkpoint(address: str, timeout_s: float) -> tuple[str, int]:
    """(checkpoint path, policy version) of the learner's current policy."""
    with rpc.channel(address) as channel:
        status = learner_pb2_grpc.LearnerStub(channel).Status(learner_pb2.LearnerStatusRequest(), timeout=timeout_s)
    if not status.checkpoint_path:
        raise LookupError(f"the learner at {address} has no checkpoint yet")
    return status.checkpoint_path, int(status.policy_version)


def scrape(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:
        return reply.read().decode("utf-8")


def recent_rollout_events(settings: StrataSettings, max_events: int, since_ms: int, tier: int = 0,
                          per_partition: int | None = None) -> list[events_pb2.RolloutGenerated]:
    """The newest ``max_events`` rollout events generated at or after ``since_ms`` (of ``tier``; 0 = any).

    Reads backwards from the end of each partition (``per_partition`` events, default 4 x
    ``max_events``) without a consumer group, so it never disturbs the services' offsets.
    """
    topic = topics.ROLLOUTS_GENERATED
    wanted = TIER_ENUM.get(tier)
    events: list[tuple[int, events_pb2.RolloutGenerated]] = []
    with TopicScan(settings, client_id="strata-diagnose") as scan:
        for delivery in scan.events(topic, bounds=scan.newest(topic.name, per_partition or 4 * max_events)):
            event = delivery.message
            at_ms = event.generated_at.ToMilliseconds() or delivery.timestamp_ms
            if at_ms >= since_ms and (wanted is None or event.tier == wanted):
                events.append((at_ms, event))
    events.sort(key=lambda pair: pair[0])
    return [event for _, event in events[-max_events:]]


def rollouts_from_store(events: Sequence[events_pb2.RolloutGenerated], store: ContentStore, tokenizer: Any,
                        tokenizer_key: str) -> tuple[list[Rollout], int]:
    """Token ids of each event's context and response, as the generator saw and wrote them; returns
    (rollouts, how many events were skipped because their content expired or used another tokenizer)."""
    rollouts, missing = [], 0
    for event in events:
        try:
            response_ids = store.get_tokens(event.response_hash, tokenizer_key)
            prompt = store.get_text(event.prompt_hash)
        except ContentNotFoundError:
            missing += 1
            continue
        context = format_prompt(prompt, [d.name for d in event.directions])
        prompt_ids = tuple(tokenizer(context)["input_ids"])
        if prompt_ids and response_ids:
            rollouts.append(Rollout(prompt_ids, tuple(response_ids), int(event.policy_version)))
        else:
            missing += 1
    return rollouts, missing
