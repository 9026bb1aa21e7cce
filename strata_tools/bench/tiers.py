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

With ``--label-share S`` a desk runs too (svc_annotation, two simulated annotators: the oracle with noise)
and the reward service sends it a share ``S`` of Level-1 answers: their scores build the scheduler's
record of each neighbourhood (issue 61), and the escalation rule on it, fitted first as
``strata calibrate rule --record-rounds --label-share S`` fits it on the calibration split, is served
with the light RM. Only prompts the scheduler routes carry a record (the skip arm and the epoch
stream); the other arms' answers are decided by the threshold, as before.

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
import random
import shutil
import statistics
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata import ledger, redis_client
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.errors import CliError
from strata.hashing import content_hash
from strata_tools.bench.infra import bench_infra
from strata_tools.bench.tiers_epochs import (
    Audits,
    epoch_arm,
    epoch_figures,
    epoch_lines,
    epoch_order,
    in_order_of,
    settled_audits,
)
from strata_tools.level1 import LivePrompting, generate_answers, probe_prompts
from strata_tools.pricing import parse_price_as
from strata_tools.rm.ensemble import check_given_rms
from strata_tools.rm.escalation import (
    RecordHistory,
    ServedThreshold,
    add_threshold_arguments,
    resolve_threshold,
    serve_record_rule,
)
from strata_tools.task.oracle import SimulatedAnnotator, oracle_score
from strata_tools.task.suite import SEALED_SPLIT, load_suite, stratified_sample
from strata_tools.tiering import tier_eval
from strata_tools.tiering.answers import Answers, answers_of, baseline_figures, live_figures
from strata_tools.tiering.arms import ArmRun, LiveTiers
from strata_tools.tiering.headline import (
    HEADLINE_ARM,
    SweepFigures,
    apgr_interval,
    escalation_auc,
    expected_replay,
    headline_intervals,
    headline_line,
    num,
    pct,
    sweep_figures,
)
from strata_tools.tiering.lines import arm_table, price_lines, routing_lines, stage_lines, threshold_lines
from strata_tools.tiering.tier_eval import ArmFigures, PromptOutcome
from svc_reward.calibration_store import rule_path

log = logging.getLogger(__name__)

# The article's figures for its tiered rollout against everything on the large model (docs/tiers.md).
ARTICLE = {"saving": 0.64, "quality_ratio": 1.053, "bad_case_catch": 0.92, "level2_share": 0.07}
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
    parser.add_argument("--label-share", type=float, default=None, metavar="SHARE",
                        help="run a desk of simulated annotators scoring this share of Level-1 answers (the reward "
                             "service's annotate_level1_share) and serve the escalation rule on the neighbourhood's "
                             "record they build (fitted first on --calibration-split); default: no desk, the "
                             "threshold alone")
    parser.add_argument("--record-rounds", type=int, default=3,
                        help="with --label-share: earlier rounds of Level-1 answers behind each record the rule is "
                             "fitted on (`strata calibrate rule --record-rounds`)")
    parser.add_argument("--expected-samples", type=int, default=EXPECTED_SAMPLES,
                        help="answers per prompt and tier behind the router's expected-quality figures (sweep, "
                             "ceiling, APGR); sampled as live, apart from the live arms")
    parser.add_argument("--seed", type=int, default=0, help="prompt sample and sampling seeds")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds an arm may take")
    parser.add_argument("--price-as", default=None, metavar="SIZES",
                        help="also print the arms' params x tokens at these model sizes, a labelled projection of "
                             "the same measured work: a preset (article, deployment) or role=params pairs "
                             "(strata report --help)")
    parser.add_argument("--light-rm", type=Path, default=None, help="the light RM to route with instead of the "
                        "zoo's (its escalation threshold is calibrated here as the zoo's would be)")
    parser.add_argument("--strong-rm", type=Path, default=None, help="the strong RM to judge Level-2 with instead "
                        "of the zoo's: one directory or an ensemble (`strata rm ensemble`)")
    parser.add_argument("--out", type=Path, default=None, help="directory for tiers.json and tiers.png "
                        "(default: <state dir>/reports)")


# -- the live run -------------------------------------------------------------------------------------


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


# -- from events to answers ---------------------------------------------------------------------------


def expected_scores(zoo: Any, records: Sequence[Any], samples: int, seed: int,
                    progress: Callable[[str], None] = print) -> dict[str, tier_eval.ExpectedScores]:
    """Each record's expected oracle score at Level-2 and, where the probe is cautious, at Level-1 (by prompt
    hash): ``samples`` answers per tier, prompted and sampled as the live tiers are (``strata_tools.level1``):
    Level-2 as the all-Level-2 arm sends it (no directions), Level-1 with the directions the probe forwards.
    Level-1 answers to prompts the router judges are not sampled again: it judged the one it saw."""
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


def run(args: argparse.Namespace) -> int:
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
    check_given_rms(args.light_rm, args.strong_rm)
    if args.label_share is not None and not 0 < args.label_share <= 1:
        raise CliError("--label-share must be in (0, 1]")
    if args.label_share is not None and args.record_rounds < 1:  # without a desk no record is built
        raise CliError("--record-rounds must be >= 1 with --label-share")
    run_id = uuid.uuid4().hex[:8]
    settings = StrataSettings()
    # The services' per-event INFO lines would bury the progress; warnings and errors still show.
    logging.getLogger().setLevel(logging.WARNING)
    out = args.out or settings.state_dir / "reports"
    with bench_infra(settings, run_id, "tiers") as infra:
        return _run(args, infra, run_id, out)


def _run(args: argparse.Namespace, settings: Any, run_id: str, out: Path) -> int:
    from strata_tools.zoo.build import ensure_zoo

    def progress(line: str) -> None:
        print(line, flush=True)

    zoo = ensure_zoo(settings)
    # Another light or strong RM in the zoo's place: every arm, the calibration and the replay read these.
    zoo = dataclasses.replace(zoo, rm_light=args.light_rm or zoo.rm_light, rm_strong=args.strong_rm or zoo.rm_strong)
    if args.light_rm or args.strong_rm:
        progress(f"tiers bench: light RM {zoo.rm_light}, strong RM {zoo.rm_strong} (given, not the zoo's)")
    mixes = prompt_mixes(load_suite(SEALED_SPLIT), args.prompts, args.seed, args.risk_share, args.stress_risk_share)
    eval_records = mixes.union
    history = pick_prompts(load_suite("train"), args.history, args.seed + 1) if args.history else []
    stress = (f"; stress mix {len(mixes.stress)} ({sum(r.risk for r in mixes.stress)} risk)" if mixes.stress
              else "")
    progress(f"tiers bench: zoo {zoo.root.name}, {len(eval_records)} test prompts: default mix "
             f"{len(mixes.default)} ({sum(r.risk for r in mixes.default)} risk){stress}; {len(history)} history "
             "prompts; each service in its own process")
    threshold = resolve_threshold(args, zoo, [str(zoo.light_rm)], args.bad_threshold, args.seed, progress)
    live = live_tiers(args, settings, zoo, run_id, out, threshold, progress)
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
        if live.desk is not None:
            progress(f"[desk] {sum(live.desk.counts.scored.values())} items scored by the simulated annotators")
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


def live_tiers(args: argparse.Namespace, settings: Any, zoo: Any, run_id: str, out: Path, threshold: ServedThreshold,
               progress: Callable[[str], None]) -> LiveTiers:
    """The services as the arms meet them: the threshold served, and with ``--label-share`` a desk and the
    escalation rule on the neighbourhood's record (fitted here, served with a copy of the light RM in the
    run's throw-away state dir; the rule itself is kept as ``<out>/escalation_rule.json``)."""
    reward_env = {"STRATA_ESCALATION_THRESHOLD": repr(threshold.value)}
    if args.label_share is None:
        return LiveTiers(settings, zoo, run_id, args.review_seconds, args.seed, reward_env=reward_env)
    light, served = serve_record_rule(zoo, Path(settings.state_dir) / "light-rm-rule", args.calibration_split,
                                      RecordHistory(args.record_rounds, args.label_share), args.bad_threshold,
                                      args.target_catch, args.seed, progress)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(rule_path(light), out / "escalation_rule.json")
    progress(served)
    reward_env["STRATA_ANNOTATE_LEVEL1_SHARE"] = repr(args.label_share)
    desk = [SimulatedAnnotator("sim-ann", seed=args.seed), SimulatedAnnotator("sim-bob", seed=args.seed + 1)]
    return LiveTiers(settings, dataclasses.replace(zoo, rm_light=light), run_id, args.review_seconds, args.seed,
                     reward_env=reward_env, desk=desk)


def warm_up(live: LiveTiers, history: Sequence[Any], args: argparse.Namespace,
            progress: Callable[[str], None]) -> None:
    """``WARM_UP_PROMPTS`` train prompts (none of the history's) through each route, unmeasured: cold services
    pay their first batches here, in no arm's cost."""
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
        lines += ["  " + line for line in stage_lines(run.stages)]
    lines += threshold_lines(arms.replay, args.bad_threshold, arms.baseline, arms.threshold)
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
    lines.append(f"{'Strata':<14}{pct(headline.param_token_saving):>8} {num(headline.quality_ratio):>8} "
                 f"{pct(headline.bad_case_catch):>7} {pct(headline.level2_share):>9}   ({headline.name})")
    return lines


