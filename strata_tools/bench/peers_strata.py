"""The Strata arms of ``strata bench peers``: the learner fed by Strata's rollout, in a process of its own::

    python -m strata_tools.bench.peers_strata ARM JOB.json RESULT.json WORK_DIR

``ARM`` is ``tiered`` (the stack as it comes: skip, Level-1, escalation to Level-2, the learner on both
tiers' answers), ``tiered-l1`` (the same, the learner on Level-1's answers only: ``train_tiers=1``),
``tiered-sequential`` (``tiered`` with generation and learning taking turns: the driver sends a batch only
once the learner has trained on the one before), ``level1`` (the
scheduler's ``tiering`` off and no escalation: every prompt to Level-1, a plain rollout scored by the
light RM) or ``conventional`` (the same plain rollout with every sample scored by the strong RM: one-model
RLHF at full reward cost, the baseline the article's saving is measured against). The services run
each in a process of its own (``strata_tools.stack.processes``; the job's ``stack="threads"``: all in this one,
``strata_tools.stack.inprocess``) over a Kafka and Redis of their own
(``strata_tools.bench.infra.bench_infra``: free ports, removed after; an external Kafka/Redis from the
settings is used as is: the run's keys and groups are its own, and its cost is the ledger's change over
the run).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from strata import ledger, redis_client
from strata.config import StrataSettings
from strata_tools.bench.infra import bench_infra
from strata_tools.bench.peers_trl import ArmResult, PeersJob, peak_rss_mb
from strata_tools.infra.process import cpu_seconds
from strata_tools.stack.inprocess import InProcessStack, StackOverrides
from strata_tools.stack.processes import ProcessStack
from strata_tools.trace import Trace, read_events, trace
from strata_tools.train import RoundStats, TrainOptions, TrainSummary, train

STRATA_ARMS = ("tiered", "tiered-l1", "tiered-sequential", "level1", "conventional")
TIERED_ARMS = ("tiered", "tiered-l1", "tiered-sequential")
# Arms whose learner trains on other tiers than svc_learner's default train_tiers.
TRAIN_TIERS = {"tiered-l1": "1"}
# Arms whose driver keeps another number of the learner's batches in flight than the default (2: the next
# batch generates while the learner trains on this one). 1: only the batch being learnt from, so generation
# waits for each update and the update for its batch (issue 63: the overlap measured both ways).
MAX_BATCHES_AHEAD = {"tiered-sequential": 1}
# A plain rollout: every prompt to Level-1 (scheduler) and every Level-1 reward final (reward service).
PLAIN_SCHEDULER: dict[str, Any] = {"tiering": False}
PLAIN_REWARD: dict[str, Any] = {"escalation_threshold": -1.0, "escalate_on_caution": False, "flag_unsafe": False,
                                "annotate_level1_share": 0.0, "annotate_level2": False}


def train_tiers(arm: str) -> str:
    """The tiers the arm's learner trains on: its own, else the learner's default (as the stack would run)."""
    from svc_learner.config import LearnerSettings

    return TRAIN_TIERS.get(arm) or LearnerSettings().train_tiers


def train_options(arm: str, job: PeersJob, work: Path) -> TrainOptions:
    """What the arm's driver sends: the job's stream, and the arm's learner batches in flight."""
    return TrainOptions(updates=job.updates, prompts_per_round=job.prompts_per_round, n_samples=job.n_samples,
                        eval_prompts=2, report_dir=work / "reports", seed=job.seed,
                        repeat_share=job.repeat_share, paraphrase_share=job.paraphrase_share,
                        samples_per_update=job.samples_per_update,
                        max_batches_ahead=MAX_BATCHES_AHEAD.get(arm, TrainOptions.max_batches_ahead))


def update_seconds(rounds: Sequence[RoundStats], start_version: int) -> list[float]:
    """Each policy update's share of the rounds' wall time: the seconds since the previous update spread
    evenly over the updates a round completed (rounds run while the learner updates in the background)."""
    out: list[float] = []
    pending, version = 0.0, start_version
    for r in rounds:
        pending += r.seconds
        if r.policy_version > version:
            advanced = r.policy_version - version
            out += [pending / advanced] * advanced
            pending, version = 0.0, r.policy_version
    return out


def arm_overrides(arm: str, job: PeersJob, learner: dict[str, Any]) -> StackOverrides:
    """The stack's settings for ``arm``: its routing, the job's RMs and ``learner``."""
    if arm == "conventional" and not job.strong_rm:
        raise ValueError("the conventional arm needs the job's strong_rm")
    # The conventional arm serves the strong RM where the light one would be: every sample pays its cost,
    # booked with its parameters (svc_reward books what the members it scored with weigh).
    scorer = job.strong_rm if arm == "conventional" else ",".join(job.light_rm)
    plain = arm not in TIERED_ARMS
    strong = {"strong_rm": job.strong_rm} if job.strong_rm else {}
    # rm_watch off: a promotion on an external Kafka must not swap the arm's RM.
    return StackOverrides(scheduler=PLAIN_SCHEDULER if plain else {},
                          reward={"light_rm": scorer, **strong, "rm_watch": False, **(PLAIN_REWARD if plain else {})},
                          learner=learner)


def run_strata(arm: str, job: PeersJob, work: Path) -> ArmResult:
    """Train the zoo's policy through the stack for ``job.updates`` updates under ``arm``'s routing."""
    import torch

    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    if arm not in STRATA_ARMS:
        raise ValueError(f"arm must be one of {', '.join(STRATA_ARMS)}, not {arm!r}")
    torch.set_num_threads(job.service_threads)  # the in-process stack's services (process-wide)
    zoo = ensure_zoo(ZooSettings(), progress=False)
    learner = {"learning_rate": job.learning_rate, "batch_size": job.samples_per_update,
               "minibatch_size": job.minibatch_size, "update_epochs": job.epochs, "kl_coef": job.kl_coef,
               "kl_warmup_updates": 0, "clip_coef": job.clip_coef, "max_grad_norm": job.max_grad_norm,
               "adam_eps": job.adam_eps, "seed": job.seed, "train_tiers": train_tiers(arm)}
    overrides = arm_overrides(arm, job, learner)
    options = train_options(arm, job, work)
    with bench_infra(StrataSettings(), work.name, f"peers-{arm}") as infra:
        client = redis_client.connect(infra.redis_address)
        before = ledger.read_stages(client)
        started = time.time()  # a shared Kafka (tests) holds other runs' events: trace this one's
        services_mb = 0.0
        if job.stack == "threads":
            with InProcessStack.start(infra, zoo, work / "checkpoints", overrides) as stack:
                cpu_before = {"stack": cpu_seconds(os.getpid())}
                summary = train(infra, options, stack.addresses)
                cpu_after = {"stack": cpu_seconds(os.getpid())}
        else:
            with ProcessStack.start(infra, zoo, work / "checkpoints", work / "services", overrides,
                                    threads=job.service_threads) as processes:
                cpu_before = {**processes.cpu_seconds(), "driver": cpu_seconds(os.getpid())}
                summary = train(infra, options, processes.addresses)
                cpu_after = {**processes.cpu_seconds(), "driver": cpu_seconds(os.getpid())}
                services_mb = processes.peak_rss_mb()
        spent = ledger.subtract(ledger.read_stages(client), before)
        client.close()
        path = trace(*read_events(infra, since=started))
    cpu = {name: cpu_after[name] - cpu_before.get(name, 0.0) for name in cpu_after}
    return arm_result(arm, job, work, summary, spent, path, services_mb, cpu)


def arm_result(arm: str, job: PeersJob, work: Path, summary: TrainSummary, spent: Sequence[ledger.StageCost],
               path: Trace, services_mb: float = 0.0, cpu_seconds: dict[str, float] | None = None) -> ArmResult:
    """The arm's figures from its training summary, what the ledger booked and its critical path; its peak
    memory is this process's plus ``services_mb``, the service processes' peaks; ``cpu_seconds``: each
    process's CPU seconds over the training."""
    # A round can complete more updates than asked for; the arm is judged at the version it asked for.
    updates = update_seconds(summary.rounds, summary.start_version)[: job.updates]
    by_stage: dict[str, float] = {}
    for stage in spent:
        by_stage[stage.stage] = by_stage.get(stage.stage, 0.0) + stage.param_tokens
    generation = [s for s in spent if s.stage == "generate"]
    trained = {int(t) for t in train_tiers(arm).split(",")}
    return ArmResult(
        name=f"Strata {arm}",
        update_seconds=updates,
        generation_seconds=[sum(s.device_seconds for s in generation)],
        samples=sum(s.items for s in generation),
        trained_tier_samples=sum(s.items for s in generation if s.tier in trained),
        train_seconds=sum(r.seconds for r in summary.rounds),
        peak_rss_mb=peak_rss_mb() + services_mb,
        param_tokens=sum(s.param_tokens for s in spent),
        rewards=[r.mean_reward for r in summary.rounds if r.mean_reward is not None],
        policy_dir=str(work / "checkpoints" / f"v{summary.start_version + job.updates}"),
        updates_done=summary.end_version - summary.start_version,
        critical_path=path.mean_seconds() if path.updates else {},
        cpu_seconds=cpu_seconds or {},
        ledger_stages=[asdict(s) for s in spent],
        trained_tiers=sorted(trained),
        notes=[path.line(),
               f"{len(summary.rounds)} rounds, policy v{summary.start_version} -> v{summary.end_version}; "
               "decisions " + ", ".join(f"{k}={sum(r.decisions.get(k, 0) for r in summary.rounds)}"
                                        for k in ("skip", "level_1", "level_2")),
               "booked params x tokens: " + ", ".join(f"{stage} {value:.2e}" for stage, value in
                                                      sorted(by_stage.items(), key=lambda kv: -kv[1]) if value)],
    )


def main(argv: Sequence[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m strata_tools.bench.peers_strata ARM JOB.json RESULT.json WORK_DIR", file=sys.stderr)
        return 2
    arm, job, result, work = argv
    run_strata(arm, PeersJob.read(job), Path(work)).write(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
