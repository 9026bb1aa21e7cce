"""``strata train``: drive the whole loop on the zoo's task through the running services.

Each round submits a batch of training prompts to the scheduler (gRPC ``SubmitBatch``), follows the
rewards topic until their final rewards are in, and watches the learner's version advance (the
learner updates on its own when it has a batch, and generators pick up new weights between batches).
Before and after, and every ``eval_every`` updates between, the current policy answers held-out
prompts (probe directions + Level-1 generator) scored by the light RM and the oracle, beside what the
run's rollouts had booked in the cost ledger by then. Writes the held-out change against the booked
cost and the training rounds' curves (PNG) and a JSON summary; the summary keeps every request's
reward events, from which ``strata demo`` reads its headline against a baseline on the same prompts.

The prompts it sends and how many are ``strata_tools.train_stream``; the summary, the paired changes and
the report are ``strata_tools.train_summary``.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
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
from strata_tools.level1 import LivePrompting
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import PromptRecord, load_suite

# TrainOptions, TrainSummary, RoundStats and Request are the driver's API: import them from here.
from strata_tools.train_stream import TrainOptions, held_out_records, prompt_rounds, round_size, samples_to_send
from strata_tools.train_summary import Booked, Checkpoint, Evaluation, Request, RoundStats, TrainSummary, write_report

log = logging.getLogger(__name__)

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


def checkpoint_due(advanced: int, last: int, every: int, updates: int) -> bool:
    """Whether a held-out evaluation is due after a round: ``every`` updates past the ``last`` one, and
    not at or past the run's end (the final evaluation is the after-training one)."""
    return every > 0 and advanced < updates and advanced - last >= every


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
