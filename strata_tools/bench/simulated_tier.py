"""The simulated tier behind ``strata bench scheduler``: a policy whose rollouts the oracle scores.

Per paraphrase family a competence (mostly good, mostly bad with one consistent failure mode, or
mixed); responses written by the zoo's corpus and judged by the oracle. Rewards are a pure function
of (seed, request id, policy version), so a redelivery republishes identical rewards. The tier is a
real Kafka worker on the prompt topics that publishes those rewards as final ``RewardScored`` events.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.bus import Publisher, Worker, topics
from strata.errors import CliError
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2
from strata_tools.task.corpus import DEGRADATIONS, degrade, reference_response
from strata_tools.task.oracle import oracle_score

if TYPE_CHECKING:
    from strata.bus import Delivery
    from strata_tools.task.suite import PromptRecord
    from svc_scheduler.config import SchedulerSettings

TARGET_P_GOOD = 0.95  # what a policy update moves each family's competence toward
POLICY_STEP_GAIN = 0.1  # share of the remaining gap closed per policy version
VARIANCE_SAMPLES = 24  # rollouts behind a prompt's true reward variance (the ceiling's R10/R11 split)
EXPECTED_SAMPLES = 64  # rollouts behind a prompt's expected reward (--error-anatomy: the truth without its noise)


@dataclass(frozen=True)
class Competence:
    p_good: float  # chance a rollout is a decent answer
    failure: str  # the family's typical way of failing (a corpus degradation)


def family_competence(families: Sequence[str], risk: dict[str, bool], seed: int) -> dict[str, Competence]:
    rng = random.Random(seed)
    kinds = [k for k in DEGRADATIONS if k not in ("unsafe", "no_caution")]
    table = {}
    for family in sorted(families):
        roll = rng.random()
        p_good = 0.95 if roll < 0.45 else 0.05 if roll < 0.7 else rng.uniform(0.3, 0.7)
        failure = rng.choice(kinds + (["no_caution"] if risk[family] else []))
        table[family] = Competence(p_good, failure)
    return table


def rollout_reward(record: PromptRecord, competence: Competence, rng: random.Random) -> float:
    response = reference_response(record, rng)
    if rng.random() >= competence.p_good:
        response = degrade(record, response, competence.failure, rng)
    return oracle_score(record, response)


class SimulatedPolicy:
    """The policy behind the generators, by version; its rollouts are scored by the oracle.

    Rewards are a pure function of (seed, request id, policy version): the rollout tier and the
    baselines get the same rewards for the same submission, and a redelivery repeats them exactly.
    """

    def __init__(self, records: Sequence[PromptRecord], seed: int, truth_samples: int) -> None:
        self._base = family_competence({r.family for r in records}, {r.family: r.risk for r in records}, seed)
        self._seed = seed
        self._truth_samples = truth_samples
        self._truth: dict[tuple[str, int], float] = {}
        self._variance: dict[tuple[str, int], float] = {}
        self._expected: dict[tuple[str, int], float] = {}

    def competence(self, record: PromptRecord, version: int) -> Competence:
        base = self._base[record.family]
        p_good = TARGET_P_GOOD - (TARGET_P_GOOD - base.p_good) * (1 - POLICY_STEP_GAIN) ** max(0, version - 1)
        return Competence(p_good, base.failure)

    def rewards(self, record: PromptRecord, request_id: str, version: int, n: int) -> list[float]:
        rng = random.Random(f"{self._seed}:rollout:{request_id}:v{version}")
        competence = self.competence(record, version)
        return [rollout_reward(record, competence, rng) for _ in range(n)]

    def truth(self, record: PromptRecord, version: int) -> float:
        """Mean oracle reward of ``truth_samples`` rollouts by policy ``version`` (cached: skips repeat)."""
        return self._measured("truth", record, version, self._truth_samples, np.mean, self._truth)

    def expected(self, record: PromptRecord, version: int) -> float:
        """The prompt's expected reward under policy ``version``, near enough: the mean of ``EXPECTED_SAMPLES``
        rollouts (cached), against which the ``truth_samples``-rollout truth has noise of its own."""
        return self._measured("expected", record, version, EXPECTED_SAMPLES, np.mean, self._expected)

    def variance(self, record: PromptRecord, version: int) -> float:
        """Per-rollout reward variance of the prompt under policy ``version`` (``VARIANCE_SAMPLES``
        rollouts, cached): what R10 and R11 judge from a handful of samples, known here exactly enough."""
        return self._measured("variance", record, version, VARIANCE_SAMPLES, lambda r: np.var(r, ddof=1),
                              self._variance)

    def _measured(self, purpose: str, record: PromptRecord, version: int, n: int,
                  statistic: Callable[[list[float]], Any], cache: dict[tuple[str, int], float]) -> float:
        """``statistic`` of ``n`` rollouts drawn for ``purpose`` alone (its own seed), cached per prompt and version."""
        key = (record.text, version)
        if key not in cache:
            rng = random.Random(f"{self._seed}:{purpose}:{record.text}:v{version}")
            competence = self.competence(record, version)
            cache[key] = float(statistic([rollout_reward(record, competence, rng) for _ in range(n)]))
        return cache[key]


def reward_event(prompt_hash: str, request_id: str, version: int, tier: int, i: int,
                 value: float) -> events_pb2.RewardScored:
    message = events_pb2.RewardScored(
        prompt_hash=prompt_hash,
        # Distinct per sample and submission; the same on a redelivery (the statistics dedupe by it).
        response_hash=content_hash(f"bench response {request_id} v{version} #{i} {prompt_hash}"),
        tier=tier, policy_version=version, rm_version="oracle", reward=value,
        scorer=common_pb2.SCORER_HUMAN, final=True, sample_index=i, request_id=request_id,
    )
    message.scored_at.GetCurrentTime()
    return message


class SimulatedRolloutTier:
    """Probe, generators and reward service in one Kafka worker: routed prompts in, oracle rewards out.

    Prompts it does not know (another client's) are left alone. ``version`` is the simulated policy's
    version (set by the bench, as a generator loads new weights); ``handled`` maps each handled
    request id to the version it was rolled out with.
    """

    def __init__(self, settings: SchedulerSettings, group_id: str, policy: SimulatedPolicy,
                 records: dict[str, PromptRecord], publisher: Publisher) -> None:
        self._policy = policy
        self._records = records
        self._publisher = publisher
        self._level2 = topics.PROMPTS_LEVEL2.name
        self._done = threading.Condition()
        self.handled: dict[str, int] = {}
        self.version = 1
        self.rollouts = 0
        self.error: BaseException | None = None
        self.worker = Worker(settings, group_id, publisher=publisher, client_id=group_id, batch_handlers={
            topics.PROMPTS_LEVEL0: self.on_batch, topics.PROMPTS_LEVEL2: self.on_batch,
        })

    def on_batch(self, deliveries: list[Delivery[events_pb2.PromptRouted]]) -> None:
        futures = []
        done: dict[str, int] = {}
        rollouts = 0
        for delivery in deliveries:
            routed = delivery.message
            record = self._records.get(routed.prompt_hash)
            if record is None:
                continue
            tier = common_pb2.TIER_LEVEL_2 if delivery.topic.name == self._level2 else common_pb2.TIER_LEVEL_1
            version = self.version
            values = self._policy.rewards(record, routed.request_id, version, routed.n_samples)
            for i, value in enumerate(values):
                event = reward_event(routed.prompt_hash, routed.request_id, version, tier, i, value)
                futures.append(self._publisher.publish(topics.REWARDS_SCORED, event))
            if routed.request_id not in self.handled and routed.request_id not in done:
                rollouts += len(values)  # a redelivery republishes the same rewards; count them once
            done[routed.request_id] = version
        Publisher.wait(futures)  # durable before the offsets are committed and before the bench is told
        with self._done:
            self.rollouts += rollouts
            self.handled.update(done)
            self._done.notify_all()

    def run(self, stop: threading.Event) -> None:
        try:
            self.worker.run(stop)
        except BaseException as exc:  # reported to the waiting bench instead of dying silently
            with self._done:
                self.error = exc
                self._done.notify_all()

    def wait_for(self, request_ids: Sequence[str], timeout_s: float) -> None:
        with self._done:
            finished = self._done.wait_for(
                lambda: self.error is not None or all(r in self.handled for r in request_ids), timeout_s)
            if self.error is not None:
                raise CliError(f"the simulated rollout tier failed: {type(self.error).__name__}: {self.error}")
            if not finished:
                missing = sum(r not in self.handled for r in request_ids)
                raise CliError(f"timed out after {timeout_s:.0f} s: {missing} routed prompts never reached the "
                               "simulated rollout tier")
