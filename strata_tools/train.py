"""``strata train``: drive the whole loop on the zoo's task through the running services.

Each round submits a batch of training prompts to the scheduler (gRPC ``SubmitBatch``), follows the
rewards topic until their final rewards are in, and watches the learner's version advance (the
learner updates on its own when it has a batch, and generators pick up new weights between batches).
Before and after, and every ``eval_every`` updates between, the current policy answers held-out
prompts (probe directions + Level-1 generator) scored by the light RM and the oracle, beside what the
run's rollouts had booked in the cost ledger by then. Writes the held-out change against the booked
cost and the training rounds' curves (PNG) and a JSON summary; the summary keeps every request's
reward events, from which ``strata demo`` reads its headline against a baseline on the same prompts.
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
from typing import Any

import grpc

from strata import ledger, redis_client, rpc
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
from strata_tools.intervals import clustered_se
from strata_tools.level1 import LivePrompting
from strata_tools.rm.onpolicy import BAD_THRESHOLD
from strata_tools.zoo.oracle import oracle_score
from strata_tools.zoo.seal import check_sealed
from strata_tools.zoo.suite import SEALED_SPLIT, PromptRecord, load_suite, stratified_sample

log = logging.getLogger(__name__)

RM_COLOR, ORACLE_COLOR = "tab:blue", "tab:orange"  # the same in both panels of the picture

# The learner's flags for the zoo's tiny CPU models, which learn at rates real models would not survive
# (docs/learner.md): the KL penalty on from the first update (the default warm-up spans 100 updates) and
# a small step, so that the light RM is followed without being gamed (tests/stack/test_train.py).
CPU_LEARNER_BATCH = 32
CPU_LEARNER_ARGS = ("--learning-rate", "1e-4", "--batch-size", str(CPU_LEARNER_BATCH), "--minibatch-size", "8",
                    "--kl-coef", "0.2", "--kl-warmup-updates", "0")


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
    eval_every: int = 0              # held-out evaluations every this many updates between before and after (0: none)
    # The learner's batch (samples a policy update consumes). Set: a round sends no more prompts than it takes to
    # fill the batches still needed, counting the samples the learner holds (generated / used stays near 1); 0:
    # every round is full and rounds go on until the learner reaches its version.
    samples_per_update: int = 0
    # With a batch size set, the samples the learner holds plus those a round sends stay within this many of its
    # batches: more would wait past the learner's staleness bound (max_staleness, 2 by default) and be dropped.
    max_batches_ahead: int = 2


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
    families: list[str] = field(default_factory=list)  # each prompt's paraphrase family: the SE's clusters

    @property
    def bad_share(self) -> float:
        """Share of held-out answers the oracle scores under ``BAD_THRESHOLD``: the bad cases."""
        return sum(score < BAD_THRESHOLD for score in self.oracle_scores) / max(1, len(self.oracle_scores))


@dataclass(frozen=True)
class Booked:
    """What the run's rollouts booked in the cost ledger (every stage, human review apart)."""

    param_tokens: float = 0.0
    device_seconds: float = 0.0
    human_seconds: float = 0.0

    @classmethod
    def of(cls, stages: Sequence[ledger.StageCost]) -> Booked:
        return cls(sum(s.param_tokens for s in stages), sum(s.device_seconds for s in stages),
                   sum(s.human_seconds for s in stages))

    def __sub__(self, other: Booked) -> Booked:
        return Booked(self.param_tokens - other.param_tokens, self.device_seconds - other.device_seconds,
                      self.human_seconds - other.human_seconds)


@dataclass(frozen=True)
class Checkpoint:
    """A held-out evaluation during the run, and what the run's rollouts had booked by then."""

    updates: int                         # policy versions advanced since the start
    booked: Booked
    evaluation: Evaluation


def checkpoint_due(advanced: int, last: int, every: int, updates: int) -> bool:
    """Whether a held-out evaluation is due after a round: ``every`` updates past the ``last`` one, and
    not at or past the run's end (the final evaluation is the after-training one)."""
    return every > 0 and advanced < updates and advanced - last >= every


@dataclass(frozen=True)
class Change:
    """A paired before/after difference over the same held-out prompts (same sampling seeds)."""

    mean: float
    stderr: float  # standard error of the mean paired difference (clustered when clusters is set)
    n: int
    clusters: int | None = None  # paraphrase families the prompts came from; None: prompts independent

    def __str__(self) -> str:
        if self.clusters is None:
            return f"{self.mean:+.3f} ± {self.stderr:.3f} (paired SE, n={self.n})"
        return (f"{self.mean:+.3f} ± {self.stderr:.3f} (paired SE clustered by family: {self.n} prompts, "
                f"{self.clusters} families)")


def paired_change(before: Sequence[float], after: Sequence[float], clusters: Sequence[str] | None = None) -> Change:
    """After minus before per prompt; its SE clustered by ``clusters`` (each prompt's paraphrase family)
    when given, since paraphrases of one request are not independent evidence."""
    if len(before) != len(after) or len(before) < 2:
        raise ValueError("a paired change needs two equally long lists of at least 2 scores")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    if clusters:
        return Change(statistics.fmean(diffs), clustered_se(diffs, clusters), len(diffs), len(set(clusters)))
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
    checkpoints: list[Checkpoint] = field(default_factory=list)  # before, every eval_every updates, after
    # Every request the rounds submitted, with its reward events (hashes and rewards only; not in the JSON).
    requests: list[Request] = field(default_factory=list, repr=False)

    @property
    def reward_change(self) -> Change | None:
        """Held-out light-RM reward after minus before, per prompt."""
        if not self.before or not self.after:
            return None
        return paired_change(self.before.rewards, self.after.rewards, self.before.families)

    @property
    def oracle_change(self) -> Change | None:
        """Held-out oracle score after minus before, per prompt."""
        if not self.before or not self.after:
            return None
        return paired_change(self.before.oracle_scores, self.after.oracle_scores, self.before.families)

    @property
    def hacking_gap(self) -> Change | None:
        """Held-out light-RM reward change minus oracle change, per prompt: what the policy gained in
        the RM's eyes and not in the oracle's (reward hacking, issue 37; 0 when both move alike)."""
        if not self.before or not self.after:
            return None
        return paired_change([r - o for r, o in zip(self.before.rewards, self.before.oracle_scores, strict=True)],
                             [r - o for r, o in zip(self.after.rewards, self.after.oracle_scores, strict=True)],
                             self.before.families)

    @property
    def reward_oscillation(self) -> Oscillation | None:
        """The round-to-round swing of the rounds' mean light-RM reward (the curve the learner climbs)."""
        return reward_oscillation([r.mean_reward for r in self.rounds if r.mean_reward is not None])

    def changes_at(self, checkpoint: Checkpoint) -> tuple[Change, Change] | None:
        """The held-out light-RM reward and oracle changes from the start to ``checkpoint``, per prompt."""
        if not self.before:
            return None
        after = checkpoint.evaluation
        return (paired_change(self.before.rewards, after.rewards, self.before.families),
                paired_change(self.before.oracle_scores, after.oracle_scores, self.before.families))

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


def held_out_records(n: int, seed: int) -> list[PromptRecord]:
    """The held-out prompts a trained policy is judged on: ``n`` of the sealed test split's prompts without
    risk topics (live Level-1 answers those; the risk ones go to Level-2), spread across topics and
    paraphrase families, drawn by ``seed``."""
    return stratified_sample([r for r in load_suite(SEALED_SPLIT) if not r.risk], n, seed)


def prompt_rounds(options: TrainOptions) -> Iterator[list[PromptRecord]]:
    """The rounds of prompts :func:`train` sends under ``options``, in order (endless): the suite's training
    prompts without risk topics, from a cursor fixed by the seed, mixed by :func:`round_prompts`."""
    records = [r for r in load_suite("train") if not r.risk]
    check_sealed((r.text for r in records), "the PPO prompt stream")
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


def learner_holds(status: learner_pb2.LearnerStatus) -> int:
    """Samples the learner holds towards versions it has not reached: pending, and taken into an update (the
    running one included) that no version holds yet. Counting pending alone, the batch in training would
    look missing for the update's duration, and the driver would send a round too many."""
    return int(status.metrics.get("samples/pending", 0)) + int(status.metrics.get("samples/unversioned", 0))


def learner_seen(status: learner_pb2.LearnerStatus) -> int:
    """Reward events the learner has read, whatever it made of them (its samples/<outcome> counts; the states
    pending and unversioned and the last update's fractions are not events)."""
    return int(sum(v for k, v in status.metrics.items()
                   if k.startswith("samples/") and k not in ("samples/pending", "samples/unversioned")
                   and not k.endswith("_fraction")))


def _still_needed(stub: learner_pb2_grpc.LearnerStub, options: TrainOptions, start_version: int, seen_at_start: int,
                  driver_seen: int, poll_s: float = 0.2) -> int | None:
    """What the next round may send (:func:`samples_to_send`), once the learner has read the reward events the
    driver saw (it reads the same topic, a little behind): counted before, its pending samples would miss the
    last round's and the driver would send a round too many. Waits at most 30 s for it to catch up."""
    deadline = time.monotonic() + 30.0
    status = _learner_status(stub)
    while options.samples_per_update > 0 and learner_seen(status) - seen_at_start < driver_seen \
            and time.monotonic() < deadline:
        time.sleep(poll_s)  # polling a status the learner exposes: no event says "read up to here"
        status = _learner_status(stub)
    return samples_to_send(options, int(status.policy_version) - start_version, learner_holds(status))


def _wait_for_learner(stub: learner_pb2_grpc.LearnerStub, options: TrainOptions, start_version: int,
                      poll_s: float = 0.5) -> int:
    """Poll the learner until it reaches its last version, or there are samples to send (it holds too few to
    reach its version, and fewer than ``max_batches_ahead`` batches), or ``round_timeout_s`` passes; the version
    it reached."""
    deadline = time.monotonic() + options.round_timeout_s
    while True:
        status = _learner_status(stub)
        advanced = int(status.policy_version) - start_version
        if advanced >= options.updates or samples_to_send(options, advanced, learner_holds(status)) \
                or time.monotonic() >= deadline:
            return int(status.policy_version)
        time.sleep(poll_s)  # polling a status the learner exposes: no event says "updated" to this client


def evaluate(channels: dict[str, grpc.Channel], records: list[PromptRecord], version: int, seed: int = 0) -> Evaluation:
    """The current policy on held-out prompts, prompted as live Level-1 is: probe directions -> Level-1
    generation -> light RM + oracle.

    Each prompt is sampled with its own fixed seed, the same before and after training (common random
    numbers), so that the difference of two evaluations measures the policy, not the sampling noise.
    """
    probe = probe_pb2_grpc.ProbeStub(channels["probe"])
    generator = generator_pb2_grpc.GeneratorStub(channels["generator"])
    reward = reward_pb2_grpc.RewardStub(channels["reward"])
    forward_directions = LivePrompting.live(1).forward_directions
    responses = []
    for i, record in enumerate(records):
        ranked = probe.Directions(probe_pb2.DirectionsRequest(prompt=record.text), timeout=30).directions
        # As a rollout is prompted live (strata_tools.level1): the directions the probe forwards, and every
        # sampling field but the seed left to the generator's defaults, rollout dropout included.
        sampling = common_pb2.SamplingParams(seed=seed * 100_003 + i)
        reply = generator.Generate(generator_pb2.GenerateRequest(
            prompt=record.text, directions=ranked[:forward_directions], sampling=sampling), timeout=300)
        responses.append(reply.generations[0].response)
    scores = reward.Score(reward_pb2.ScoreRequest(items=[
        reward_pb2.ScoreItem(prompt=r.text, response=resp) for r, resp in zip(records, responses, strict=True)
    ]), timeout=300).scores
    rewards = [s.reward for s in scores]
    oracle = [oracle_score(r, resp) for r, resp in zip(records, responses, strict=True)]
    return Evaluation(version, statistics.fmean(rewards), statistics.fmean(oracle), rewards, oracle,
                      [r.family for r in records])


@dataclass
class Request:
    """One prompt's request, and the reward events it got."""

    record: Any                       # strata_tools.zoo.suite.PromptRecord
    request_id: str
    prompt_hash: str = ""
    decision: str = ""                # the scheduler's decision (its enum name), or "refused"
    events: list = field(default_factory=list)
    reason: str = ""                  # the scheduler's reason for it (or the refusal's message)


@dataclass
class _Run:
    """What :func:`train` holds while it runs: the channels, the stores, the prompt stream and the summary."""

    options: TrainOptions
    channels: dict[str, grpc.Channel]
    store: ContentStore
    ledger_client: Any
    tail: TailReader
    rounds: Iterator[list[PromptRecord]]
    eval_records: list[PromptRecord]
    summary: TrainSummary
    booked_at_start: Booked

    def booked(self) -> Booked:
        return Booked.of(ledger.read_stages(self.ledger_client)) - self.booked_at_start

    def checkpoint(self, version: int) -> Evaluation:
        """Evaluate the policy on the held-out prompts and record it with what was booked by now (read
        first: rollouts still in flight book while the evaluation runs)."""
        booked = self.booked()
        evaluation = evaluate(self.channels, self.eval_records, version, self.options.seed)
        self.summary.checkpoints.append(Checkpoint(version - self.summary.start_version, booked, evaluation))
        return evaluation


def samples_still_needed(options: TrainOptions, advanced: int, pending: int) -> int | None:
    """Samples the learner still needs to reach ``options.updates`` once it has made ``advanced`` of them: the
    batches left, less the ``pending`` samples it holds and has not trained on yet. None when the options set
    no batch size (no bound)."""
    if options.samples_per_update <= 0:
        return None
    return max(0, (options.updates - advanced) * options.samples_per_update - pending)


def samples_to_send(options: TrainOptions, advanced: int, held: int) -> int | None:
    """What the next round may send: what the learner still needs (:func:`samples_still_needed`), within
    ``max_batches_ahead`` batches of what it holds, so that no sample waits past the learner's staleness bound
    and is dropped unused. None when the options set no batch size (no bound)."""
    needed = samples_still_needed(options, advanced, held)
    if needed is None:
        return None
    return max(0, min(needed, options.max_batches_ahead * options.samples_per_update - held))


def round_size(options: TrainOptions, needed: int | None) -> int:
    """Prompts the next round sends: a full round, or when the learner's need is known, just enough prompts
    for it if every one were answered by Level-1 (``n_samples`` each), so generated / used stays near 1."""
    if needed is None:
        return options.prompts_per_round
    return min(options.prompts_per_round, math.ceil(needed / max(1, options.n_samples)))


def _run_round(run: _Run, round_index: int, by_text: dict[str, PromptRecord], size: int) -> RoundStats:
    """Submit one round's prompts (the first ``size`` of the stream's next round), follow their rewards until
    every request is done (or the round's timeout), and return the round's figures; each request joins the
    summary with its events."""
    options, store = run.options, run.store
    started = time.monotonic()
    batch = next(run.rounds)[:size]
    reply = scheduler_pb2_grpc.SchedulerStub(run.channels["scheduler"]).SubmitBatch(
        scheduler_pb2.SubmitBatchRequest(requests=[
            scheduler_pb2.SubmitRequest(prompt=r.text, n_samples=options.n_samples) for r in batch]), timeout=120)
    decisions: dict[str, int] = {}
    expected: dict[str, int] = {}
    prompt_of: dict[str, str] = {}
    for result, record in zip(reply.results, batch, strict=True):
        if result.WhichOneof("result") != "response":
            log.warning("prompt refused by the scheduler: %s", result.error)
            run.summary.requests.append(Request(record, "", decision="refused"))
            continue
        response = result.response
        name = common_pb2.Decision.Name(response.decision).removeprefix("DECISION_").lower()
        decisions[name] = decisions.get(name, 0) + 1
        expected[response.request_id] = 1 if response.decision == common_pb2.DECISION_SKIP else options.n_samples
        prompt_of[response.prompt_hash] = record.text
        run.summary.requests.append(Request(record, response.request_id, response.prompt_hash,
                                            common_pb2.Decision.Name(response.decision)))
    events_of: dict[str, list] = {rid: [] for rid in expected}
    for request in run.summary.requests[-len(batch):]:
        if request.request_id in events_of:
            request.events = events_of[request.request_id]
    deadline = time.monotonic() + options.round_timeout_s
    while time.monotonic() < deadline and not all(request_done(events_of[r], n) for r, n in expected.items()):
        for _topic, event in run.tail.poll(0.5):
            if event.request_id in events_of:
                events_of[event.request_id].append(event)
    finals = {rid: [e for e in events if e.final] for rid, events in events_of.items()}
    # Every Level-1 sample, final or escalated: finals alone are cut at the escalation
    # threshold and would hide what the policy actually writes.
    level1 = [e for events in events_of.values() for e in events
              if e.tier == common_pb2.TIER_LEVEL_1 and e.scorer != common_pb2.SCORER_REUSED]
    oracle = []
    for event in level1:
        origin = by_text.get(prompt_of.get(event.prompt_hash, ""))
        if origin is not None:
            oracle.append(oracle_score(origin, store.get_text(event.response_hash)))
    status = _learner_status(learner_pb2_grpc.LearnerStub(run.channels["learner"]))
    run.summary.end_version = status.policy_version
    if "sync/seconds" in status.metrics:
        run.summary.weight_sync_s = status.metrics["sync/seconds"]
    return RoundStats(
        round_index, status.policy_version, len(batch), decisions,
        sum(len(v) for v in finals.values()), len(level1),
        statistics.fmean(e.reward for e in level1) if level1 else None,
        statistics.fmean(oracle) if oracle else None, time.monotonic() - started,
    )


def train(settings: StrataSettings, options: TrainOptions, addresses: Addresses = Addresses(),
          progress: Callable[[RoundStats, int], None] | None = None) -> TrainSummary:
    if options.eval_every < 0:
        raise ValueError("eval_every must be >= 0")
    channels = {name: rpc.channel(getattr(addresses, name)) for name in asdict(addresses)}
    store = ContentStore.from_url(settings.redis_address, settings.content_ttl_s, settings.content_max_bytes)
    ledger_client = redis_client.connect(settings.redis_address, socket_timeout=30)
    learner = learner_pb2_grpc.LearnerStub(channels["learner"])
    train_records = [r for r in load_suite("train") if not r.risk]
    eval_records = held_out_records(options.eval_prompts, options.seed)
    by_text = {r.text: r for r in train_records}
    try:
        start_version = _learner_status(learner).policy_version
        summary = TrainSummary(start_version, start_version)
        tail = TailReader(settings, [topics.REWARDS_SCORED], client_id="strata-train")
        tail.seek_to_end()
        run = _Run(options, channels, store, ledger_client, tail, prompt_rounds(options), eval_records, summary,
                   Booked.of(ledger.read_stages(ledger_client)))
        try:
            summary.before = run.checkpoint(start_version)
            last_checkpoint = 0
            seen_at_start = learner_seen(_learner_status(learner))
            for round_index in range(options.max_rounds):
                if summary.end_version - start_version >= options.updates:
                    break
                needed = _still_needed(learner, options, start_version, seen_at_start,
                                       sum(len(r.events) for r in summary.requests))
                if needed == 0:
                    # The learner holds every sample it needs, or as many as it can take before they go stale: a
                    # round that sends nothing and waits for its updates (its seconds are the updates' own).
                    waited = time.monotonic()
                    summary.end_version = _wait_for_learner(learner, options, start_version)
                    stats = RoundStats(round_index, summary.end_version, 0, {}, 0, 0, None, None,
                                       time.monotonic() - waited)
                else:
                    stats = _run_round(run, round_index, by_text, round_size(options, needed))
                summary.rounds.append(stats)
                advanced = stats.policy_version - start_version
                if progress:
                    progress(stats, advanced)
                if checkpoint_due(advanced, last_checkpoint, options.eval_every, options.updates):
                    run.checkpoint(stats.policy_version)
                    last_checkpoint = advanced
                if needed == 0 and advanced < options.updates and stats.seconds >= options.round_timeout_s:
                    log.warning("the learner holds the samples of %d updates but reached %d in %.0f s; stopping",
                                options.updates, advanced, options.round_timeout_s)
                    break
        finally:
            tail.close()
        last = summary.checkpoints[-1]
        # The loop may end (max_rounds) right after a checkpoint of the same version: that is the after.
        same = len(summary.checkpoints) > 1 and last.updates == summary.end_version - start_version
        summary.after = last.evaluation if same else run.checkpoint(summary.end_version)
    finally:
        for channel in channels.values():
            channel.close()
        ledger_client.close()
    summary.png = str(write_report(summary, options.report_dir))
    return summary


def checkpoint_lines(summary: TrainSummary) -> list[str]:
    """The held-out checkpoints as a table: updates, what the rollouts had booked, the paired changes."""
    n = len(summary.before.rewards) if summary.before else 0
    lines = [f"held-out checkpoints ({n} prompts; changes since the start, ±1 paired SE):",
             f"  {'updates':>7} {'params x tokens':>15} {'device-s':>9} {'light-RM change':>18} {'oracle change':>18}"]
    for checkpoint in summary.checkpoints:
        at = summary.changes_at(checkpoint)
        reward, oracle = ("-", "-") if at is None else (f"{at[0].mean:+.3f} ± {at[0].stderr:.3f}",
                                                        f"{at[1].mean:+.3f} ± {at[1].stderr:.3f}")
        lines.append(f"  {checkpoint.updates:>7} {checkpoint.booked.param_tokens:>15.3g} "
                     f"{checkpoint.booked.device_seconds:>9.1f} {reward:>18} {oracle:>18}")
    return lines


def write_report(summary: TrainSummary, report_dir: Path) -> Path:
    """The held-out change against the booked cost, the training rounds' curves (PNG), and the JSON summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    png = report_dir / f"train-{stamp}.png"
    fig, (held_out, rounds_ax) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    _plot_held_out(held_out, summary)
    _plot_rounds(rounds_ax, summary)
    fig.suptitle(f"strata train: policy v{summary.start_version} -> v{summary.end_version}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    png.with_suffix(".json").write_text(json.dumps(report_payload(summary), indent=2, default=str))
    return png


def report_payload(summary: TrainSummary) -> dict[str, Any]:
    """The JSON summary: everything but the requests, the paired changes, and each checkpoint's changes."""
    changes = {name: None if change is None else asdict(change)
               for name, change in (("reward_change", summary.reward_change), ("oracle_change", summary.oracle_change),
                                    ("hacking_gap", summary.hacking_gap))}
    checkpoints = []
    for checkpoint in summary.checkpoints:
        at = summary.changes_at(checkpoint)
        checkpoints.append({"updates": checkpoint.updates, "policy_version": checkpoint.evaluation.policy_version,
                            "booked": asdict(checkpoint.booked),
                            "mean_reward": checkpoint.evaluation.mean_reward,
                            "mean_oracle": checkpoint.evaluation.mean_oracle,
                            "reward_change": None if at is None else asdict(at[0]),
                            "oracle_change": None if at is None else asdict(at[1])})
    oscillation = summary.reward_oscillation
    fields = {f: getattr(summary, f) for f in ("start_version", "end_version", "weight_sync_s", "png")}
    return {**fields, "rounds": [asdict(r) for r in summary.rounds],
            "before": None if summary.before is None else asdict(summary.before),
            "after": None if summary.after is None else asdict(summary.after),
            "checkpoints": checkpoints, "reward_gain": summary.reward_gain, **changes,
            "reward_oscillation": None if oscillation is None else asdict(oscillation)}


def _plot_held_out(ax: Any, summary: TrainSummary) -> None:
    """Held-out light-RM and oracle changes since the start (paired, +-1 SE) against the booked params x tokens."""
    points = [(c.booked.param_tokens, at) for c in summary.checkpoints if (at := summary.changes_at(c)) is not None]
    if points:
        cost = [p[0] for p in points]
        for index, label, marker, color in ((0, "light-RM reward (what PPO climbs)", "o", RM_COLOR),
                                            (1, "oracle (the judge)", "s", ORACLE_COLOR)):
            ax.errorbar(cost, [p[1][index].mean for p in points], yerr=[p[1][index].stderr for p in points],
                        marker=marker, capsize=3, label=label, color=color)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    n = len(summary.before.rewards) if summary.before else 0
    ax.set_xlabel("params x tokens booked by the run's rollouts (every stage)")
    ax.set_ylabel(f"held-out change since the start ({n} prompts, ±1 paired SE)")
    ax.set_title("held-out prompts as training goes")
    ax.legend()


def _plot_rounds(ax: Any, summary: TrainSummary) -> None:
    """The training rounds' Level-1 samples: light-RM reward and oracle score per round (not held out)."""
    rounds = [r for r in summary.rounds if r.mean_reward is not None]
    ax.plot([r.round for r in rounds], [r.mean_reward for r in rounds], marker="o", label="light RM reward",
            color=RM_COLOR)
    ax.plot([r.round for r in rounds], [r.mean_oracle for r in rounds], marker="s", label="oracle score",
            color=ORACLE_COLOR)
    for r in summary.rounds[1:]:
        previous = summary.rounds[r.round - 1] if r.round else None
        if previous is not None and r.policy_version != previous.policy_version:
            ax.axvline(r.round, color="grey", alpha=0.2)
    ax.set_xlabel("round (grey lines: new policy version)")
    ax.set_ylabel("score (0-5)")
    ax.set_title("training rounds' Level-1 samples (not held out)")
    ax.legend()
