"""``strata train``: drive the whole loop on the zoo's task through the running services.

Each round submits a batch of training prompts to the scheduler (gRPC ``SubmitBatch``), follows the
rewards topic until their final rewards are in, and watches the learner's version advance (the
learner updates on its own when it has a batch, and generators pick up new weights between batches).
Before and after, the current policy answers held-out prompts (probe directions + Level-1 generator)
scored by the light RM and the oracle. Writes a reward curve (PNG) and a JSON summary.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from strata import rpc
from strata.bus import topics
from strata.bus.tail import TailReader
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.v1 import (
    common_pb2,
    generator_pb2,
    generator_pb2_grpc,
    learner_pb2,
    learner_pb2_grpc,
    probe_pb2,
    probe_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from strata_tools.rm.onpolicy import BAD_THRESHOLD
from strata_tools.zoo.oracle import oracle_score
from strata_tools.zoo.suite import PromptRecord, load_suite

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Addresses:
    scheduler: str = "127.0.0.1:50051"
    probe: str = "127.0.0.1:50052"
    generator: str = "127.0.0.1:50053"
    learner: str = "127.0.0.1:50055"
    reward: str = "127.0.0.1:50056"
    annotation: str = "127.0.0.1:50057"


@dataclass(frozen=True)
class TrainOptions:
    updates: int = 5                 # stop after the learner advanced this many versions
    prompts_per_round: int = 16
    n_samples: int = 4               # rollouts per prompt (variance for the scheduler, batch for PPO)
    eval_prompts: int = 32
    round_timeout_s: float = 300.0
    max_rounds: int = 50
    report_dir: Path = Path(".strata/reports")
    seed: int = 0
    # Real traffic repeats itself: a share of each round's prompts are prompts sent before, and a share
    # are paraphrases of them (another member of a family already sent). The rest are new.
    repeat_share: float = 0.0
    paraphrase_share: float = 0.0


@dataclass
class RoundStats:
    round: int
    policy_version: int                  # learner version at the end of the round
    submitted: int
    decisions: dict[str, int]
    finals: int
    level1_samples: int                  # Level-1 samples scored this round
    mean_reward: float | None            # light-RM rewards of every Level-1 sample (final or escalated)
    mean_oracle: float | None            # oracle score of those responses
    seconds: float


@dataclass
class Evaluation:
    policy_version: int
    mean_reward: float
    mean_oracle: float
    rewards: list[float] = field(default_factory=list)  # per held-out prompt, in a fixed order
    oracle_scores: list[float] = field(default_factory=list)

    @property
    def bad_share(self) -> float:
        """Share of held-out answers the oracle scores under ``BAD_THRESHOLD``: the bad cases."""
        return sum(score < BAD_THRESHOLD for score in self.oracle_scores) / max(1, len(self.oracle_scores))


@dataclass(frozen=True)
class Change:
    """A paired before/after difference over the same held-out prompts (same sampling seeds)."""

    mean: float
    stderr: float  # standard error of the mean paired difference
    n: int

    def __str__(self) -> str:
        return f"{self.mean:+.3f} ± {self.stderr:.3f} (paired SE, n={self.n})"


def paired_change(before: Sequence[float], after: Sequence[float]) -> Change:
    if len(before) != len(after) or len(before) < 2:
        raise ValueError("a paired change needs two equally long lists of at least 2 scores")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    return Change(statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)), len(diffs))


@dataclass(frozen=True)
class Oscillation:
    """How far the rounds' mean light-RM reward swings from one round to the next (R8's symptom: a reward
    curve that oscillates by ±2 when the RM's scores are noisy)."""

    step_std: float       # standard deviation of the round-to-round changes
    largest_step: float   # the round-to-round change largest in size, with its sign
    rounds: int

    def __str__(self) -> str:
        return (f"±{self.step_std:.3f} (std of the round-to-round change over {self.rounds} rounds; "
                f"largest {self.largest_step:+.3f})")


def reward_oscillation(round_rewards: Sequence[float]) -> Oscillation | None:
    """The oscillation of a reward curve; None under three rounds (one change has no spread)."""
    if len(round_rewards) < 3:
        return None
    steps = [after - before for before, after in itertools.pairwise(round_rewards)]
    return Oscillation(statistics.stdev(steps), max(steps, key=abs), len(round_rewards))


@dataclass
class TrainSummary:
    start_version: int
    end_version: int
    rounds: list[RoundStats] = field(default_factory=list)
    before: Evaluation | None = None
    after: Evaluation | None = None
    weight_sync_s: float | None = None
    png: str | None = None

    @property
    def reward_change(self) -> Change | None:
        """Held-out light-RM reward after minus before, per prompt."""
        if not self.before or not self.after:
            return None
        return paired_change(self.before.rewards, self.after.rewards)

    @property
    def oracle_change(self) -> Change | None:
        """Held-out oracle score after minus before, per prompt."""
        if not self.before or not self.after:
            return None
        return paired_change(self.before.oracle_scores, self.after.oracle_scores)

    @property
    def hacking_gap(self) -> Change | None:
        """Held-out light-RM reward change minus oracle change, per prompt: what the policy gained in
        the RM's eyes and not in the oracle's (reward hacking, issue 37; 0 when both move alike)."""
        if not self.before or not self.after:
            return None
        return paired_change([r - o for r, o in zip(self.before.rewards, self.before.oracle_scores, strict=True)],
                             [r - o for r, o in zip(self.after.rewards, self.after.oracle_scores, strict=True)])

    @property
    def reward_oscillation(self) -> Oscillation | None:
        """The round-to-round swing of the rounds' mean light-RM reward (the curve the learner climbs)."""
        return reward_oscillation([r.mean_reward for r in self.rounds if r.mean_reward is not None])

    @property
    def reward_gain(self) -> float | None:
        if not self.before or not self.after or self.before.mean_reward == 0:
            return None
        return self.after.mean_reward / self.before.mean_reward - 1.0


def round_prompts(records: Sequence[PromptRecord], cursor: int, n: int, sent: Sequence[PromptRecord],
                  rng: random.Random, repeat_share: float = 0.0, paraphrase_share: float = 0.0,
                  ) -> tuple[list[PromptRecord], int]:
    """One round's ``n`` prompts and how many new ones it took from ``records`` at ``cursor``.

    ``repeat_share`` of them repeat a prompt of ``sent`` (drawn uniformly), ``paraphrase_share`` are
    another member of the paraphrase family of a sent prompt; the rest, and any share that ``sent``
    cannot supply yet (the first round), are the next new prompts. Pure: the randomness is ``rng``'s.
    """
    if not (repeat_share >= 0.0 and paraphrase_share >= 0.0 and repeat_share + paraphrase_share <= 1.0):
        raise ValueError("repeat_share and paraphrase_share must be >= 0 and sum to at most 1")
    family: dict[str, list[PromptRecord]] = {}
    for record in records:
        family.setdefault(record.family, []).append(record)
    batch: list[PromptRecord] = []
    if sent:
        batch += [rng.choice(sent) for _ in range(round(n * repeat_share))]
        for _ in range(round(n * paraphrase_share)):
            origin = rng.choice(sent)
            others = [r for r in family.get(origin.family, ()) if r.text != origin.text]
            if others:
                batch.append(rng.choice(others))
    fresh = n - len(batch)
    batch += [records[(cursor + i) % len(records)] for i in range(fresh)]
    rng.shuffle(batch)
    return batch, fresh


def prompt_rounds(options: TrainOptions) -> Iterator[list[PromptRecord]]:
    """The rounds of prompts :func:`train` sends under ``options``, in order (endless): the suite's training
    prompts without risk topics, from a cursor fixed by the seed, mixed by :func:`round_prompts`."""
    records = [r for r in load_suite("train") if not r.risk]
    cursor = (options.seed * 997) % len(records)
    rng = random.Random(options.seed)
    sent: list[PromptRecord] = []
    while True:
        batch, fresh = round_prompts(records, cursor, options.prompts_per_round, sent, rng, options.repeat_share,
                                     options.paraphrase_share)
        cursor += fresh
        sent += batch
        yield batch


def request_done(events: list, n_samples: int) -> bool:
    """Whether a submitted request has all the rewards it will get.

    A skip has one reused final. Otherwise each Level-1 sample ends final or escalated, and an
    escalated request gets one Level-2 final; a request routed to Level-2 gets ``n_samples`` finals.
    """
    if any(e.scorer == common_pb2.SCORER_REUSED for e in events):
        return True
    level1 = [e for e in events if e.tier == common_pb2.TIER_LEVEL_1]
    level2_finals = [e for e in events if e.tier == common_pb2.TIER_LEVEL_2 and e.final]
    if len(level2_finals) >= n_samples:
        return True
    escalated = any(e.escalated for e in level1)
    return len(level1) >= n_samples and (not escalated or bool(level2_finals))


def _learner_status(stub: learner_pb2_grpc.LearnerStub) -> learner_pb2.LearnerStatus:
    return stub.Status(learner_pb2.LearnerStatusRequest(), timeout=10)


def evaluate(channels: dict[str, grpc.Channel], records: list[PromptRecord], version: int, seed: int = 0) -> Evaluation:
    """The current policy on held-out prompts: probe directions -> Level-1 generation -> light RM + oracle.

    Each prompt is sampled with its own fixed seed, the same before and after training (common random
    numbers), so that the difference of two evaluations measures the policy, not the sampling noise.
    """
    probe = probe_pb2_grpc.ProbeStub(channels["probe"])
    generator = generator_pb2_grpc.GeneratorStub(channels["generator"])
    reward = reward_pb2_grpc.RewardStub(channels["reward"])
    responses = []
    for i, record in enumerate(records):
        directions = probe.Directions(probe_pb2.DirectionsRequest(prompt=record.text), timeout=30).directions
        # Dropout off: this measures the policy as it would be served, not a rollout (R17).
        sampling = common_pb2.SamplingParams(seed=seed * 100_003 + i, rollout_dropout=0.0)
        reply = generator.Generate(generator_pb2.GenerateRequest(prompt=record.text, directions=directions,
                                                                 sampling=sampling), timeout=300)
        responses.append(reply.generations[0].response)
    scores = reward.Score(reward_pb2.ScoreRequest(items=[
        reward_pb2.ScoreItem(prompt=r.text, response=resp) for r, resp in zip(records, responses, strict=True)
    ]), timeout=300).scores
    rewards = [s.reward for s in scores]
    oracle = [oracle_score(r, resp) for r, resp in zip(records, responses, strict=True)]
    return Evaluation(version, statistics.fmean(rewards), statistics.fmean(oracle), rewards, oracle)


def train(settings: StrataSettings, options: TrainOptions, addresses: Addresses = Addresses(),
          progress: Callable[[RoundStats, int], None] | None = None) -> TrainSummary:
    channels = {name: rpc.channel(getattr(addresses, name)) for name in asdict(addresses)}
    store = ContentStore.from_url(settings.redis_address, settings.content_ttl_s, settings.content_max_bytes)
    scheduler = scheduler_pb2_grpc.SchedulerStub(channels["scheduler"])
    learner = learner_pb2_grpc.LearnerStub(channels["learner"])
    train_records = [r for r in load_suite("train") if not r.risk]
    eval_records = [r for r in load_suite("eval") if not r.risk][: options.eval_prompts]
    by_text = {r.text: r for r in train_records}
    try:
        start_version = _learner_status(learner).policy_version
        summary = TrainSummary(start_version, start_version)
        summary.before = evaluate(channels, eval_records, start_version, options.seed)
        tail = TailReader(settings, [topics.REWARDS_SCORED], client_id="strata-train")
        tail.seek_to_end()
        rounds = prompt_rounds(options)
        try:
            for round_index in range(options.max_rounds):
                if summary.end_version - start_version >= options.updates:
                    break
                started = time.monotonic()
                batch = next(rounds)
                reply = scheduler.SubmitBatch(scheduler_pb2.SubmitBatchRequest(requests=[
                    scheduler_pb2.SubmitRequest(prompt=r.text, n_samples=options.n_samples) for r in batch
                ]), timeout=120)
                decisions: dict[str, int] = {}
                expected: dict[str, int] = {}
                prompt_of: dict[str, str] = {}
                for result, record in zip(reply.results, batch, strict=True):
                    if result.WhichOneof("result") != "response":
                        log.warning("prompt refused by the scheduler: %s", result.error)
                        continue
                    response = result.response
                    name = common_pb2.Decision.Name(response.decision).removeprefix("DECISION_").lower()
                    decisions[name] = decisions.get(name, 0) + 1
                    expected[response.request_id] = 1 if response.decision == common_pb2.DECISION_SKIP \
                        else options.n_samples
                    prompt_of[response.prompt_hash] = record.text
                events_of: dict[str, list] = {rid: [] for rid in expected}
                deadline = time.monotonic() + options.round_timeout_s
                while time.monotonic() < deadline and not all(
                    request_done(events_of[r], n) for r, n in expected.items()
                ):
                    for _topic, event in tail.poll(0.5):
                        if event.request_id in events_of:
                            events_of[event.request_id].append(event)
                finals = {rid: [e for e in events if e.final] for rid, events in events_of.items()}
                # Every Level-1 sample, final or escalated: finals alone are cut at the escalation
                # threshold and would hide what the policy actually writes.
                level1 = [e for events in events_of.values() for e in events
                          if e.tier == common_pb2.TIER_LEVEL_1 and e.scorer != common_pb2.SCORER_REUSED]
                oracle = []
                for event in level1:
                    record = by_text.get(prompt_of.get(event.prompt_hash, ""))
                    if record is not None:
                        oracle.append(oracle_score(record, store.get_text(event.response_hash)))
                status = _learner_status(learner)
                summary.end_version = status.policy_version
                if "sync/seconds" in status.metrics:
                    summary.weight_sync_s = status.metrics["sync/seconds"]
                stats = RoundStats(
                    round_index, status.policy_version, len(batch), decisions,
                    sum(len(v) for v in finals.values()), len(level1),
                    statistics.fmean(e.reward for e in level1) if level1 else None,
                    statistics.fmean(oracle) if oracle else None, time.monotonic() - started,
                )
                summary.rounds.append(stats)
                if progress:
                    progress(stats, status.policy_version - start_version)
        finally:
            tail.close()
        summary.after = evaluate(channels, eval_records, summary.end_version, options.seed)
    finally:
        for channel in channels.values():
            channel.close()
    summary.png = str(write_report(summary, options.report_dir))
    return summary


def write_report(summary: TrainSummary, report_dir: Path) -> Path:
    """Reward and oracle curves (PNG) and the JSON summary, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    png = report_dir / f"train-{stamp}.png"
    rounds = [r for r in summary.rounds if r.mean_reward is not None]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([r.round for r in rounds], [r.mean_reward for r in rounds], marker="o", label="light RM reward (Level-1)")
    ax.plot([r.round for r in rounds], [r.mean_oracle for r in rounds], marker="s", label="oracle score")
    for r in summary.rounds[1:]:
        previous = summary.rounds[r.round - 1] if r.round else None
        if previous is not None and r.policy_version != previous.policy_version:
            ax.axvline(r.round, color="grey", alpha=0.2)
    ax.set_xlabel("round (grey lines: new policy version)")
    ax.set_ylabel("score (0-5)")
    ax.set_title(f"strata train: policy v{summary.start_version} -> v{summary.end_version}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    changes = {name: None if change is None else asdict(change)
               for name, change in (("reward_change", summary.reward_change), ("oracle_change", summary.oracle_change),
                                    ("hacking_gap", summary.hacking_gap))}
    oscillation = summary.reward_oscillation
    payload = {**asdict(summary), "reward_gain": summary.reward_gain, **changes,
               "reward_oscillation": None if oscillation is None else asdict(oscillation)}
    png.with_suffix(".json").write_text(json.dumps(payload, indent=2, default=str))
    return png
