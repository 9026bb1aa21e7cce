"""Strata beside TRL: the same policy, reward model, prompts and sampling, one after another in one run.

The arms, each in a process of its own (its peak memory is its own) on the same cores:

- ``tiered``: Strata's learner fed by Strata's rollout as it comes (skip, Level-0 + Level-1, escalation
  to Level-2; each service in a process of its own, as deployed, over a Kafka and Redis of their own);
- ``tiered-l1``: the same rollout with the learner training on Level-1's answers only (``train_tiers=1``;
  the stack's default trains on Level-2's too, importance-weighted): what using Level-2's cost buys;
- ``tiered-sequential`` (not in the default arms): ``tiered`` with generation and learning taking turns
  (the driver keeps one learner batch in flight, not two): what overlapping them buys in seconds per
  update, and what it costs in held-out oracle gain (stale samples, importance-weighted);
- ``level1``: the same with every prompt at Level-1 and nothing escalated (the scheduler's ``tiering``
  off): Strata's plain rollout;
- ``conventional``: that plain rollout with every sample scored by the strong RM: what RLHF costs without
  tiers (one policy, the best reward model on every sample; issue 38's fair baseline for the saving);
- ``trl``: TRL's RLOO trainer (the current release has no PPO) on the same Level-1 policy, rewarded by the
  same light RM (its expected score over the score bins, as svc_reward serves it), on the same prompt
  stream with the same directions line, sampling, batch shape, learning rate and KL coefficient.

TRL runs in one process with ``--threads`` torch threads. Strata's services run at once (the generators
write the next batch while the learner trains), so each gets ``--service-threads``: by default half the
threads, so that the learner and a generator each have their own cores. More threads than cores makes
the OpenMP teams spin against each other (docs/performance.md, *Threads on a shared CPU*).

Then every trained policy and the starting one answer the same held-out prompts with the same seed,
judged by the light RM and the oracle: the paired gain per prompt, with its standard error. Per arm: wall
seconds per update (median, the first update left out as warm-up), generation's share of the training
time, samples per second, peak resident memory, booked cost (params x tokens: generation and every RM
call, plus Strata's probe and encoder), the reward per update. docs/performance.md lists what still
differs between the arms. Last line::

    peers strata_s_per_update= trl_s_per_update= ratio= strata_oracle_gain= strata_oracle_gain_se=
      trl_oracle_gain= cost_per_used_sample_ratio= gain_per_cost_ratio= hacking_gap= generated_per_used=
      plain_over_trl= tiered_over_trl= overlap_speedup= cpu_floor= critical_path=

(``strata``: the ``tiered`` arm; ``ratio``: TRL's seconds per update over Strata's, and ``*_over_trl``
Strata's plain (``level1``) and tiered arms' over TRL's, when they ran; the cost and gain ratios: tiered
over conventional; ``cpu_floor``: per arm, the CPU seconds its processes spent per update over the cores:
no schedule of that work updates faster on this machine.) With ``--seeds N`` the last line starts
``peers seeds=N``, gives means with between-seed SEs (``_se``), ``tiered_minus_conventional=``,
``tiered_minus_tiered_l1=`` when both arms ran, the largest ``generated_per_used`` of any seed and the
stage largest in most seeds. ``--project-as SIZES`` adds, per Strata arm, its measured work (the ledger's
tokens, the trace's plumbing) as seconds per update at those sizes on one GPU per service, with and
without overlap (``strata_tools.projection``: a labelled projection, not a measurement).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from strata.errors import CliError
from strata.ledger import StageCost
from strata_tools.bench.peers_trl import INSTALL_HINT, ArmResult, PeersJob
from strata_tools.level1 import LivePrompting, generate_answers, probe_prompts
from strata_tools.pricing import PriceAs, parse_price_as
from strata_tools.projection import CONTROL_PROCESSES, GPUS, Assumptions, UpdateWork, projection_lines
from strata_tools.rm.ensemble import check_given_rms
from strata_tools.stack.spec import cores_here
from strata_tools.task.oracle import oracle_score
from strata_tools.train import TrainOptions
from strata_tools.train_stream import held_out_records, prompt_rounds
from strata_tools.train_summary import Change, paired_change

if TYPE_CHECKING:
    from strata.models.loading import LoadedModel
    from strata_tools.task.suite import PromptRecord
    from strata_tools.zoo.build import ZooPaths

ARMS = ("tiered", "tiered-l1", "tiered-sequential", "level1", "conventional", "trl")
DEFAULT_ARMS = ("tiered", "tiered-l1", "level1", "conventional", "trl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help=f"comma-separated, from {', '.join(ARMS)} (default: all but tiered-sequential)")
    parser.add_argument("--updates", type=int, default=8, help="policy updates per arm")
    parser.add_argument("--samples-per-update", type=int, default=32, help="rollouts per update (the learner's "
                        "batch_size; TRL's generation batch)")
    parser.add_argument("--n-samples", type=int, default=2, help="rollouts per prompt (RLOO needs >= 2)")
    parser.add_argument("--minibatch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4, help="passes over each update's rollouts")
    parser.add_argument("--learning-rate", type=float, default=1e-4, help="the demo's recipe (docs/learner.md)")
    parser.add_argument("--kl-coef", type=float, default=0.2, help="KL coefficient (Strata's kl_coef, TRL's beta)")
    parser.add_argument("--repeat-share", type=float, default=0.25)
    parser.add_argument("--paraphrase-share", type=float, default=0.25)
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts judged before and after")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="run the whole comparison this many times, seeds "
                        "--seed, --seed+1, ...: a new prompt stream, sampling and held-out draw each time. One run "
                        "of one seed says nothing of training's own variance; the last line then gives the "
                        "means over seeds with their between-seed standard errors")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of TRL's arm, "
                        "and what Strata's services share")
    parser.add_argument("--service-threads", type=int, default=0, help="torch threads of each Strata service "
                        "(0: half of --threads, at least 1: the learner and a generator run at once)")
    parser.add_argument("--stack", choices=("processes", "threads"), default="processes",
                        help="Strata's services each in a process of their own, as deployed, or all in one "
                        "(one interpreter lock: for comparison)")
    parser.add_argument("--light-rm", type=Path, default=None, help="the light RM every arm but conventional is "
                        "rewarded by, TRL's included (default: the zoo's)")
    parser.add_argument("--strong-rm", type=Path, default=None, help="the strong RM: Level-2's and the audits' judge "
                        "and the conventional arm's reward; one directory or an ensemble (`strata rm ensemble`; "
                        "default: the zoo's)")
    parser.add_argument("--project-as", action="append", default=[], metavar="SIZES",
                        help="also project each Strata arm's seconds per update at these model sizes on GPUs, one "
                        "per service, with and without overlap (a labelled projection of the measured work: "
                        "a preset (article, deployment) or role=params pairs; docs/performance.md); repeatable")
    parser.add_argument("--project-gpu", choices=sorted(GPUS), default="h100",
                        help="the GPU of --project-as (published throughput; default h100)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the arms' models, logs and results here "
                        "(default: a temporary directory, removed after)")


@dataclass(frozen=True)
class Judged:
    """One policy's answers to the held-out prompts: light-RM reward and oracle score per prompt."""

    rewards: list[float]
    oracle: list[float]


def check_arguments(args: argparse.Namespace) -> list[str]:
    """The arms asked for, or a ``CliError`` naming the flag to fix, before anything loads."""
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or any(a not in ARMS for a in arms):
        raise CliError(f"--arms: choose from {', '.join(ARMS)} (got {args.arms!r})")
    if args.updates < 1 or args.eval_prompts < 2 or args.epochs < 1 or args.threads < 1 or args.seeds < 1:
        raise CliError("--updates, --epochs, --threads and --seeds must be >= 1 and --eval-prompts >= 2")
    if args.service_threads < 0:
        raise CliError("--service-threads must be >= 0 (0: half of --threads)")
    if args.n_samples < 2:
        raise CliError("--n-samples must be >= 2 (RLOO's baseline is the other samples of the same prompt)")
    if args.samples_per_update % args.minibatch_size or args.samples_per_update % args.n_samples:
        raise CliError("--samples-per-update must be a multiple of --minibatch-size and of --n-samples")
    if "trl" in arms and importlib.util.find_spec("trl") is None:
        raise CliError(f"TRL is not installed: {INSTALL_HINT}")
    check_given_rms(args.light_rm, args.strong_rm)
    for sizes in args.project_as:
        try:
            parse_price_as(sizes)
        except ValueError as exc:
            raise CliError(str(exc).replace("--price-as", "--project-as")) from None
    return arms


def projected(results: dict[str, ArmResult], price: PriceAs, assume: Assumptions) -> list[str]:
    """Each Strata arm's measured work (ledger and trace) as seconds per update at ``price``'s sizes."""
    lines = [f"{price.describe()}, on {assume.gpu.name} ({assume.gpu.source}); plumbing as measured here"]
    for arm, result in results.items():
        if not result.ledger_stages or not result.updates:
            continue
        control = {name: s for name, s in result.cpu_per_update.items() if name in CONTROL_PROCESSES}
        work = UpdateWork([StageCost(**s) for s in result.ledger_stages], result.updates,
                          frozenset(result.trained_tiers), result.critical_path, control)
        lines += projection_lines(arm, work, price, assume)
    return lines


def served_directions(zoo: ZooPaths, prompts: Sequence[str]) -> list[list[str]]:
    """The directions line the stack forwards with each prompt (``strata_tools.level1``)."""
    prompting = LivePrompting.live(1)
    return [list(prompting.directions(r)) for r in probe_prompts(zoo.probe, prompts)]


def service_threads(threads: int, asked: int = 0) -> int:
    """Each Strata service's torch threads: ``asked``, or half of ``threads`` (the learner and a generator
    work at once), at least 1."""
    return asked or max(1, threads // 2)


def build_job(args: argparse.Namespace, zoo: ZooPaths, work: Path) -> PeersJob:
    """The one recipe every arm trains with: the prompt stream Strata's rounds send, taken in order."""
    from svc_learner.config import LearnerSettings
    from svc_reward.config import RewardSettings

    # Strata's rounds send one update's worth of prompts, so that a round completes one update (skips and
    # escalations aside) and the arm stops near the updates asked for.
    prompts_per_round = args.samples_per_update // args.n_samples
    options = TrainOptions(prompts_per_round=prompts_per_round, seed=args.seed,
                           repeat_share=args.repeat_share, paraphrase_share=args.paraphrase_share)
    needed = args.updates * args.samples_per_update // args.n_samples
    rounds = prompt_rounds(options)
    prompts: list[str] = []
    while len(prompts) < needed:
        prompts += [r.text for r in next(rounds)]
    prompts = prompts[:needed]
    sampling = LivePrompting.live(1).sampling
    learner = LearnerSettings()
    return PeersJob(
        policy_dir=str(zoo.policy), light_rm=[str(args.light_rm or zoo.light_rm)],
        strong_rm=str(args.strong_rm or zoo.strong_rm), prompts=prompts,
        directions=served_directions(zoo, prompts), prompts_per_round=prompts_per_round,
        repeat_share=args.repeat_share, paraphrase_share=args.paraphrase_share, updates=args.updates,
        samples_per_update=args.samples_per_update, n_samples=args.n_samples, minibatch_size=args.minibatch_size,
        epochs=args.epochs, learning_rate=args.learning_rate, kl_coef=args.kl_coef, clip_coef=learner.clip_coef,
        max_grad_norm=learner.max_grad_norm, adam_eps=learner.adam_eps, temperature=sampling.temperature,
        top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens, rm_max_length=RewardSettings().max_length,
        seed=args.seed, threads=args.threads, out_dir=str(work / "trl" / "policy"), stack=args.stack,
        service_threads=service_threads(args.threads, args.service_threads),
    )


def run_arm(arm: str, job_path: Path, work: Path) -> ArmResult:
    """One arm in its own process; its output goes to ``work/<arm>/log``, shown when it fails."""
    arm_dir = work / arm
    arm_dir.mkdir(parents=True, exist_ok=True)
    result = arm_dir / "result.json"
    if arm == "trl":
        argv = [sys.executable, "-m", "strata_tools.bench.peers_trl", str(job_path), str(result)]
    else:
        argv = [sys.executable, "-m", "strata_tools.bench.peers_strata", arm, str(job_path), str(result), str(arm_dir)]
    log = arm_dir / "log"
    with log.open("wb") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise CliError(f"the {arm} arm failed (exit {done.returncode}); the end of {log}:\n{tail}")
    return ArmResult.read(result)


def judge(policy_dir: str | Path, records: Sequence[PromptRecord], directions: Sequence[Sequence[str]],
          job: PeersJob, light_rm: Sequence[LoadedModel]) -> Judged:
    """The policy's answers to ``records``, prompted as live Level-1 (``strata_tools.level1``, one seed for all
    policies), scored by the light RM (mean over members) and the oracle."""
    from strata.models.reward import score_responses
    from svc_generator.backends.hf import HfBackend

    texts = [r.text for r in records]
    answers = [g.text for g in generate_answers(HfBackend(str(policy_dir), "cpu"), LivePrompting.live(1), texts,
                                                directions, seed=job.seed + 1)]
    per_member = [score_responses(rm, texts, answers, max_length=job.rm_max_length) for rm in light_rm]
    rewards = [sum(scores) / len(scores) for scores in zip(*per_member, strict=True)]
    return Judged(rewards, [oracle_score(r, a) for r, a in zip(records, answers, strict=True)])


def _fmt(value: float, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_report(results: dict[str, ArmResult], gains: dict[str, tuple[Change, Change]], job: PeersJob) -> None:
    print(f"  {len(job.prompts)} training prompts, {job.updates} updates of {job.samples_per_update} rollouts "
          f"({job.n_samples} per prompt), {job.epochs} epochs in minibatches of {job.minibatch_size}, lr "
          f"{job.learning_rate:g}, KL {job.kl_coef:g}, T {job.temperature:g} top-p {job.top_p:g}; TRL "
          f"{job.threads} threads, Strata's services {job.stack} of {job.service_threads}; s/update: median, the "
          "first update left out")
    print(f"  {'arm':<18} {'s/update':>8} {'gen share':>9} {'samples/s':>9} {'peak MB':>8} {'params x tokens':>15} "
          f"{'reward 1st->last':>16} {'held-out RM gain':>17} {'oracle gain':>16}")
    for arm, r in results.items():
        reward = f"{r.rewards[0]:.2f} -> {r.rewards[-1]:.2f}" if r.rewards else "-"
        rm_gain, oracle_gain = gains[arm]
        print(f"  {r.name:<18} {_fmt(r.seconds_per_update(), '8.2f')} {_fmt(r.generation_share, '9.1%')} "
              f"{_fmt(r.samples_per_second, '9.1f')} {r.peak_rss_mb:8.0f} {r.param_tokens:15.3e} {reward:>16} "
              f"{rm_gain.mean:+8.3f} ± {rm_gain.stderr:.3f} {oracle_gain.mean:+7.3f} ± {oracle_gain.stderr:.3f}")
        for note in r.notes:
            print(f"  {'':<18} {note}")
        if r.cpu_seconds:
            print(f"  {'':<18} {cpu_line(r, cores_here())}")


def cpu_floor(arm: ArmResult, cores: int) -> float:
    """The fewest wall seconds an update can take on ``cores`` cores doing the CPU work the arm did per update."""
    per_update = arm.cpu_per_update
    return sum(per_update.values()) / cores if per_update else float("nan")


def cpu_line(arm: ArmResult, cores: int) -> str:
    """The arm's CPU seconds per update by process, and the floor they put under an update on these cores."""
    per_update = sorted(arm.cpu_per_update.items(), key=lambda item: -item[1])
    total = sum(seconds for _, seconds in per_update)
    return (f"CPU seconds per update: {', '.join(f'{name} {seconds:.2f}' for name, seconds in per_update)}; "
            f"{total:.2f} in all: on {cores} cores no update under {total / cores:.2f} s")


def used_samples(arm: ArmResult, samples_per_update: int) -> int:
    """Samples the arm's learner consumed: a full batch per update it made (TRL generates what it uses)."""
    return arm.updates_done * samples_per_update if arm.updates_done else arm.samples


def cost_per_used_sample(arm: ArmResult, samples_per_update: int) -> float:
    """Booked params x tokens per sample the learner consumed: rollouts generated and never trained on
    (the driver's surplus, skipped-for-staleness samples) are cost without a use."""
    used = used_samples(arm, samples_per_update)
    return arm.param_tokens / used if used and arm.param_tokens else float("nan")


def generated_per_used(arm: ArmResult, samples_per_update: int) -> float:
    """Rollouts of the trained tiers generated per sample the learner used: the driver's surplus (Level-2's
    samples, which the learner does not train on under train_tiers=1, are cost booked apart, not surplus)."""
    used = used_samples(arm, samples_per_update)
    generated = arm.samples if arm.trained_tier_samples is None else arm.trained_tier_samples
    return generated / used if used else float("nan")


def tiered_cost_ratio(results: dict[str, ArmResult], samples_per_update: int) -> float:
    """The tiered arm's cost per used sample as a share of the conventional arm's."""
    return (cost_per_used_sample(results["tiered"], samples_per_update)
            / cost_per_used_sample(results["conventional"], samples_per_update))


def against_conventional(results: dict[str, ArmResult], judged: dict[str, Judged], samples_per_update: int,
                         families: Sequence[str] | None = None) -> list[str]:
    """The tiered arm beside the conventional one (R27's training headline): its booked cost per sample the
    learner used as a share of the conventional arm's, and the two trained policies' held-out oracle
    scores, paired per prompt (SE clustered by paraphrase family when ``families`` is given)."""
    if "tiered" not in results or "conventional" not in results:
        return []
    share = tiered_cost_ratio(results, samples_per_update)
    difference = paired_change(judged["conventional"].oracle, judged["tiered"].oracle, families)
    return [f"  tiered against conventional (strong RM on every sample): params x tokens per sample the learner "
            f"used {share:.2f} of its cost; trained policies' held-out oracle, tiered minus conventional "
            f"{difference.mean:+.3f} ± {difference.stderr:.3f} (paired over {difference.n} prompts, SE clustered "
            f"by their {difference.clusters or difference.n} families)"]


def overlap_speedup(results: dict[str, ArmResult]) -> float:
    """The sequential arm's seconds per update over the overlapped (tiered) arm's: how many times as fast an
    update is with generation and learning overlapped (nan without a time to divide by)."""
    overlapped, sequential = results["tiered"].seconds_per_update(), results["tiered-sequential"].seconds_per_update()
    return sequential / overlapped if overlapped and not math.isnan(overlapped) else float("nan")


def against_sequential(results: dict[str, ArmResult], judged: dict[str, Judged],
                       families: Sequence[str] | None = None) -> list[str]:
    """The tiered arm beside the same stack with generation and learning taking turns (issue 63): seconds per
    update of each, and the two trained policies' held-out oracle scores, paired per prompt."""
    if "tiered" not in results or "tiered-sequential" not in results:
        return []
    overlapped, sequential = results["tiered"].seconds_per_update(), results["tiered-sequential"].seconds_per_update()
    difference = paired_change(judged["tiered-sequential"].oracle, judged["tiered"].oracle, families)
    return [f"  overlap (tiered against tiered-sequential): {overlapped:.2f} s an update against {sequential:.2f} "
            f"({overlap_speedup(results):.2f}x as fast); trained policies' held-out oracle, tiered minus sequential "
            f"{difference.mean:+.3f} ± {difference.stderr:.3f} (paired over {difference.n} prompts, SE clustered "
            f"by their {difference.clusters or difference.n} families)"]


def gain_per_cost(arm: ArmResult, oracle_gain: float, job: PeersJob) -> float:
    """Held-out oracle gain per params x tokens of the rollouts the judged updates used."""
    return oracle_gain / (cost_per_used_sample(arm, job.samples_per_update) * job.updates * job.samples_per_update)


def over_trl(seconds: dict[str, float]) -> str:
    """Strata's plain (``level1``) and tiered seconds per update over TRL's, for the arms that ran (issue 63's
    targets: plain <= 1.0, tiered <= 1.3 on the ci zoo)."""
    if "trl" not in seconds or not seconds["trl"] or math.isnan(seconds["trl"]):
        return ""
    fields = {"plain_over_trl": "level1", "tiered_over_trl": "tiered"}
    return "".join(f" {key}={seconds[arm] / seconds['trl']:.2f}" for key, arm in fields.items() if arm in seconds)


def last_line(results: dict[str, ArmResult], gains: dict[str, tuple[Change, Change]], job: PeersJob) -> str:
    strata = next((a for a in ("tiered", "tiered-l1", "level1") if a in results), None)
    strata_s = results[strata].seconds_per_update() if strata else float("nan")
    trl_s = results["trl"].seconds_per_update() if "trl" in results else float("nan")
    ratio = trl_s / strata_s if strata_s and not math.isnan(strata_s) else float("nan")
    strata_gain = gains[strata][1] if strata else None
    trl_gain = gains["trl"][1].mean if "trl" in gains else float("nan")
    line = (f"peers strata_s_per_update={strata_s:.2f} trl_s_per_update={trl_s:.2f} ratio={ratio:.2f} "
            f"strata_oracle_gain={strata_gain.mean if strata_gain else float('nan'):+.3f} "
            f"strata_oracle_gain_se={strata_gain.stderr if strata_gain else float('nan'):.3f} "
            f"trl_oracle_gain={trl_gain:+.3f}")
    if "tiered" in results and "conventional" in results:
        cost_ratio = tiered_cost_ratio(results, job.samples_per_update)
        conventional_gain = gain_per_cost(results["conventional"], gains["conventional"][1].mean, job)
        gain_ratio = gain_per_cost(results["tiered"], gains["tiered"][1].mean, job) / conventional_gain \
            if conventional_gain > 0 else float("nan")  # a ratio to a baseline that gained nothing says nothing
        line += f" cost_per_used_sample_ratio={cost_ratio:.2f} gain_per_cost_ratio={gain_ratio:.2f}"
    hacking = ",".join(f"{arm}:{rm.mean - oracle.mean:+.3f}" for arm, (rm, oracle) in gains.items())
    per_used = ",".join(f"{arm}:{generated_per_used(r, job.samples_per_update):.2f}" for arm, r in results.items())
    line += f" hacking_gap={hacking} generated_per_used={per_used}"
    line += over_trl({arm: r.seconds_per_update() for arm, r in results.items()})
    if "tiered" in results and "tiered-sequential" in results:
        line += f" overlap_speedup={overlap_speedup(results):.2f}"
    floors = ",".join(f"{arm}:{cpu_floor(r, cores_here()):.2f}" for arm, r in results.items() if r.cpu_seconds)
    line += f" cpu_floor={floors}" if floors else ""
    critical = ",".join(f"{arm}:{max(r.critical_path, key=lambda s: r.critical_path[s])}"
                        for arm, r in results.items() if r.critical_path)
    return line + (f" critical_path={critical}" if critical else "")


@dataclass(frozen=True)
class SeedRun:
    """One whole comparison under one seed."""

    seed: int
    job: PeersJob
    results: dict[str, ArmResult]
    gains: dict[str, tuple[Change, Change]]  # arm -> (held-out light-RM gain, oracle gain)
    judged: dict[str, Judged]
    families: list[str]


def run_seed(args: argparse.Namespace, arms: Sequence[str], zoo: ZooPaths, work: Path, seed: int) -> SeedRun:
    """Train every arm on ``seed``'s prompt stream and judge them on ``seed``'s held-out draw."""
    from strata.models.loading import load_reward_model

    work.mkdir(parents=True, exist_ok=True)
    job = build_job(argparse.Namespace(**{**vars(args), "seed": seed}), zoo, work)
    job_path = work / "job.json"
    job.write(job_path)
    results: dict[str, ArmResult] = {}
    for arm in arms:
        arm_started = time.monotonic()
        print(f"  [{arm}] training (seed {seed}) ...", flush=True)
        results[arm] = run_arm(arm, job_path, work)
        print(f"  [{arm}] done in {time.monotonic() - arm_started:.0f} s", flush=True)
    records = held_out_records(args.eval_prompts, seed)
    directions = served_directions(zoo, [r.text for r in records])
    light_rm = [load_reward_model(d, device="cpu") for d in job.light_rm]
    print(f"  judging {len(arms) + 1} policies on {len(records)} held-out prompts ...", flush=True)
    before = judge(job.policy_dir, records, directions, job, light_rm)
    gains, judged = {}, {}
    families = [r.family for r in records]
    for arm, result in results.items():
        judged[arm] = after = judge(result.policy_dir, records, directions, job, light_rm)
        gains[arm] = (paired_change(before.rewards, after.rewards, families),
                      paired_change(before.oracle, after.oracle, families))
    return SeedRun(seed, job, results, gains, judged, families)


def _mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean over seeds and its between-seed standard error (nan with one seed)."""
    if len(values) < 2:
        return statistics.fmean(values), float("nan")
    # By hand: statistics.stdev raises on nan (an arm with no timed update), where a nan SE says it.
    mean = statistics.fmean(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance / len(values))


@dataclass(frozen=True)
class AcrossSeeds:
    """The seeds' figures together, each a (mean, between-seed SE)."""

    seeds: list[int]
    oracle: dict[str, tuple[float, float]]  # arm -> held-out oracle gain
    light: dict[str, tuple[float, float]]  # arm -> held-out light-RM gain
    gap: dict[str, tuple[float, float]]  # arm -> hacking gap (light-RM gain minus oracle gain)
    versus: tuple[tuple[float, float], tuple[float, float]] | None  # tiered minus conventional oracle; cost ratio
    gain_per_cost_ratio: float  # tiered's mean oracle gain per mean cost over conventional's (nan: no such pair)
    train_level2: tuple[float, float] | None  # tiered minus tiered-l1, held-out oracle (train_tiers both ways)
    level1_only_cost: tuple[float, float] | None  # tiered-l1's cost per used sample over conventional's
    # tiered minus tiered-sequential, held-out oracle; tiered-sequential's seconds per update over tiered's
    overlap: tuple[tuple[float, float], tuple[float, float]] | None
    generated_per_used: dict[str, float]  # arm -> the most over seeds (the bound holds in every run or not)
    critical_path: dict[str, str]  # arm -> the stage that was largest in the most seeds


def across_seeds(runs: Sequence[SeedRun]) -> AcrossSeeds:
    """Per arm the gains and the hacking gap, and tiered against conventional, as means over seeds with their
    between-seed SEs: the run-to-run spread is training's own variance, which one seed's SE omits."""
    arms = list(runs[0].results)
    oracle = {arm: _mean_se([r.gains[arm][1].mean for r in runs]) for arm in arms}
    versus, gain_ratio, train_level2 = None, float("nan"), None
    if "tiered" in arms and "conventional" in arms:
        versus = (_mean_se([paired_change(r.judged["conventional"].oracle, r.judged["tiered"].oracle).mean
                            for r in runs]),
                  _mean_se([tiered_cost_ratio(r.results, r.job.samples_per_update) for r in runs]))
        # A ratio of means: one seed's baseline can gain nothing, which a mean of per-seed ratios cannot take.
        if oracle["conventional"][0] > 0:
            gain_ratio = oracle["tiered"][0] / oracle["conventional"][0] / versus[1][0]
    level1_only_cost = None
    if "tiered" in arms and "tiered-l1" in arms:
        train_level2 = _mean_se([paired_change(r.judged["tiered-l1"].oracle, r.judged["tiered"].oracle).mean
                                 for r in runs])
    if "tiered-l1" in arms and "conventional" in arms:
        level1_only_cost = _mean_se([cost_per_used_sample(r.results["tiered-l1"], r.job.samples_per_update)
                                     / cost_per_used_sample(r.results["conventional"], r.job.samples_per_update)
                                     for r in runs])
    overlap = None
    if "tiered" in arms and "tiered-sequential" in arms:
        overlap = (_mean_se([paired_change(r.judged["tiered-sequential"].oracle, r.judged["tiered"].oracle).mean
                             for r in runs]),
                   _mean_se([overlap_speedup(r.results) for r in runs]))
    critical: dict[str, str] = {}
    for arm in arms:
        largest = [max(path, key=path.__getitem__) for r in runs if (path := r.results[arm].critical_path)]
        if largest:
            critical[arm] = statistics.mode(largest)
    return AcrossSeeds(
        [r.seed for r in runs], oracle,
        {arm: _mean_se([r.gains[arm][0].mean for r in runs]) for arm in arms},
        {arm: _mean_se([r.gains[arm][0].mean - r.gains[arm][1].mean for r in runs]) for arm in arms},
        versus, gain_ratio, train_level2, level1_only_cost, overlap,
        {arm: max(generated_per_used(r.results[arm], r.job.samples_per_update) for r in runs) for arm in arms},
        critical,
    )


def over_seeds(runs: Sequence[SeedRun]) -> list[str]:
    """What the seeds say together (:func:`across_seeds`), a line per arm and one for tiered against
    conventional."""
    together = across_seeds(runs)
    lines = [f"  over {len(runs)} seeds ({', '.join(str(s) for s in together.seeds)}): mean ± between-seed SE"]
    for arm, oracle in together.oracle.items():
        light, gap = together.light[arm], together.gap[arm]
        per_seed = ", ".join(f"{r.gains[arm][1].mean:+.3f}" for r in runs)
        lines.append(f"    {arm:<14} oracle gain {oracle[0]:+.3f} ± {oracle[1]:.3f} (per seed {per_seed}); "
                     f"light-RM gain {light[0]:+.3f} ± {light[1]:.3f}; hacking gap {gap[0]:+.3f} ± {gap[1]:.3f}")
    if together.versus is not None:
        diff, cost = together.versus
        lines.append(f"    tiered minus conventional, held-out oracle {diff[0]:+.3f} ± {diff[1]:.3f}; cost per used "
                     f"sample {cost[0]:.2f} ± {cost[1]:.2f} of the conventional arm's")
    if together.train_level2 is not None:
        mean, se = together.train_level2
        lines.append(f"    training on Level-2's answers too (tiered minus tiered-l1), held-out oracle "
                     f"{mean:+.3f} ± {se:.3f}")
    if together.level1_only_cost is not None:
        mean, se = together.level1_only_cost
        lines.append(f"    tiered-l1 cost per used sample {mean:.2f} ± {se:.2f} of the conventional arm's")
    if together.overlap is not None:
        (oracle_diff, oracle_se), (speedup, speedup_se) = together.overlap
        lines.append(f"    overlap (tiered against tiered-sequential): {speedup:.2f} ± {speedup_se:.2f} times as "
                     f"fast an update; held-out oracle, tiered minus sequential {oracle_diff:+.3f} ± {oracle_se:.3f}")
    lines.append("    generated per used sample, the most over seeds: "
                 + ", ".join(f"{arm} {value:.2f}" for arm, value in together.generated_per_used.items()))
    return lines


def seeds_line(runs: Sequence[SeedRun]) -> str:
    """The last line over several seeds: means, between-seed SEs, and the peers line's other fields."""
    together = across_seeds(runs)
    arms = list(runs[0].results)
    strata = next((a for a in ("tiered", "tiered-l1", "level1") if a in arms), None)
    seconds = _mean_se([r.results[strata].seconds_per_update() for r in runs])[0] if strata else float("nan")
    trl = _mean_se([r.results["trl"].seconds_per_update() for r in runs])[0] if "trl" in arms else float("nan")
    line = (f"peers seeds={len(runs)} strata_s_per_update={seconds:.2f} trl_s_per_update={trl:.2f} "
            f"ratio={trl / seconds if seconds else float('nan'):.2f}")
    if strata:
        gain = together.oracle[strata]
        line += f" strata_oracle_gain={gain[0]:+.3f} strata_oracle_gain_se={gain[1]:.3f}"
    if "trl" in arms:
        line += f" trl_oracle_gain={together.oracle['trl'][0]:+.3f} trl_oracle_gain_se={together.oracle['trl'][1]:.3f}"
    if together.versus is not None:
        diff, cost = together.versus
        line += (f" tiered_minus_conventional={diff[0]:+.3f} tiered_minus_conventional_se={diff[1]:.3f}"
                 f" cost_per_used_sample_ratio={cost[0]:.2f} gain_per_cost_ratio={together.gain_per_cost_ratio:.2f}")
    if together.train_level2 is not None:
        line += (f" tiered_minus_tiered_l1={together.train_level2[0]:+.3f}"
                 f" tiered_minus_tiered_l1_se={together.train_level2[1]:.3f}")
    if together.overlap is not None:
        oracle_diff, oracle_se = together.overlap[0]
        line += f" tiered_minus_sequential={oracle_diff:+.3f} tiered_minus_sequential_se={oracle_se:.3f}"
    line += " hacking_gap=" + ",".join(f"{arm}:{gap[0]:+.3f}" for arm, gap in together.gap.items())
    line += " generated_per_used=" + ",".join(f"{arm}:{v:.2f}" for arm, v in together.generated_per_used.items())
    line += over_trl({arm: _mean_se([r.results[arm].seconds_per_update() for r in runs])[0] for arm in arms})
    if together.overlap is not None:
        line += f" overlap_speedup={together.overlap[1][0]:.2f}"
    floors = ",".join(f"{arm}:{_mean_se([cpu_floor(r.results[arm], cores_here()) for r in runs])[0]:.2f}"
                      for arm in arms if all(r.results[arm].cpu_seconds for r in runs))
    line += f" cpu_floor={floors}" if floors else ""
    critical = ",".join(f"{arm}:{stage}" for arm, stage in together.critical_path.items())
    return line + (f" critical_path={critical}" if critical else "")


def run(args: argparse.Namespace) -> int:
    arms = check_arguments(args)
    os.environ.setdefault("STRATA_ZOO_PRESET", "ci")
    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    started = time.monotonic()
    zoo = ensure_zoo(ZooSettings())
    runs: list[SeedRun] = []
    with tempfile.TemporaryDirectory(prefix="strata-peers-") as scratch:
        work = args.work_dir or Path(scratch)
        print(f"peers: zoo {zoo.root.name}, arms {', '.join(arms)}, seeds {args.seed}..{args.seed + args.seeds - 1}; "
              f"work in {work}", flush=True)
        for seed in range(args.seed, args.seed + args.seeds):
            seed_work = work if args.seeds == 1 else work / f"seed-{seed}"
            one = run_seed(args, arms, zoo, seed_work, seed)
            runs.append(one)
            if args.seeds > 1:
                print(f"  seed {seed}:")
            print_report(one.results, one.gains, one.job)
            for line in against_conventional(one.results, one.judged, one.job.samples_per_update, one.families):
                print(line)
            for line in against_sequential(one.results, one.judged, one.families):
                print(line)
            for sizes in args.project_as:
                for line in projected(one.results, parse_price_as(sizes), Assumptions(GPUS[args.project_gpu])):
                    print(line)
            if args.seeds > 1:
                print("  " + last_line(one.results, one.gains, one.job), flush=True)
    print(f"  {time.monotonic() - started:.0f} s in all")
    if len(runs) == 1:
        print(last_line(runs[0].results, runs[0].gains, runs[0].job))
        return 0
    for line in over_seeds(runs):
        print(line)
    print(seeds_line(runs))
    return 0
