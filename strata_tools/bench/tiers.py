"""``strata bench tiers``: the article's headline, measured: cost, quality and bad cases caught, arm by arm.

What runs. Kafka and Redis are the bench's own (free ports, a throw-away state dir, purged at the
end) unless external ones are configured; the probe, both generators, the reward service (light and
strong RM) and the scheduler are the real services with the zoo's models, each in its own process
as deployed (no learner: the policy stays fixed, so every arm meets the same models). On a CPU the
services share the cores, so device-seconds are each process's CPU seconds (``strata.devicetime``).
The same held-out prompts (the suite's sealed test split, R27) go through each live arm in turn. Their mix is a
stated parameter: ``--risk-share`` of them are medical or legal (R3 sends those to Level-2 whatever
the router does). The default, 6 %, follows what is known of real assistant traffic: over 5 % of
ChatGPT messages are about health (OpenAI, "AI as a Healthcare Ally", January 2026) and 1.2 % of
LMSYS-Chat-1M dialogues (Jeong et al. 2026, table 9); no public figure for legal was found. A
second, *stress* mix at ``--stress-risk-share`` (25 %, the suite's own share) shares the safe and
risk prompts of the first, so both mixes are read off one live run (the union of their prompts):

1. **all-Level-2**: every prompt published to ``strata.prompts.level2``: Level-2 generation, scored
   by the strong RM (what one-model RLHF stacks do; the article's baseline);
2. **tiered**: every prompt published to ``strata.prompts.level0``: probe -> Level-1 + light RM ->
   escalation under ``escalation_threshold`` (cautious prompts straight to Level-2);
3. **tiered + skip**: ``--history`` train-split prompts are submitted through the scheduler first
   (that history's cost is not the arm's), then the test prompts through ``SubmitBatch``: the
   scheduler may skip a prompt and reuse a known reward (R10-R12);
4. **the epoch stream**: the test prompts again through the scheduler, ``--epochs`` passes in all (the
   third arm is the first), reshuffled each time, as PPO revisits its prompt set: what skipping adds
   to the saving once the prompts have a history of their own, and the skip audit's reuse error.

Before the arms, ``WARM_UP_PROMPTS`` train prompts go through each route unmeasured (a cold service's
first batches are no arm's cost), and the first two arms run in halves, A B B A (all-Level-2,
tiered, tiered, all-Level-2), so a drift of the machine over the run weighs on both alike; the skip
arm runs last, after its history, on warm services.

Each arm's cost is what every stage booked in the cost ledger (``strata.ledger``) between its
start and end, per prompt from the ledger's (prompt, request) records: encoder, probe, generation
per tier, each RM call, human review (seconds per annotation, apart from device time). Quality is
the oracle judge's mean score of each prompt's final answer. A *bad case* is a Level-1 answer the
oracle scores under ``--bad-threshold``; the catch rate is the share of them escalated.

Replayed arms (as RouteLLM's evaluation replays cached answers): each prompt's Level-1 answer from
the tiered arm and its Level-2 answer from the all-Level-2 arm, with their measured costs and RM
scores: the *random router* at the tiered arm's Level-2 share (mean of 200 draws), the *oracle
router* (escalate exactly the bad cases), *keep the better* of both answers by RM score. Cautious
prompts stay at Level-2 under every router, so the comparison isolates the escalation rule.

The router's figures are read off *expected* Level-2 scores: ``--expected-samples`` (4) Level-2 answers
per prompt, sampled as the live tier is (``strata_tools.level1``) apart from the live arms, each
prompt's Level-2 oracle score their mean (the router escalates before it sees Level-2's answer, so
that answer's luck is no router's doing, and one lucky sample would rank the ceiling); each Level-1
answer stays the one served, which the router judged. Cautious prompts get as many Level-1 answers,
for the measurement only. On them: the threshold sweep; RouteLLM's APGR, CPT(50%) and CPT(80%) of the
whole router over its 0-100 % axis of Level-2 calls (cautious prompts first, then the light-RM
threshold), with a bootstrap interval over paraphrase families; the *ceiling*, escalating the prompts
of largest gain per unit of Level-2 cost first, whose line between points no router's set of prompts
passes at the same cost; and the router's share of the ceiling's saving at its operating point, the
threshold served (calibrated on the validation split), not the best threshold of the sweep picked
after the fact.

The services run with one intra-op thread each (``OMP_NUM_THREADS=1``): a second OpenMP thread
spins while it waits, and on a shared CPU its spinning would be booked as the service's CPU seconds.

Cost is compared in params x tokens first (stable across runs and machines; device-seconds of
overhead-bound tiny models on a shared CPU move by +-10 points), device-seconds beside it. The router
is also judged against the ceiling: its params-x-tokens saving at its operating point (0 when its
quality is under 0.95) as a share of the most any router saves at quality >= 0.95 (read off the
ceiling's line).

Writes ``tiers.json`` (every figure, the stress mix under ``"stress"``) and ``tiers.png`` (the curve)
under ``--out``. Last line, for the default mix's *tiered + skip* arm: ``tiers saving=<PxT fraction>
device_saving=<fraction> quality_ratio=<x> bad_case_catch=<fraction> level2_share=<fraction> apgr=<x>
ceiling_share_of_saving=<fraction>`` (the router's figures read as the paragraphs above say).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata import ledger, redis_client, rpc
from strata_tools.bench import tier_eval
from strata_tools.bench.tier_eval import Answer, ArmFigures, PromptOutcome
from strata_tools.intervals import Interval, cluster_bootstrap, cluster_bootstraps
from strata_tools.pricing import PriceAs, parse_price_as, reprice
from strata_tools.rm.escalation import ServedThreshold, add_threshold_arguments, resolve_threshold
from strata_tools.train import Request
from strata_tools.zoo.suite import stratified_sample

log = logging.getLogger(__name__)

# The article's figures for its tiered rollout against everything on the large model (docs/tiers.md).
ARTICLE = {"saving": 0.64, "quality_ratio": 1.053, "bad_case_catch": 0.92, "level2_share": 0.07}
# Issue 18's acceptance: the quality ratio and Level-2 share the tiered rollout must reach.
TARGET_QUALITY_RATIO = 0.95
TARGET_LEVEL2_SHARE = 0.25
HEADLINE_ARM = "tiered + skip"
THRESHOLD_GRID = (1.0, 2.0, 2.2, 2.4, 2.6, 2.8, 3.0, 3.2, 3.4)
# Medical and legal prompts in the default mix: health is a little over 5 % of ChatGPT messages (OpenAI,
# January 2026) and 1.2 % of LMSYS-Chat-1M dialogues; legal has no public figure (docs/tiers.md).
DEFAULT_RISK_SHARE = 0.06
STRESS_RISK_SHARE = 0.25  # the suite's own share, kept as a stress row
# Train prompts through each route before the measured arms: a cold service's first batches are no arm's cost.
WARM_UP_PROMPTS = 4
# Answers per prompt and tier behind an expected score: one sample's luck would rank the ceiling (R27).
EXPECTED_SAMPLES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=96, help="test-split prompts per arm (risk ones included)")
    parser.add_argument("--risk-share", type=float, default=DEFAULT_RISK_SHARE,
                        help="share of medical and legal prompts in the mix (real traffic: ~6 %%, docs/tiers.md)")
    parser.add_argument("--stress-risk-share", type=float, default=STRESS_RISK_SHARE,
                        help="risk share of a second, stress mix read off the same run (0: none)")
    parser.add_argument("--history", type=int, default=96,
                        help="train-split prompts submitted through the scheduler before the skip arm")
    parser.add_argument("--epochs", type=int, default=5,
                        help="passes of the test prompts through the scheduler, as PPO revisits its prompt set; the "
                             "first is the tiered + skip arm (1: that arm alone)")
    parser.add_argument("--bad-threshold", type=float, default=1.5,
                        help="oracle score under which a Level-1 answer is a bad case")
    add_threshold_arguments(parser)
    parser.add_argument("--review-seconds", type=float, default=60.0, help="human seconds per annotation")
    parser.add_argument("--expected-samples", type=int, default=EXPECTED_SAMPLES,
                        help="answers per prompt and tier behind the router's expected-quality figures (sweep, "
                             "ceiling, APGR); sampled as live, apart from the live arms")
    parser.add_argument("--seed", type=int, default=0, help="prompt sample and sampling seeds")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds an arm may take")
    parser.add_argument("--price-as", default=None, metavar="SIZES",
                        help="also print the arms' params x tokens at these model sizes, a labelled projection of "
                             "the same measured work: a preset (article, deployment) or role=params pairs "
                             "(strata report --help)")
    parser.add_argument("--out", type=Path, default=None, help="directory for tiers.json and tiers.png "
                        "(default: <state dir>/reports)")


# -- the live run -------------------------------------------------------------------------------------


@dataclass
class ArmRun:
    name: str
    requests: list[Request]
    stages: list[ledger.StageCost]    # what the arm booked, from the aggregates
    wall_s: float


def risk_count(n: int, share: float, available: int) -> int:
    """Risk prompts in a mix of ``n`` at ``share``: at least one when the share is above 0 and any exist."""
    return min(available, max(1 if share > 0 and available else 0, round(n * share)))


def pick_prompts(records: Sequence[Any], n: int, seed: int) -> list[Any]:
    """``n`` records, risk ones at their share of ``records`` (at least one if any exist)."""
    rng = random.Random(seed)
    risky = [r for r in records if r.risk]
    safe = [r for r in records if not r.risk]
    n = min(n, len(records))
    n_risky = risk_count(n, len(risky) / len(records), len(risky))
    chosen = rng.sample(risky, n_risky) + rng.sample(safe, min(len(safe), n - n_risky))
    rng.shuffle(chosen)
    return chosen


@dataclass(frozen=True)
class PromptMixes:
    """The default mix, the stress mix (empty when not asked for) and their union, which the live arms run."""

    default: list[Any]
    stress: list[Any]
    union: list[Any]


def prompt_mixes(records: Sequence[Any], n: int, seed: int, risk_share: float, stress_share: float) -> PromptMixes:
    """Two mixes of ``n`` records each at the given risk shares (at least one risk prompt when the share is
    above 0 and any exist), nested so that one live run serves both: the mix with fewer risk prompts takes
    a prefix of the other's risk prompts and a superset of its safe ones, from one seeded order."""
    if not (0 <= risk_share <= 1 and 0 <= stress_share <= 1):
        raise ValueError("risk shares must be in [0, 1]")
    # Each kind in a seeded order spread across topics and paraphrase families, so a prefix is too.
    risky = stratified_sample([r for r in records if r.risk], len(records), seed)
    safe = stratified_sample([r for r in records if not r.risk], len(records), seed + 2)
    n = min(n, len(records))

    def mix(share: float) -> list[Any]:
        n_risky = risk_count(n, share, len(risky))
        n_safe = min(len(safe), n - n_risky)
        return risky[:n_risky] + safe[:n_safe]

    default = mix(risk_share)
    stress = mix(stress_share) if stress_share > 0 else []
    chosen = {id(r) for r in default + stress}
    union = [r for r in risky + safe if id(r) in chosen]
    random.Random(seed + 1).shuffle(union)
    order = {id(r): i for i, r in enumerate(union)}
    return PromptMixes(sorted(default, key=lambda r: order[id(r)]), sorted(stress, key=lambda r: order[id(r)]),
                       union)


# A service's module (``python -m``), its arguments and the environment of its own.
_ServiceSpec = tuple[str, list[str], dict[str, str]]


class ArmRunner:
    """Pushes one arm's prompts through a running stack and waits for every final reward: by Kafka straight
    to a tier (``level2``: Level-2 generation and the strong RM; ``level0``: probe, Level-1, light RM and
    escalation) or through the scheduler's ``SubmitBatch`` (``scheduler``: skipping included). Each
    request's cost is what the stack booked for it in the ledger."""

    def __init__(self, settings: Any, run_id: str, seed: int, scheduler_address: str = "") -> None:
        self.settings, self.run_id, self.seed = settings, run_id, seed
        self.scheduler_address = scheduler_address

    def run_arm(self, name: str, records: Sequence[Any], route: str, timeout_s: float,
                progress: Callable[[str], None], n_samples: int = 1, tag: str = "", first_index: int = 0) -> ArmRun:
        """Send ``records`` through one arm (route: level2 | level0 | scheduler) and wait for every final;
        ``n_samples`` rollouts per prompt. Prompt ``i`` is sampled with the seed of position ``first_index + i``,
        so an arm run in parts samples as it would whole, paired with the other arms prompt by prompt."""

        from strata.bus import topics
        from strata.bus.tail import TailReader
        from strata.content_store import ContentStore

        s = self.settings
        client = redis_client.connect(s.redis_address, socket_timeout=30)
        store = ContentStore(client, s.content_ttl_s, s.content_max_bytes)
        tail = TailReader(s, [topics.REWARDS_SCORED], client_id=f"bench-tiers-{self.run_id}")
        tail.seek_to_end()
        tag = tag or f"{self.run_id}-{name.replace(' ', '').replace('+', '-')}"
        requests = [Request(r, f"{tag}-{i}") for i, r in enumerate(records)]
        n = n_samples
        before = ledger.read_stages(client)
        started = time.monotonic()
        try:
            if route == "scheduler":
                self._submit(requests, n, first_index)
            else:
                self._publish(requests, route, store, n, first_index)
            refused = [r for r in requests if r.decision == "refused"]
            if refused:
                raise RuntimeError(f"{name}: the scheduler refused {len(refused)} prompts (see the log)")
            by_id = {r.request_id: r for r in requests}
            self._wait(tail, by_id, started + timeout_s, name, progress, n)
        finally:
            tail.close()
        wall = time.monotonic() - started
        # The aggregates move when a batch's transaction commits, which is after its events are acked.
        stages = self._settled_stages(client, before, requests)
        client.close()
        return ArmRun(name, requests, stages, wall)

    def _settled_stages(self, client: Any, before: list[ledger.StageCost], requests: Sequence[Request]
                        ) -> list[ledger.StageCost]:
        """The arm's stages once every scored sample's RM cost is booked (the reward worker books a
        batch in the transaction that marks it done, just after its events are acknowledged)."""
        from strata.v1 import common_pb2

        # One RM score per answer: an answer awaiting the desk gets a provisional event and a final one.
        rm_scorers = (common_pb2.SCORER_LIGHT, common_pb2.SCORER_STRONG)
        scored = len({(r.request_id, e.tier, e.sample_index) for r in requests for e in r.events
                      if e.scorer in rm_scorers})
        deadline = time.monotonic() + 60
        while True:
            booked = sum(s.items for r in requests
                         for s in ledger.read_request(client, r.prompt_hash, r.request_id)
                         if s.stage in ("rm_light", "rm_strong"))
            if booked >= scored:
                return ledger.subtract(ledger.read_stages(client), before)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{booked} of {scored} scored samples booked in the ledger after 60 s")
            time.sleep(0.2)

    def _publish(self, requests: Sequence[Request], route: str, store: Any, n_samples: int = 1,
                 first_index: int = 0) -> None:
        from strata.bus import Publisher, topics
        from strata.v1 import common_pb2, events_pb2

        level2 = route == "level2"
        publisher = Publisher(self.settings, client_id=f"bench-tiers-{self.run_id}")
        try:
            futures = []
            for i, request in enumerate(requests):
                request.prompt_hash = store.put(request.record.text)
                routed = events_pb2.PromptRouted(
                    prompt_hash=request.prompt_hash, n_samples=n_samples, request_id=request.request_id,
                    tier=common_pb2.TIER_LEVEL_2 if level2 else common_pb2.TIER_LEVEL_0,
                    decision=common_pb2.DECISION_LEVEL_2 if level2 else common_pb2.DECISION_LEVEL_1,
                    reason="bench tiers: all-Level-2 arm" if level2 else "bench tiers: tiered arm",
                    sampling=common_pb2.SamplingParams(seed=self.seed * 100_003 + first_index + i),
                )
                routed.submitted_at.GetCurrentTime()
                routed.routed_at.GetCurrentTime()
                topic = topics.PROMPTS_LEVEL2 if level2 else topics.PROMPTS_LEVEL0
                futures.append(publisher.publish(topic, routed))
            publisher.wait(futures)
        finally:
            publisher.close()

    def _submit(self, requests: Sequence[Request], n_samples: int = 1, first_index: int = 0) -> None:

        from strata.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

        batch_size = 32  # under the scheduler's max_batch_size (64)
        with rpc.channel(self.scheduler_address) as channel:
            stub = scheduler_pb2_grpc.SchedulerStub(channel)
            for start in range(0, len(requests), batch_size):
                chunk = requests[start:start + batch_size]
                reply = stub.SubmitBatch(scheduler_pb2.SubmitBatchRequest(requests=[
                    scheduler_pb2.SubmitRequest(
                        prompt=r.record.text, n_samples=n_samples, request_id=r.request_id,
                        sampling=common_pb2.SamplingParams(seed=self.seed * 100_003 + first_index + start + j))
                    for j, r in enumerate(chunk)
                ]), timeout=300)
                for request, result in zip(chunk, reply.results, strict=True):
                    if result.WhichOneof("result") != "response":
                        request.decision, request.reason = "refused", result.error
                        log.warning("prompt refused by the scheduler: %s", result.error)
                        continue
                    request.prompt_hash = result.response.prompt_hash
                    request.decision = common_pb2.Decision.Name(result.response.decision)
                    request.reason = result.response.reason

    @staticmethod
    def _wait(tail: Any, by_id: dict[str, Request], deadline: float, name: str,
              progress: Callable[[str], None], n_samples: int = 1) -> None:
        from strata_tools.train import request_done

        last = 0.0
        while True:
            pending = [r for r in by_id.values() if not request_done(r.events, n_samples)]
            if not pending:
                return
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"{name}: {len(pending)} of {len(by_id)} prompts have no final reward "
                                   f"after the arm's timeout (first: request {pending[0].request_id})")
            if now - last > 15:
                progress(f"      {name}: {len(by_id) - len(pending)}/{len(by_id)} prompts final")
                last = now
            for _topic, event in tail.poll(0.5):
                request = by_id.get(event.request_id)
                if request is not None:
                    request.events.append(event)


class LiveTiers(ArmRunner):
    """The services, each in its own process, and the means to push an arm through them."""

    def __init__(self, settings: Any, zoo: Any, run_id: str, review_seconds: float, seed: int,
                 scheduler_env: dict[str, str] | None = None, learner_args: Sequence[str] | None = None,
                 reward_env: dict[str, str] | None = None) -> None:
        """``learner_args``: also run the learner (those svc_learner flags), training the zoo's policy on the
        rewards and publishing each version to the Level-1 generator: a moving policy. None: a fixed one.
        ``scheduler_env``, ``reward_env``: settings of those services (``STRATA_*``) over the bench's own."""
        super().__init__(settings, run_id, seed)
        self.zoo = zoo
        self.review_seconds = review_seconds
        self.scheduler_env = scheduler_env or {}
        self.reward_env = reward_env or {}
        self.learner_args = None if learner_args is None else list(learner_args)
        self.checkpoint_dir = Path(settings.state_dir) / "bench" / run_id / "checkpoints"
        self.ports: dict[str, int] = {}

    @contextmanager
    def started(self) -> Iterator[LiveTiers]:
        """Each service in its own process, as deployed: on a shared CPU, device-seconds are each
        process's CPU seconds (``strata.devicetime``), which one process per service keeps apart."""
        specs = self._service_specs(self._consumer_groups())
        logs = self.settings.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.ports = {}
        processes: dict[str, subprocess.Popen] = {}
        try:
            self._spawn(specs, logs, processes)
            self._await_healthy(processes, self.ports, logs)
            self.scheduler_address = f"127.0.0.1:{self.ports['scheduler']}"
            yield self
        finally:
            self._stop_processes(processes)

    def _common_env(self) -> dict[str, str]:
        """The environment every service gets: this run's Kafka, Redis and state dir, on the CPU."""
        s = self.settings
        # One intra-op thread per service: an idle OpenMP thread spins on a shared CPU, and its spinning
        # would count as the service's CPU seconds (measured: Level-1 at 24.7 ms/token with 2 threads).
        return {"STRATA_KAFKA_BOOTSTRAP": s.kafka_address, "STRATA_REDIS_URL": s.redis_address,
                "STRATA_STATE_DIR": str(s.state_dir), "STRATA_DEVICE": "cpu", "STRATA_LOG_LEVEL": "WARNING",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def _consumer_groups(self) -> dict[str, tuple[str, list[str]]]:
        """Each service's consumer group and the topics it reads, every group started at the topics' end."""
        from strata.bus import topics
        from strata.bus.admin import start_group_at_end

        # Consumer groups of this run only, started at the end of their topics: what an earlier run (or
        # another bench on the same Kafka) left there is never rolled out or folded in again.
        groups = {
            "probe": (f"bench-{self.run_id}-probe", [topics.PROMPTS_LEVEL0]),
            "generator-l1": (f"bench-{self.run_id}-l1", [topics.PROMPTS_LEVEL1]),
            "generator-l2": (f"bench-{self.run_id}-l2", [topics.PROMPTS_LEVEL2]),
            "reward": (f"bench-{self.run_id}-reward", [topics.ROLLOUTS_GENERATED]),
            "scheduler": (f"bench-{self.run_id}-stats",
                          [topics.REWARDS_SCORED, topics.POLICY_UPDATED, topics.RM_UPDATED]),
        }
        if self.learner_args is not None:
            groups["learner"] = (f"bench-{self.run_id}-learner", [topics.REWARDS_SCORED])
        for group, topic_list in groups.values():
            start_group_at_end(self.settings, group, topic_list)
        return groups

    def _service_specs(self, groups: dict[str, tuple[str, list[str]]]) -> dict[str, _ServiceSpec]:
        """Each service's module, arguments and environment of its own, by name."""
        zoo = self.zoo
        # Policy versions are checked against the learner's checkpoint directory (docs/reliability.md).
        follow = {"STRATA_POLICY_CHECKPOINT_ROOT": str(self.checkpoint_dir)}
        learner: dict[str, _ServiceSpec] = {} if self.learner_args is None else {
            "learner": ("svc_learner", self.learner_args, {
                "STRATA_GROUP_ID": groups["learner"][0], "STRATA_POLICY_MODEL_PATH": str(zoo.policy),
                "STRATA_CHECKPOINT_DIR": str(self.checkpoint_dir)})}
        return {
            "probe": ("svc_probe", ["--model", str(zoo.probe)], {"STRATA_GROUP_ID": groups["probe"][0]}),
            "generator-l1": ("svc_generator", ["--tier", "1", "--model", str(zoo.level1)],
                             {"STRATA_GROUP_ID": groups["generator-l1"][0], **follow}),
            "generator-l2": ("svc_generator", ["--tier", "2", "--model", str(zoo.level2)],
                             {"STRATA_GROUP_ID": groups["generator-l2"][0]}),
            "reward": ("svc_reward", ["--light-rm", str(zoo.light_rm), "--strong-rm", str(zoo.strong_rm)],
                       # The replay compares raw light-RM scores with the threshold, so the live router must
                       # too; and no desk runs here to await.
                       {"STRATA_RM_WATCH": "false", "STRATA_USE_CALIBRATION": "false",
                        "STRATA_AWAIT_ANNOTATION": "false", "STRATA_REVIEW_SECONDS_PER_ITEM": str(self.review_seconds),
                        "STRATA_GROUP_ID": groups["reward"][0], **self.reward_env}),
            "scheduler": ("svc_scheduler", [], {
                "STRATA_REDIS_PREFIX": f"strata:bench:{self.run_id}",
                "STRATA_STATS_GROUP_ID": groups["scheduler"][0], "STRATA_WATCH_LOOKBACK_S": "0",
                **follow, **self.scheduler_env}),
            **learner,
        }

    def _spawn(self, specs: dict[str, _ServiceSpec], logs: Path,
               processes: dict[str, subprocess.Popen]) -> None:
        """Start each service on a free gRPC port, logging to ``logs``. Each goes into ``processes`` as it
        starts, so that the caller's ``finally`` stops those running when a later one fails to start."""
        from strata_tools.infra.process import free_port

        common = self._common_env()
        for name, (module, argv, env) in specs.items():
            port = self.ports[name] = free_port(avoid=set(self.ports.values()))
            with open(logs / f"{name}.log", "wb") as out:
                processes[name] = subprocess.Popen(
                    [sys.executable, "-m", module, "--grpc-port", str(port), *argv],
                    env={**os.environ, **common, **env}, stdout=out, stderr=subprocess.STDOUT)

    @staticmethod
    def _await_healthy(processes: dict[str, subprocess.Popen], ports: dict[str, int], logs: Path) -> None:
        """Return once every service answers its health check; raise if one exits or 300 s pass."""
        from strata_tools.stack.control import health

        deadline = time.monotonic() + 300
        pending = dict(ports)
        while pending:
            for name, port in list(pending.items()):
                if processes[name].poll() is not None:
                    raise RuntimeError(f"{name} exited with {processes[name].returncode}; see {logs / name}.log")
                if health(port):
                    del pending[name]
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"not healthy after 300 s: {', '.join(pending)}; see the logs in {logs}")
            time.sleep(0.5)

    @staticmethod
    def _stop_processes(processes: dict[str, subprocess.Popen]) -> None:
        """Terminate every process, then kill those still running after 30 s."""
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

# -- from events to answers ---------------------------------------------------------------------------


def _path_cost(stages: Sequence[ledger.StageCost], tiers: set[int]) -> tuple[float, float, float]:
    chosen = [s for s in stages if s.tier in tiers]
    return (sum(s.device_seconds for s in chosen), sum(s.param_tokens for s in chosen),
            sum(s.human_seconds for s in chosen))


@dataclass(frozen=True)
class Answers:
    """One request's answers, oracle-scored, with what each path cost."""

    level1: Answer | None
    level2: Answer | None
    escalated: bool
    human_seconds: float
    encoder: tuple[float, float]      # device-seconds, params x tokens of the scheduler's encoding
    skipped: bool = False


def answers_of(request: Request, client: Any, store: Any) -> Answers:
    from strata.v1 import common_pb2
    from strata_tools.zoo.oracle import judge

    stages = ledger.read_request(client, request.prompt_hash, request.request_id)
    encoder = _path_cost([s for s in stages if s.stage == "encoder"], {0})
    if any(e.scorer == common_pb2.SCORER_REUSED for e in request.events):
        return Answers(None, None, False, 0.0, encoder[:2], skipped=True)
    level1_events = _per_sample(e for e in request.events if e.tier == common_pb2.TIER_LEVEL_1)
    level2_events = _per_sample(e for e in request.events if e.tier == common_pb2.TIER_LEVEL_2 and e.final)
    level1_cost = _path_cost([s for s in stages if s.stage != "encoder"], {0, 1})
    # A prompt sent straight to Level-2 still paid for its probe (tier 0).
    level2_cost = _path_cost([s for s in stages if s.stage != "encoder"], {2} if level1_events else {0, 2})

    def answer(events: list[Any], reward: float, cost: tuple[float, float, float]) -> Answer:
        oracle = statistics.fmean(judge(request.record, store.get_text(e.response_hash)).score for e in events)
        return Answer(oracle, reward, cost[0], cost[1])

    # Several samples: the Level-1 answer's reward is the lowest (a request escalates when any sample
    # does), its oracle score the samples' mean; a tier's cost is every sample's.
    return Answers(
        answer(level1_events, min(e.reward for e in level1_events), level1_cost) if level1_events else None,
        answer(level2_events, statistics.fmean(e.reward for e in level2_events), level2_cost) if level2_events
        else None,
        escalated=any(e.escalated for e in level1_events),
        human_seconds=level2_cost[2], encoder=encoder[:2],
    )


def _per_sample(events: Iterable[Any]) -> list[Any]:
    """One event per sample (the first seen): a redelivered event does not count twice."""
    seen: dict[int, Any] = {}
    for event in events:
        seen.setdefault(event.sample_index, event)
    return list(seen.values())


def live_figures(name: str, answers: Sequence[Answers], hashes: Sequence[str], baseline_level2: Sequence[Answer],
                 bad_threshold: float, baseline: ArmFigures) -> ArmFigures:
    """A live arm's figures: each prompt's own answers; skipped prompts cost their encoding only and
    are left out of the quality mean (they produce no response)."""
    outcomes, escalated, skipped = [], set(), []
    for digest, a, fallback in zip(hashes, answers, baseline_level2, strict=True):
        if a.skipped:
            skipped.append(a)
            continue
        level1 = None if a.level1 is None else dataclasses.replace(
            a.level1, device_seconds=a.level1.device_seconds + a.encoder[0],
            param_tokens=a.level1.param_tokens + a.encoder[1])
        level2 = a.level2 or fallback  # the fallback is never used: such a prompt stays at Level-1
        if a.level1 is None and a.level2 is not None:
            level2 = dataclasses.replace(a.level2, device_seconds=a.level2.device_seconds + a.encoder[0],
                                         param_tokens=a.level2.param_tokens + a.encoder[1])
        outcomes.append(PromptOutcome(digest, level1, level2, human_seconds=a.human_seconds))
        if a.escalated:
            escalated.add(digest)
    figures = tier_eval.evaluate(name, outcomes, escalated, bad_threshold)
    n = len(answers)
    served = figures.prompts
    figures = dataclasses.replace(
        figures, prompts=n,
        device_seconds=figures.device_seconds + sum(a.encoder[0] for a in skipped),
        param_tokens=figures.param_tokens + sum(a.encoder[1] for a in skipped),
        level2_share=figures.level2_share * served / n,
    )
    compared = tier_eval.compare(figures, baseline)
    if not skipped:
        return compared
    # Quality against the baseline on the prompts that have an answer of their own (cost stays whole).
    served_baseline = statistics.fmean(b.oracle for a, b in zip(answers, baseline_level2, strict=True)
                                       if not a.skipped)
    return dataclasses.replace(compared, quality_ratio=figures.mean_oracle / served_baseline if served_baseline
                               else None)


def baseline_figures(hashes: Sequence[str], answers: Sequence[Answers], risks: Sequence[bool],
                     bad_threshold: float) -> tuple[list[Answer], ArmFigures]:
    """The all-Level-2 arm's Level-2 answers and its figures (compared with itself: saving 0, quality 1)."""
    level2 = [a.level2 for a in answers]
    if any(a is None for a in level2):
        raise ValueError("the all-Level-2 arm left a prompt without a Level-2 answer")
    outcomes = [PromptOutcome(h, None, a, risk, human_seconds=x.human_seconds)
                for h, a, risk, x in zip(hashes, level2, risks, answers, strict=True) if a is not None]
    figures = tier_eval.all_level2(outcomes, bad_threshold)
    return [o.level2 for o in outcomes], tier_eval.compare(figures, figures)


@dataclass(frozen=True)
class Headline:
    """One run's own traffic against the all-Level-2 baseline on the same prompts, and its escalation
    rule judged on the replay of those prompts (the run's Level-1 answers, the baseline's Level-2 ones):
    the figures of the bench's last line."""

    baseline: ArmFigures
    arm: ArmFigures
    sweep: SweepFigures
    oracle_router: ArmFigures
    replayed: int                     # prompts of the replay: skipped ones have no answer of their own
    intervals: HeadlineIntervals | None = None  # bootstrap over paraphrase families, when they were given

    @property
    def apgr(self) -> float | None:
        return self.sweep.route_llm["apgr"]

    def line(self) -> str:
        return headline_line(self.arm, self.apgr, self.sweep.ceiling_share, self.intervals)


def headline_line(arm: ArmFigures, apgr: float | None, ceiling_share: float | None,
                  intervals: HeadlineIntervals | None = None, escalation_auc: float | None = None) -> str:
    """The bench's last line (and the demo's headline): params-x-tokens saving first, device-seconds beside;
    with ``intervals``, the saving's and the quality ratio's 95 % bounds (bootstrap over families); with
    ``escalation_auc``, the served escalation signal's bad-case AUC on the run's Level-1 answers."""
    line = (f"tiers saving={_num(arm.param_token_saving)} device_saving={_num(arm.saving)} "
            f"quality_ratio={_num(arm.quality_ratio)} bad_case_catch={_num(arm.bad_case_catch)} "
            f"level2_share={arm.level2_share:.3f} apgr={_num(apgr)} ceiling_share_of_saving={_num(ceiling_share)}")
    if intervals is not None:
        line += (f" saving_lo={intervals.saving.low:.3f} saving_hi={intervals.saving.high:.3f} "
                 f"quality_ratio_lo={intervals.quality_ratio.low:.3f} "
                 f"quality_ratio_hi={intervals.quality_ratio.high:.3f}")
        if intervals.apgr is not None:
            line += f" apgr_lo={intervals.apgr.low:.3f} apgr_hi={intervals.apgr.high:.3f}"
    if escalation_auc is not None:
        line += f" escalation_auc={_num(escalation_auc)}"
    return line


def escalation_auc(replay: Sequence[PromptOutcome], bad_threshold: float) -> float | None:
    """How well the light RM's reward, the signal the served threshold escalates on, finds the bad Level-1
    answers (oracle under ``bad_threshold``): the probability a bad answer scores under a good one (ties
    half; a prompt's answers averaged, as the replay keeps them); None without both kinds."""
    from strata_tools.rm.onpolicy import detection_auc

    answered = [o.level1 for o in replay if o.level1 is not None and not o.risk]
    auc = detection_auc([a.rm for a in answered], [a.oracle < bad_threshold for a in answered])
    return None if math.isnan(auc) else auc


@dataclass(frozen=True)
class HeadlineIntervals:
    saving: Interval          # params x tokens saving against all-Level-2
    quality_ratio: Interval   # mean oracle against all-Level-2's, on the prompts with an answer of their own
    apgr: Interval | None = None  # RouteLLM's APGR of the whole router, over 0-100 % of Level-2 calls


def apgr_interval(replay: Sequence[PromptOutcome], families: Sequence[str], seed: int = 0,
                  draws: int = 300) -> Interval | None:
    """RouteLLM's APGR of the whole router with a 95 % interval from resampling whole paraphrase families (each
    draw re-traces the curve on the drawn prompts); None when the replay has no APGR."""
    if route_llm_figures(replay)["apgr"] is None:
        return None

    def value(idx: Sequence[int]) -> float:
        drawn = [dataclasses.replace(replay[i], prompt_hash=f"{replay[i].prompt_hash}#{k}")
                 for k, i in enumerate(idx)]
        apgr = route_llm_figures(drawn)["apgr"]
        return float("nan") if apgr is None else apgr

    return cluster_bootstrap(value, families, seed, draws)


def headline_intervals(name: str, own: Sequence[Answers], baseline: Sequence[Answers], hashes: Sequence[str],
                       risks: Sequence[bool], families: Sequence[str], bad_threshold: float, seed: int = 0,
                       draws: int = 500) -> HeadlineIntervals:
    """The headline arm's saving and quality ratio, each with a 95 % interval from resampling whole paraphrase
    families of the prompts (arm and baseline resampled together: the comparison stays paired)."""
    def values(idx: Sequence[int]) -> tuple[float, float]:
        drawn = [f"{hashes[i]}#{k}" for k, i in enumerate(idx)]  # a family drawn twice: two distinct prompts
        try:
            level2, base = baseline_figures(drawn, [baseline[i] for i in idx], [risks[i] for i in idx],
                                            bad_threshold)
            arm = live_figures(name, [own[i] for i in idx], drawn, level2, bad_threshold, base)
        except ValueError:  # a draw of skipped prompts only: no quality to compare
            return float("nan"), float("nan")
        saving, quality_ratio = arm.param_token_saving, arm.quality_ratio
        return (float("nan") if saving is None else saving, float("nan") if quality_ratio is None else quality_ratio)

    saving, quality_ratio = cluster_bootstraps(values, families, seed, draws)
    return HeadlineIntervals(saving, quality_ratio)


def headline_of(name: str, own: Sequence[Answers], baseline: Sequence[Answers], hashes: Sequence[str],
                risks: Sequence[bool], bad_threshold: float, level2_samples: int = 1,
                families: Sequence[str] | None = None,
                expected: Mapping[str, tier_eval.ExpectedScores] | None = None) -> Headline:
    """The headline of a run whose requests got ``own`` answers, against ``baseline`` (the same prompts,
    ``hashes``, through all-Level-2, ``level2_samples`` samples each). Skipped prompts cost their encoding
    and are left out of the quality mean and of the replay; the replay's baseline is all-Level-2 on the
    prompts it keeps, and a replayed escalation pays for one Level-2 sample, as a live one does. With
    ``expected`` scores by prompt hash (:func:`expected_scores`), the router's figures (sweep, ceiling, APGR)
    are of expected quality; the live arms' figures stay what the run served."""
    if not (len(own) == len(baseline) == len(hashes) == len(risks)) or not hashes:
        raise ValueError("headline_of needs one own answer, one baseline answer, a hash and a risk flag per prompt")
    if level2_samples < 1:
        raise ValueError("level2_samples must be >= 1")
    kept = [i for i, a in enumerate(own) if not a.skipped]
    if not kept:
        raise ValueError("every prompt was skipped: no answer of the run's own to judge or replay")
    level2, base = baseline_figures(hashes, baseline, risks, bad_threshold)
    arm = live_figures(name, own, hashes, level2, bad_threshold, base)

    def escalation(i: int) -> tuple[Answer, float]:
        """What escalating prompt ``i`` costs: one of the baseline's samples (a prompt sent straight to
        Level-2 rolls out every sample there, as the baseline does)."""
        if own[i].level1 is None:
            return level2[i], baseline[i].human_seconds
        one = dataclasses.replace(level2[i], device_seconds=level2[i].device_seconds / level2_samples,
                                  param_tokens=level2[i].param_tokens / level2_samples)
        return one, baseline[i].human_seconds / level2_samples

    replay = []
    for i in kept:
        answer, human = escalation(i)
        replay.append(PromptOutcome(hashes[i], own[i].level1, answer, risks[i], human_seconds=human))
    served = frozenset(hashes[i] for i in kept if own[i].escalated)
    _, replay_base = baseline_figures([hashes[i] for i in kept], [baseline[i] for i in kept],
                                      [risks[i] for i in kept], bad_threshold)
    if expected is not None:
        replay, replay_base = expected_replay(replay, replay_base, expected)
    oracle_arm = tier_eval.compare(tier_eval.evaluate("oracle router (replay)", replay,
                                                      tier_eval.oracle_router(replay, bad_threshold), bad_threshold),
                                   replay_base)
    intervals = None
    if families is not None:
        intervals = dataclasses.replace(
            headline_intervals(name, own, baseline, hashes, risks, families, bad_threshold),
            apgr=apgr_interval(replay, [families[i] for i in kept]))
    return Headline(base, arm, sweep_figures(replay, replay_base, bad_threshold, served, expected is not None),
                    oracle_arm, len(replay), intervals)


def expected_replay(replay: Sequence[PromptOutcome], baseline: ArmFigures,
                    expected: Mapping[str, tier_eval.ExpectedScores]) -> tuple[list[PromptOutcome], ArmFigures]:
    """``replay`` and its all-Level-2 ``baseline`` with expected scores: the baseline keeps its costs, its quality
    becomes the expected Level-2 mean."""
    scored = tier_eval.with_expected(replay, expected)
    rescored = dataclasses.replace(baseline, mean_oracle=statistics.fmean(o.level2.oracle for o in scored))
    return scored, tier_eval.compare(rescored, rescored)


def expected_scores(zoo: Any, records: Sequence[Any], samples: int, seed: int,
                    progress: Callable[[str], None] = print) -> dict[str, tier_eval.ExpectedScores]:
    """Each record's expected oracle score at Level-2 and, where the probe is cautious, at Level-1 (by prompt
    hash): ``samples`` answers per tier, prompted and sampled as the live tiers are (``strata_tools.level1``):
    Level-2 as the all-Level-2 arm sends it (no directions), Level-1 with the directions the probe forwards.
    Level-1 answers to prompts the router judges are not sampled again: it judged the one it saw."""
    from strata.hashing import content_hash
    from strata_tools.level1 import LivePrompting, generate_answers, probe_prompts
    from strata_tools.zoo.oracle import oracle_score
    from svc_generator.backends.hf import HfBackend

    if samples < 1:
        raise ValueError("samples must be >= 1")
    probed = probe_prompts(zoo.probe, [r.text for r in records])
    level1 = LivePrompting.live(1)
    cautious = [i for i, p in enumerate(probed) if p.caution]

    def mean_scores(tier: int, prompting: LivePrompting, model: Path, chosen: Sequence[int],
                    directions: Sequence[tuple[str, ...]]) -> list[float]:
        progress(f"expected quality: {samples} Level-{tier} answers to each of {len(chosen)} prompts, sampled as "
                 "live")
        if not chosen:
            return []
        backend = HfBackend(str(model), "cpu")
        texts = [records[i].text for i in chosen]
        totals = [0.0] * len(chosen)
        for k in range(samples):
            outputs = generate_answers(backend, prompting, texts, directions, seed + 1000 * k + tier)
            for j, output in enumerate(outputs):
                totals[j] += oracle_score(records[chosen[j]], output.text)
        return [t / samples for t in totals]

    level2 = mean_scores(2, LivePrompting.live(2), Path(zoo.level2), range(len(records)), [() for _ in records])
    unrouted = dict(zip(cautious, mean_scores(1, level1, Path(zoo.level1), cautious,
                                              [level1.directions(probed[i]) for i in cautious]), strict=True))
    return {content_hash(r.text): tier_eval.ExpectedScores(level2[i], samples, unrouted.get(i))
            for i, r in enumerate(records)}


# -- report -------------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def arm_table(arms: Sequence[ArmFigures]) -> list[str]:
    lines = [f"{'arm':<32} {'device s':>9} {'saving':>7} {'PxT sav.':>8} {'human h':>8} {'oracle':>7} "
             f"{'quality':>8} {'L2 share':>8} {'catch':>6} {'false esc':>9}"]
    for a in arms:
        lines.append(f"{a.name:<32} {a.device_seconds:>9.1f} {_pct(a.saving):>7} {_pct(a.param_token_saving):>8} "
                     f"{a.human_seconds / 3600:>8.2f} {a.mean_oracle:>7.3f} {_num(a.quality_ratio):>8} "
                     f"{_pct(a.level2_share):>8} {_pct(a.bad_case_catch):>6} {_pct(a.false_escalation):>9}")
    return lines


def run(args: argparse.Namespace) -> int:
    from strata.config import StrataSettings
    from strata.errors import CliError
    from strata_tools.bench.infra import bench_infra

    if args.price_as is not None:
        try:
            parse_price_as(args.price_as)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
    if args.prompts < 4 or args.history < 0:
        raise CliError("--prompts must be >= 4 and --history >= 0")
    if args.epochs < 1:
        raise CliError("--epochs must be >= 1 (1: the tiered + skip arm alone, no later passes)")
    if args.expected_samples < 1:
        raise CliError("--expected-samples must be >= 1")
    if not (0 <= args.risk_share <= 1 and 0 <= args.stress_risk_share <= 1):
        raise CliError("--risk-share and --stress-risk-share must be in [0, 1]")
    run_id = uuid.uuid4().hex[:8]
    settings = StrataSettings()
    # The services' per-event INFO lines would bury the progress; warnings and errors still show.
    logging.getLogger().setLevel(logging.WARNING)
    out = args.out or settings.state_dir / "reports"
    with bench_infra(settings, run_id, "tiers") as infra:
        return _run(args, infra, run_id, out)


def _run(args: argparse.Namespace, settings: Any, run_id: str, out: Path) -> int:

    from strata.content_store import ContentStore
    from strata_tools.zoo.build import ensure_zoo
    from strata_tools.zoo.suite import SEALED_SPLIT, load_suite

    def progress(line: str) -> None:
        print(line, flush=True)

    zoo = ensure_zoo(settings)
    mixes = prompt_mixes(load_suite(SEALED_SPLIT), args.prompts, args.seed, args.risk_share, args.stress_risk_share)
    eval_records = mixes.union
    history = pick_prompts(load_suite("train"), args.history, args.seed + 1) if args.history else []
    stress = (f"; stress mix {len(mixes.stress)} ({sum(r.risk for r in mixes.stress)} risk)" if mixes.stress
              else "")
    progress(f"tiers bench: zoo {zoo.root.name}, {len(eval_records)} test prompts: default mix "
             f"{len(mixes.default)} ({sum(r.risk for r in mixes.default)} risk){stress}; {len(history)} history "
             "prompts; each service in its own process")
    threshold = resolve_threshold(args, zoo, [str(zoo.light_rm)], args.bad_threshold, args.seed, progress)
    live = LiveTiers(settings, zoo, run_id, args.review_seconds, args.seed,
                     reward_env={"STRATA_ESCALATION_THRESHOLD": repr(threshold.value)})
    runs: dict[str, ArmRun] = {}
    with live.started():
        warm_up(live, history, args, progress)
        for name, half, part, route, first in alternated_order(eval_records):
            progress(f"[arm] {name}, part {part} of 2: {len(half)} prompts via {route}")
            run = live.run_arm(name, half, route, args.timeout, progress, tag=f"{run_id}-{route}-{part}",
                               first_index=first)
            runs[name] = run if name not in runs else merged(runs[name], run)
            progress(f"      done in {run.wall_s:.0f} s")
        for name, records, route in (("history", history, "scheduler"), (HEADLINE_ARM, eval_records, "scheduler")):
            if not records:
                continue
            progress(f"[arm] {name}: {len(records)} prompts via {route}")
            runs[name] = live.run_arm(name, records, route, args.timeout, progress)
            progress(f"      done in {runs[name].wall_s:.0f} s")
        for epoch in range(2, args.epochs + 1):
            name = epoch_arm(epoch)
            progress(f"[arm] {name}: the {len(eval_records)} test prompts again via the scheduler, reshuffled")
            run = live.run_arm(name, epoch_order(eval_records, epoch, args.seed), "scheduler", args.timeout, progress)
            runs[name] = in_order_of(eval_records, run)
            progress(f"      done in {run.wall_s:.0f} s")
        audits = settled_audits(live.scheduler_address) if args.epochs > 1 else None
    client = redis_client.connect(settings.redis_address, socket_timeout=30)
    store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    answers = {name: [answers_of(r, client, store) for r in run.requests] for name, run in runs.items()
               if name != "history"}
    client.close()
    expected = expected_scores(zoo, eval_records, args.expected_samples, args.seed, progress)
    report = build_report(args, zoo.root.name, mixes, runs, answers, threshold, expected, audits)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tiers.json").write_text(json.dumps(report["json"], indent=2))
    tier_eval.plot_curve(out / "tiers.png", report["sweep"], report["marks"], report["ceiling"])
    print("\n".join(report["lines"]))
    print(f"figures: {out / 'tiers.json'}   curve: {out / 'tiers.png'}")
    head = report["headline"]
    print(headline_line(head, report["apgr"], report["ceiling_share"], report["intervals"], report["escalation_auc"]))
    return 0


def warm_up(live: LiveTiers, history: Sequence[Any], args: argparse.Namespace,
            progress: Callable[[str], None]) -> None:
    """``WARM_UP_PROMPTS`` train prompts (none of the history's) through each route, unmeasured: cold services
    pay their first batches here, in no arm's cost."""
    from strata_tools.zoo.suite import load_suite

    taken = {r.id for r in history}
    prompts = [r for r in pick_prompts(load_suite("train"), 2 * WARM_UP_PROMPTS, args.seed + 2)
               if r.id not in taken][:WARM_UP_PROMPTS]
    for route in ("level2", "level0"):
        progress(f"[warm-up] {len(prompts)} train prompts via {route} (not measured)")
        live.run_arm(f"warm-up {route}", prompts, route, args.timeout, progress)


def alternated_order(records: Sequence[Any]) -> list[tuple[str, list[Any], int, str, int]]:
    """The all-Level-2 and tiered arms in halves, A B B A (arm, half of ``records``, part, route, the half's
    first index in ``records``): each arm
    runs once early and once late, so a drift of the machine over the run (warming caches, a neighbour's
    load) weighs on both arms alike, not on whichever ran first."""
    cut = len(records) // 2
    first, second = list(records[:cut]), list(records[cut:])
    return [("all-Level-2", first, 1, "level2", 0), ("tiered", first, 1, "level0", 0),
            ("tiered", second, 2, "level0", cut), ("all-Level-2", second, 2, "level2", cut)]


def merged(first: ArmRun, second: ArmRun) -> ArmRun:
    """One arm run in two parts: requests in order, stage costs summed by (stage, tier), walls added."""
    return ArmRun(first.name, [*first.requests, *second.requests], ledger.add(first.stages, second.stages),
                  first.wall_s + second.wall_s)


# -- the epoch stream ---------------------------------------------------------------------------------


def epoch_arm(epoch: int) -> str:
    """The arm name of the stream's ``epoch`` (1-based); the first pass is the tiered + skip arm."""
    return HEADLINE_ARM if epoch == 1 else f"{HEADLINE_ARM}, epoch {epoch}"


def epoch_order(records: Sequence[Any], epoch: int, seed: int) -> list[Any]:
    """The order in which ``epoch`` sends ``records``: a seeded shuffle of its own, as a training loop
    reshuffles its prompt set every epoch."""
    order = list(records)
    random.Random(f"{seed}-epoch-{epoch}").shuffle(order)
    return order


def in_order_of(records: Sequence[Any], run: ArmRun) -> ArmRun:
    """``run`` with its requests in ``records``' order (the report reads arms prompt by prompt)."""
    by_record = {id(r.record): r for r in run.requests}
    if set(by_record) != {id(r) for r in records}:
        raise ValueError("the run's requests are not those of the records")
    return dataclasses.replace(run, requests=[by_record[id(r)] for r in records])


@dataclass(frozen=True)
class Audits:
    """The scheduler's skip audit over the whole stream: audited skips rolled out anyway, and how far the
    reward a skip would have reused was from the fresh one (R12)."""

    audits: int
    scored: int
    reuse_mae: float | None
    reuse_mae_ci95: float | None = None  # half-width of the MAE's 95 % interval
    distrusts: int = 0  # audits that erred and took the neighbours they reused out of reuse


def settled_audits(scheduler_address: str, timeout_s: float = 60.0) -> Audits:
    """The scheduler's audit figures once every audit's fresh reward is folded in (or ``timeout_s``)."""
    from strata.v1 import scheduler_pb2, scheduler_pb2_grpc

    deadline = time.monotonic() + timeout_s
    with rpc.channel(scheduler_address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:
            stats = stub.Stats(scheduler_pb2.StatsRequest(), timeout=30)
            if stats.audits_scored >= stats.audits or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # the statistics worker folds the stream's last rewards after it ends
    mae = stats.audit_reuse_mae if stats.HasField("audit_reuse_mae") else None
    ci95 = stats.audit_reuse_mae_ci95 if stats.HasField("audit_reuse_mae_ci95") else None
    return Audits(stats.audits, stats.audits_scored, mae, ci95, stats.audit_distrusts)


def epoch_figures(answers: dict[str, list[Answers]], hashes: Sequence[str], level2: Sequence[Answer],
                  bad_threshold: float, baseline: ArmFigures) -> list[tuple[int, int, ArmFigures]]:
    """Each epoch of the stream that ran: its number, prompts skipped, and its figures against all-Level-2."""
    rows = []
    epoch = 1
    while (name := epoch_arm(epoch)) in answers:
        figures = live_figures(name, answers[name], hashes, level2, bad_threshold, baseline)
        rows.append((epoch, sum(a.skipped for a in answers[name]), figures))
        epoch += 1
    return rows


def epoch_lines(rows: Sequence[tuple[int, int, ArmFigures]], tiered: ArmFigures, audits: Audits | None) -> list[str]:
    """The stream's table: per epoch, what skipping removed and what the saving became beside the tiered arm's."""
    if not rows:
        return []
    lines = ["the training-shaped stream: the same test prompts through the scheduler epoch after epoch (fixed "
             "policy; skipped prompts cost their encoding and have no answer of their own)",
             f"  {'epoch':>5} {'skipped':>8} {'PxT sav.':>8} {'vs tiered':>9} {'device sav.':>11} {'quality':>8} "
             f"{'L2 share':>8} {'catch':>6}"]
    for epoch, skipped, a in rows:
        gain = None if a.param_token_saving is None or tiered.param_token_saving is None \
            else a.param_token_saving - tiered.param_token_saving
        lines.append(f"  {epoch:>5} {_pct(skipped / a.prompts):>8} {_pct(a.param_token_saving):>8} "
                     f"{'-' if gain is None else format(gain * 100, '+.1f') + ' pt':>9} {_pct(a.saving):>11} "
                     f"{_num(a.quality_ratio):>8} {_pct(a.level2_share):>8} {_pct(a.bad_case_catch):>6}")
    if audits is not None:
        mae = "-" if audits.reuse_mae is None else f"{audits.reuse_mae:.3f}"
        if audits.reuse_mae_ci95 is not None:
            mae += f" ± {audits.reuse_mae_ci95:.3f} (95 %)"
        lines.append(f"  skip audit, the scheduler's whole run (history, skip arm, later epochs): {audits.scored} of "
                     f"{audits.audits} audited skips scored, {audits.distrusts} erred and distrusted the neighbours "
                     f"they reused, reuse error (MAE) {mae} (what a reused reward costs "
                     "in reward quality)")
    return lines


@dataclass
class _ReportArms:
    """The arms a report compares, live and replayed, and the replayed outcomes they were computed on."""

    baseline: ArmFigures              # all-Level-2, live
    tiered: ArmFigures                # tiered, live
    headline: ArmFigures              # the skip arm when it ran, else the tiered arm
    random_router: ArmFigures
    oracle_router: ArmFigures
    table: list[ArmFigures]           # every arm, in the table's order
    replay: list[PromptOutcome]       # Level-1 answers of the tiered arm, Level-2 of the all-Level-2 arm
    threshold: float                  # the reward service's escalation threshold


@dataclass
class SweepFigures:
    """The replayed threshold sweep, the RouteLLM figures of its curve, and the ceiling of any router."""

    arms: list[ArmFigures]
    strong: float                     # all-Level-2's quality on the replay (RouteLLM's ends: ``route_llm``)
    route_llm: dict[str, float | None]
    ceiling: list[ArmFigures]
    ceiling_share: float | None       # the served router's PxT saving / the ceiling's best at the target quality
    router: ArmFigures                # the served router (its live escalations) on the replay
    replay: list[PromptOutcome]       # what the figures were read off
    expected: bool = False            # scores are expectations over several samples per prompt and tier


def subset(union: Sequence[Any], chosen: Sequence[Any], runs: dict[str, ArmRun], answers: dict[str, list[Answers]]
           ) -> tuple[list[Any], dict[str, ArmRun], dict[str, list[Answers]]]:
    """The records of ``chosen`` (in ``union``'s order) and the eval arms' requests and answers for them.

    The arms' stage totals stay the union's: they are what the live run booked, printed once."""
    keep = {id(r) for r in chosen}
    index = [i for i, r in enumerate(union) if id(r) in keep]
    runs = {name: run if name == "history" else dataclasses.replace(run, requests=[run.requests[i] for i in index])
            for name, run in runs.items()}
    return [union[i] for i in index], runs, {name: [a[i] for i in index] for name, a in answers.items()}


def build_report(args: argparse.Namespace, zoo_hash: str, mixes: PromptMixes, union_runs: dict[str, ArmRun],
                 union_answers: dict[str, list[Answers]], threshold: ServedThreshold,
                 expected: Mapping[str, tier_eval.ExpectedScores], audits: Audits | None = None) -> dict[str, Any]:
    """The printed lines, the JSON figures, and the sweep, ceiling, marks and headline arm of the curve
    (the default mix's), the epoch stream's rows, with the stress mix's figures read off the same live
    answers."""
    records, runs, answers = subset(mixes.union, mixes.default, union_runs, union_answers)
    arms = _report_arms(args.bad_threshold, records, runs, answers, threshold.value)
    sweep = _expected_sweep(arms, answers, expected, args.bad_threshold)
    lines = [f"escalation threshold served: {threshold.source}",
             *_report_lines(args, zoo_hash, records, union_runs, answers, arms, sweep)]
    if args.price_as is not None:
        lines += price_lines(union_runs, parse_price_as(args.price_as))
    epochs = epoch_figures(answers, [o.prompt_hash for o in arms.replay], [o.level2 for o in arms.replay],
                           args.bad_threshold, arms.baseline)
    lines += epoch_lines(epochs, arms.tiered, audits)
    stress_json = None
    if mixes.stress:
        stress_records, stress_runs, stress_answers = subset(mixes.union, mixes.stress, union_runs, union_answers)
        stress_arms = _report_arms(args.bad_threshold, stress_records, stress_runs, stress_answers,
                                   threshold.value)
        stress_sweep = _expected_sweep(stress_arms, stress_answers, expected, args.bad_threshold)
        lines += ["", f"stress mix: {len(stress_records)} test prompts ({sum(r.risk for r in stress_records)} risk), "
                      "read off the same live answers", *arm_table(stress_arms.table),
                  *routing_lines(stress_sweep, stress_arms.oracle_router, stress_arms.tiered)]
        stress_json = {"prompts": len(stress_records), "risk_prompts": sum(r.risk for r in stress_records),
                       "arms": [tier_eval.to_json(a) for a in stress_arms.table],
                       "ceiling": [tier_eval.to_json(a) for a in stress_sweep.ceiling],
                       "route_llm": stress_sweep.route_llm, "ceiling_share_of_saving": stress_sweep.ceiling_share}
    # The curve and ceiling are of expected Level-2 scores; the live and replayed arms of one sample each.
    marks = {"all-Level-2": arms.baseline, "served router (expected)": sweep.router,
             "tiered (one sample)": arms.tiered, "random router (one sample)": arms.random_router,
             "oracle router (one sample)": arms.oracle_router}
    if answers.get(HEADLINE_ARM) is not None:
        marks[f"{HEADLINE_ARM} (one sample)"] = arms.headline
    figures = {
        "zoo": zoo_hash, "prompts": len(records), "risk_prompts": sum(r.risk for r in records),
        "bad_threshold": args.bad_threshold, "escalation_threshold": arms.threshold,
        "escalation_threshold_source": threshold.source,
        "review_seconds": args.review_seconds, "arms": [tier_eval.to_json(a) for a in arms.table],
        "sweep": [tier_eval.to_json(a) for a in sweep.arms], "ceiling": [tier_eval.to_json(a) for a in sweep.ceiling],
        "route_llm": sweep.route_llm, "ceiling_share_of_saving": sweep.ceiling_share, "article": ARTICLE,
        "expected_samples": args.expected_samples, "served_router": tier_eval.to_json(sweep.router),
        "risk_share": args.risk_share, "stress": stress_json, "live_prompts": len(mixes.union),
        "epochs": [{"epoch": e, "skipped": skipped, **tier_eval.to_json(a)} for e, skipped, a in epochs],
        "audits": None if audits is None else dataclasses.asdict(audits),
        "stages": {name: [dataclasses.asdict(s) for s in run.stages] for name, run in union_runs.items()},
        "wall_s": {name: run.wall_s for name, run in union_runs.items()},
    }
    headline_name = HEADLINE_ARM if answers.get(HEADLINE_ARM) is not None else "tiered"
    intervals = dataclasses.replace(
        headline_intervals(headline_name, answers[headline_name], answers["all-Level-2"],
                           [r.prompt_hash for r in runs["all-Level-2"].requests], [r.risk for r in records],
                           [r.family for r in records], args.bad_threshold, args.seed),
        apgr=apgr_interval(sweep.replay, [r.family for r in records], args.seed))
    figures["headline_intervals"] = dataclasses.asdict(intervals)
    figures["escalation_auc"] = escalation_auc(arms.replay, args.bad_threshold)
    return {"lines": lines, "json": figures, "sweep": sweep.arms, "ceiling": sweep.ceiling, "marks": marks,
            "headline": arms.headline, "apgr": sweep.route_llm["apgr"], "ceiling_share": sweep.ceiling_share,
            "intervals": intervals, "escalation_auc": escalation_auc(arms.replay, args.bad_threshold)}


def _expected_sweep(arms: _ReportArms, answers: dict[str, list[Answers]],
                    expected: Mapping[str, tier_eval.ExpectedScores], bad_threshold: float) -> SweepFigures:
    """The router's figures on the replay with expected scores; its operating point: the live tiered arm's
    escalations (the served threshold, calibrated on the validation split)."""
    served = frozenset(o.prompt_hash for o, a in zip(arms.replay, answers["tiered"], strict=True) if a.escalated)
    replay, baseline = expected_replay(arms.replay, arms.baseline, expected)
    return sweep_figures(replay, baseline, bad_threshold, served, expected=True)


def _report_arms(bad_threshold: float, records: Sequence[Any], runs: dict[str, ArmRun],
                 answers: dict[str, list[Answers]], threshold: float) -> _ReportArms:
    """The all-Level-2 baseline, the live arms and the replayed routers, each compared to the baseline."""
    from strata.errors import CliError

    hashes = [r.prompt_hash for r in runs["all-Level-2"].requests]
    try:
        level2, baseline = baseline_figures(hashes, answers["all-Level-2"], [r.risk for r in records], bad_threshold)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    tiered = live_figures("tiered (live)", answers["tiered"], hashes, level2, bad_threshold, baseline)
    table = [baseline, tiered]
    headline = tiered
    skip_answers = answers.get(HEADLINE_ARM)
    if skip_answers is not None:
        skip_hashes = [r.prompt_hash for r in runs[HEADLINE_ARM].requests]
        headline = live_figures(f"{HEADLINE_ARM} (live)", skip_answers, skip_hashes, level2, bad_threshold,
                                baseline)
        table.append(headline)
    # Replay: Level-1 answers of the tiered arm, Level-2 answers of the all-Level-2 arm.
    replay = [PromptOutcome(h, a.level1, l2, r.risk, human_seconds=b.human_seconds)
              for h, a, l2, r, b in zip(hashes, answers["tiered"], level2, records, answers["all-Level-2"],
                                        strict=True)]
    replayed, keep, random_arm, oracle_arm = _replayed_arms(replay, threshold, tiered.level2_share, bad_threshold,
                                                            baseline)
    table += [replayed, keep, random_arm, oracle_arm]
    return _ReportArms(baseline, tiered, headline, random_arm, oracle_arm, table, replay, threshold)


def _replayed_arms(replay: list[PromptOutcome], threshold: float, tiered_share: float, bad_threshold: float,
                   baseline: ArmFigures) -> list[ArmFigures]:
    """The replayed arms, in the table's order: the threshold router, keep the better, random and oracle routers."""
    replayed = tier_eval.compare(tier_eval.evaluate(f"tiered (replay, t={threshold})", replay,
                                                    tier_eval.threshold_router(replay, threshold),
                                                    bad_threshold), baseline)
    keep = tier_eval.compare(tier_eval.evaluate("tiered + keep better (replay)", replay,
                                                tier_eval.threshold_router(replay, threshold), bad_threshold,
                                                keep_better=True), baseline)
    random_arm = tier_eval.random_router_figures(replay, tiered_share, bad_threshold, baseline)
    oracle_arm = tier_eval.compare(tier_eval.evaluate("oracle router (replay)", replay,
                                                      tier_eval.oracle_router(replay, bad_threshold),
                                                      bad_threshold), baseline)
    return [replayed, keep, random_arm, oracle_arm]


def route_llm_figures(replay: Sequence[PromptOutcome]) -> dict[str, float | None]:
    """RouteLLM's APGR, CPT(50 %) and CPT(80 %) of the whole router (probe caution, then the light-RM threshold)
    on its 0-100 % axis of Level-2 calls (``tier_eval.route_llm_curve``), with the curve's ends as weak and
    strong; None each when a cautious prompt has no Level-1 answer to start the axis from, or the curve is
    flat (weak = strong)."""
    none: dict[str, float | None] = {"apgr": None, "cpt50": None, "cpt80": None, "weak": None, "strong": None}
    try:
        points = tier_eval.route_llm_curve(replay)
    except ValueError:
        return none
    weak, strong = points[0][1], points[-1][1]
    if strong == weak:
        return {**none, "weak": weak, "strong": strong}
    return {"apgr": tier_eval.apgr(points, weak, strong), "cpt50": tier_eval.cpt(points, weak, strong, 0.5),
            "cpt80": tier_eval.cpt(points, weak, strong, 0.8), "weak": weak, "strong": strong}


def sweep_figures(replay: Sequence[PromptOutcome], baseline: ArmFigures, bad_threshold: float,
                  served: Collection[str], expected: bool = False) -> SweepFigures:
    """The threshold sweep over ``replay``, RouteLLM's figures of the whole router, the ceiling, and the router's
    share of the ceiling's saving at its operating point: the prompts it escalated live (``served``, under a
    threshold calibrated on the validation split); ``baseline`` is all-Level-2 on the replay's prompts.
    ``expected``: the replay's scores are expectations (``tier_eval.with_expected``), as the figures then are."""
    sweep = tier_eval.sweep(replay, bad_threshold, baseline)
    best = tier_eval.ceiling(replay, bad_threshold, baseline)
    router = tier_eval.compare(tier_eval.evaluate("served router", replay, frozenset(served), bad_threshold),
                               baseline)
    return SweepFigures(sweep, baseline.mean_oracle, route_llm_figures(replay), best,
                        tier_eval.share_of_ceiling_saving(router, best, TARGET_QUALITY_RATIO), router, list(replay),
                        expected)


def _report_lines(args: argparse.Namespace, zoo_hash: str, records: Sequence[Any], runs: dict[str, ArmRun],
                  answers: dict[str, list[Answers]], arms: _ReportArms, sweep: SweepFigures) -> list[str]:
    """The report as printed: the arms' table, where each arm's cost went, the threshold sweep, the ceiling,
    and the headline arm against the article."""
    level1_oracle = [a.level1.oracle for a in answers["tiered"] if a.level1 is not None]
    bad = sum(o < args.bad_threshold for o in level1_oracle)
    lines = [f"zoo {zoo_hash}; {len(records)} test prompts ({sum(r.risk for r in records)} risk); "
             f"bad case: Level-1 oracle < {args.bad_threshold} ({bad} of {len(level1_oracle)} Level-1 answers, "
             f"mean {statistics.fmean(level1_oracle):.3f}); human review {args.review_seconds:.0f} s per item",
             *arm_table(arms.table), ""]
    for name, run in runs.items():
        if name.startswith(f"{HEADLINE_ARM}, epoch"):
            continue  # the stream's later epochs: their figures are in the stream's table and the JSON
        lines.append(f"{name} ({len(run.requests)} prompts live, {run.wall_s:.0f} s wall): where the cost went")
        lines += ["  " + line for line in _stage_lines(run.stages)]
    lines += _threshold_lines(arms.replay, args.bad_threshold, arms.baseline, arms.threshold)
    lines += routing_lines(sweep, arms.oracle_router, arms.tiered)
    skip_answers = answers.get(HEADLINE_ARM)
    if skip_answers is not None:
        skipped = sum(a.skipped for a in skip_answers)
        lines.append(f"{HEADLINE_ARM}: {skipped} of {len(skip_answers)} prompts skipped (reused reward); "
                     "their encoding is in the cost, they are not in the quality mean")
    headline = arms.headline
    lines.append(f"{'':<14}{'saving':>8} {'quality':>8} {'catch':>7} {'L2 share':>9}   "
                 "(Strata's saving: params x tokens)")
    lines.append(f"{'article':<14}{ARTICLE['saving']:>8.1%} {ARTICLE['quality_ratio']:>8.3f} "
                 f"{ARTICLE['bad_case_catch']:>7.1%} {ARTICLE['level2_share']:>9.1%}")
    lines.append(f"{'Strata':<14}{_pct(headline.param_token_saving):>8} {_num(headline.quality_ratio):>8} "
                 f"{_pct(headline.bad_case_catch):>7} {_pct(headline.level2_share):>9}   ({headline.name})")
    return lines


def routing_lines(sweep: SweepFigures, oracle_arm: ArmFigures, router_arm: ArmFigures,
                  router_label: str = "the tiered arm's") -> list[str]:
    """The router against the literature's yardsticks: RouteLLM's figures of the whole router, the ceiling of
    any router (beside the oracle router's and ``router_arm``'s shares), and the served router's saving as a
    share of the most any router saves at the target quality."""
    route_llm = sweep.route_llm
    router = tier_eval.best_saving_at(sweep.arms, TARGET_QUALITY_RATIO)
    best = tier_eval.ceiling_saving_at(sweep.ceiling, TARGET_QUALITY_RATIO)
    scores = "expected Level-2 scores" if sweep.expected else "one sample per prompt and tier"
    if route_llm["apgr"] is None:
        route_line = ("RouteLLM figures: none (the axis starts with every prompt at Level-1, and cautious prompts have "
                      "no Level-1 answer here; `strata bench tiers` samples them)")
    else:
        route_line = (f"RouteLLM figures of the whole router over 0-100 % Level-2 calls ({scores}; weak "
                      f"{_num(route_llm['weak'])}, strong {_num(route_llm['strong'])}): "
                      f"APGR {_num(route_llm['apgr'])}, CPT(50%) {_pct(route_llm['cpt50'])}, "
                      f"CPT(80%) {_pct(route_llm['cpt80'])}")
    return [route_line,
            *ceiling_lines(sweep.ceiling, oracle_arm, router_arm, router_label),
            f"params x tokens saving at quality >= {TARGET_QUALITY_RATIO} ({scores}): the served router "
            f"{_pct(sweep.router.param_token_saving)} at quality {_num(sweep.router.quality_ratio)} (best threshold of "
            f"the sweep, chosen after the fact: {_pct(router)}), ceiling {_pct(best)}: {_num(sweep.ceiling_share)} "
            "of the ceiling's"]


def _threshold_lines(replay: list[PromptOutcome], bad_threshold: float, baseline: ArmFigures,
                     served: float) -> list[str]:
    """The replayed threshold router at each threshold of ``THRESHOLD_GRID`` and at the ``served`` one, one row
    each under a header."""
    lines = [f"escalation threshold (replay): {'threshold':>9} {'L2 share':>8} {'catch':>6} {'false esc':>9} "
             f"{'saving':>7} {'PxT sav.':>8} {'quality':>8}"]
    for t in sorted({*THRESHOLD_GRID, served}):
        a = tier_eval.compare(tier_eval.evaluate(f"t={t}", replay, tier_eval.threshold_router(replay, t),
                                                 bad_threshold), baseline)
        mark = "  <- served" if t == served else ""
        lines.append(f"{'':<30} {t:>9.3f} {_pct(a.level2_share):>8} {_pct(a.bad_case_catch):>6} "
                     f"{_pct(a.false_escalation):>9} {_pct(a.saving):>7} {_pct(a.param_token_saving):>8} "
                     f"{_num(a.quality_ratio):>8}{mark}")
    return lines


def ceiling_lines(best: Sequence[ArmFigures], oracle_arm: ArmFigures, router_arm: ArmFigures | None = None,
                  router_label: str = "the tiered arm's") -> list[str]:
    """What the best router possible on these answers reaches: at the lowest share, at the target, at the
    oracle router's share, at the served router's (when given), and the cheapest at the target quality."""
    floor = best[0]
    lines = [f"ceiling (any router, escalating the prompts of largest oracle gain per Level-2 cost first; cautious "
             f"prompts are Level-2, so the share starts at {_pct(floor.level2_share)}):",
             f"  {'':<30} {'L2 share':>8} {'saving':>7} {'PxT sav.':>8} {'quality':>8}"]

    def row(label: str, a: ArmFigures) -> str:
        return (f"  {label:<30} {_pct(a.level2_share):>8} {_pct(a.saving):>7} {_pct(a.param_token_saving):>8} "
                f"{_num(a.quality_ratio):>8}")

    lines.append(row("lowest share", floor))
    at_target = [a for a in best if a.level2_share <= TARGET_LEVEL2_SHARE + 1e-9]
    lines.append(row(f"share <= {TARGET_LEVEL2_SHARE:.0%}", at_target[-1]) if at_target
                 else f"  {'share <= ' + format(TARGET_LEVEL2_SHARE, '.0%'):<30} unreachable: cautious prompts alone "
                      f"are {_pct(floor.level2_share)}")
    same = min(best, key=lambda a: abs(a.level2_share - oracle_arm.level2_share))
    lines.append(row("at the oracle router's share", same))
    if router_arm is not None:
        same = min(best, key=lambda a: abs(a.level2_share - router_arm.level2_share))
        lines.append(row(f"at {router_label} share", same))
    cheapest = tier_eval.cheapest_reaching(best, TARGET_QUALITY_RATIO)
    lines.append(row(f"cheapest at quality >= {TARGET_QUALITY_RATIO}", cheapest) if cheapest
                 else f"  quality >= {TARGET_QUALITY_RATIO}: unreachable by any router")
    return lines


def price_lines(runs: Mapping[str, ArmRun], price: PriceAs, baseline_arm: str = "all-Level-2") -> list[str]:
    """Each arm's params x tokens summed over its stages, measured and at ``price``'s sizes, and its saving
    against the all-Level-2 arm both ways: the same decisions and tokens, another cost structure."""
    lines = [price.describe()]
    base = runs.get(baseline_arm)
    if base is None:
        return [*lines, f"  no {baseline_arm} arm in this run: nothing to compare with"]
    measured_base = sum(s.param_tokens for s in base.stages)
    priced_base = sum(s.param_tokens for s in reprice(base.stages, price)[0])
    for name, run in runs.items():
        if name.startswith(f"{HEADLINE_ARM}, epoch"):
            continue
        priced, unpriced = reprice(run.stages, price)
        measured_total, priced_total = sum(s.param_tokens for s in run.stages), sum(s.param_tokens for s in priced)
        note = f" (left at measured cost: {', '.join(unpriced)})" if unpriced else ""
        lines.append(f"  {name:<22} measured {measured_total:.3g} ({_pct(1 - measured_total / measured_base)} saved)"
                     f"   at these sizes {priced_total:.3g} ({_pct(1 - priced_total / priced_base)} saved){note}")
    return lines


def _stage_lines(stages: Sequence[ledger.StageCost]) -> list[str]:
    return ledger.stage_table([s for s in stages if s.items or s.device_seconds])
