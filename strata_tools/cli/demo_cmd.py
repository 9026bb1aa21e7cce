"""``strata demo`` (what ``make demo`` runs): the whole loop on tiny models, then a report.

1. Kafka and Redis (``strata infra up``); 2. the model zoo (built once, then reused); 3. every
service as its own process (``strata up``); 4. the suite's training prompts through the scheduler's
gRPC API in rounds while the learner runs PPO on the rewards (``strata train``); 5. a report: tier
mix, skip rate, escalations, every stage's cost and the saving against a named all-Level-2
baseline, reward and oracle curves, the rollout log's size; 6. one turn of the reward models' loop on
the annotators' labels (``strata rm refresh``): a better light RM promoted, or the figure that says
why not. A second run reuses the zoo, the
running stack and the data.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import time

import grpc
from tqdm import tqdm

from strata import ledger, redis_client, rpc
from strata.bus import topics
from strata.bus.scan import TopicScan
from strata.config import StrataSettings
from strata.errors import CliError
from strata.v1 import annotation_pb2, annotation_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from strata_tools.cli.progress import redraw
from strata_tools.infra import InfraError
from strata_tools.infra import up as infra_up
from strata_tools.rm.onpolicy import BAD_THRESHOLD
from strata_tools.stack import control
from strata_tools.stack.spec import default_services
from strata_tools.train import Addresses, RoundStats, TrainOptions, TrainSummary, train
from strata_tools.zoo.desk import SimulatedDesk, demo_pool

# The tiny CPU models learn at rates real models would not survive (see docs/learner.md).
# A short run on the ci zoo: the KL penalty on from the first update (the default warm-up spans 100
# updates) and a small step, so that the weak light RM is followed without being gamed (tests/stack/test_train.py).
# Level-2 rewards wait for the simulated annotators' scores (svc_annotation closes the loop, R3).
DEMO_SERVICE_ARGS = {"learner": ["--learning-rate", "1e-4", "--batch-size", "32", "--minibatch-size", "8",
                                 "--kl-coef", "0.2", "--kl-warmup-updates", "0"],
                     "reward": ["--await-annotation"]}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="the whole loop on tiny models, then a report (make demo)")
    parser.add_argument("--updates", type=int, default=8, help="PPO updates to run")
    parser.add_argument("--prompts-per-round", type=int, default=24)
    parser.add_argument("--n-samples", type=int, default=2, help="rollouts per prompt")
    # 64 held-out prompts give a paired SE of ~0.1, enough to see the change of 8 updates (~+0.3).
    parser.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts scored before and after")
    parser.add_argument("--repeat-share", type=float, default=0.25,
                        help="share of each round's prompts that repeat a prompt sent before")
    parser.add_argument("--paraphrase-share", type=float, default=0.25,
                        help="share that paraphrase a prompt sent before (same family in the suite)")
    parser.add_argument("--light-rm", default=None,
                        help="light RM directory for svc_reward, or several separated by commas (an ensemble, R8); "
                             "default: the promoted version, else the zoo's")
    parser.add_argument("--rm-temperature", type=float, default=None,
                        help="svc_reward's scoring temperature on the RM's score bins (default 1; R8 suggests 0.3)")
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
    from strata_tools.rm.refresh import RefreshOptions
    from strata_tools.rm.versions import open_registry
    from strata_tools.zoo.build import ZooSettings

    print("[6/6] reward models: one refresh turn on the annotators' labels (strata rm refresh)", flush=True)
    zoo_settings = ZooSettings()
    run_turn(RefreshOptions(), zoo_settings, open_registry(zoo_settings), progress=lambda line: print("     ", line,
                                                                                                        flush=True))


def reward_service_args(light_rm: str | None, rm_temperature: float | None) -> list[str]:
    """svc_reward's arguments in the demo: awaiting the desk's scores, plus the light RM and temperature asked for."""
    args = list(DEMO_SERVICE_ARGS["reward"])
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


def _start_stack(settings: StrataSettings, args: argparse.Namespace) -> None:
    """[1/6]-[3/6]: Kafka and Redis, the model zoo (built once), every service as its own process."""
    try:
        print("[1/6] Kafka and Redis", flush=True)
        for row in infra_up(settings):
            print(f"      {row.name:<6} {row.state:<4} {row.address}")
        print(f"[2/6] model zoo (preset {os.environ['STRATA_ZOO_PRESET']}; built once, then reused)", flush=True)
        from strata_tools.zoo.build import ensure_zoo

        paths = ensure_zoo(settings)
        print(f"      {paths.root}")
        print("[3/6] services (strata up)", flush=True)
        # The desk's packaged gold set (svc_annotation/data/gold.jsonl), at 3x its default share so that a
        # short demo shows drift figures.
        service_args = {**DEMO_SERVICE_ARGS, "reward": reward_service_args(args.light_rm, args.rm_temperature),
                        "annotation": ["--gold-share", "0.3"]}
        control.start(settings, default_services(), service_args, args.timeout,
                      progress=lambda line: print("     ", line, flush=True))
    except InfraError as exc:
        raise CliError(str(exc)) from exc


def _show_round(bar: tqdm, updates: int, stats: RoundStats, advanced: int) -> None:
    """The progress bar after a round: the updates done, the round's mean reward and finals."""
    bar.n = min(advanced, updates)
    reward = "-" if stats.mean_reward is None else f"{stats.mean_reward:.2f}"
    bar.set_postfix_str(f"round {stats.round} reward {reward} finals {stats.finals}", refresh=False)
    redraw(bar)


def _train_with_desk(settings: StrataSettings, args: argparse.Namespace) -> tuple[TrainSummary, SimulatedDesk]:
    """[4/6]: the suite's prompts through the stack in rounds while the learner runs PPO and simulated
    annotators score at the desk; the run's summary and the (stopped) desk."""
    print(f"[4/6] training: suite prompts -> scheduler -> tiers -> rewards -> PPO ({args.updates} updates)",
          flush=True)
    bar = tqdm(total=args.updates, desc="      policy updates", unit="update")
    desk = SimulatedDesk(Addresses().annotation, demo_pool()).start()
    print(f"      simulated annotators at the desk: {', '.join(a.name for a in demo_pool())} (sim-drift drifts)",
          flush=True)
    options = TrainOptions(updates=args.updates, prompts_per_round=args.prompts_per_round,
                           n_samples=args.n_samples, eval_prompts=args.eval_prompts,
                           report_dir=settings.state_dir / "reports", repeat_share=args.repeat_share,
                           paraphrase_share=args.paraphrase_share)
    try:
        summary = train(settings, options, Addresses(), functools.partial(_show_round, bar, args.updates))
    except grpc.RpcError as exc:
        raise CliError(f"a service stopped answering ({exc.code().name}: {exc.details()}); "
                       "see `strata status` and `strata logs`") from exc
    finally:
        bar.close()
        desk.stop()
    return summary, desk


def _print_report(settings: StrataSettings, summary: TrainSummary, desk: SimulatedDesk) -> None:
    """[5/6]: tier decisions, skips, costs, the held-out change, the rollout log, the desk's figures, the curves."""
    print("[5/6] report", flush=True)
    with rpc.channel(Addresses().scheduler) as channel:
        stats = scheduler_pb2_grpc.SchedulerStub(channel).Stats(scheduler_pb2.StatsRequest(), timeout=10)

    from strata_tools.cli.report_cmd import skip_lines, summary_lines

    client = redis_client.connect(settings.redis_address)
    cost = ledger.read(client)
    skipping = skip_lines(client)
    client.close()
    print("      decisions: "
          + ", ".join(f"{k.removeprefix('DECISION_').lower()}={v}" for k, v in sorted(stats.decisions.items()))
          + f"   index size: {stats.index_size}")
    print("\n".join("      " + line for line in skipping))

    print("\n".join("      " + line for line in summary_lines(cost)))
    if summary.before and summary.after:
        print(f"      held-out ({len(summary.before.rewards)} prompts, policy v{summary.start_version} -> "
              f"v{summary.end_version}): light-RM reward {summary.before.mean_reward:.3f} -> "
              f"{summary.after.mean_reward:.3f} (change {summary.reward_change}), oracle "
              f"{summary.before.mean_oracle:.3f} -> {summary.after.mean_oracle:.3f} (change {summary.oracle_change}); "
              f"hacking gap (RM change - oracle change) {summary.hacking_gap}; bad cases (oracle < "
              f"{BAD_THRESHOLD:g}) {summary.before.bad_share:.1%} -> {summary.after.bad_share:.1%}")
    if summary.reward_oscillation is not None:
        print(f"      reward oscillation (rounds' mean light-RM reward): {summary.reward_oscillation}")
    print(f"      rollout log: {rollout_log_size(settings)} records (prompt hash, response hash, reward)")
    print("\n".join("      " + line for line in annotation_lines(Addresses().annotation, desk)))
    print(f"      curves: {summary.png}")


def run(args: argparse.Namespace) -> int:
    if not (args.repeat_share >= 0 and args.paraphrase_share >= 0 and args.repeat_share + args.paraphrase_share <= 1):
        raise CliError("--repeat-share and --paraphrase-share must be >= 0 and sum to at most 1")
    # The demo uses the zoo's small preset unless told otherwise (the default preset takes ~15 min).
    os.environ.setdefault("STRATA_ZOO_PRESET", "ci")
    settings = StrataSettings()
    check_reward_choice(settings, args.light_rm, args.rm_temperature)
    started = time.monotonic()
    _start_stack(settings, args)
    summary, desk = _train_with_desk(settings, args)
    _print_report(settings, summary, desk)
    if args.refresh:
        refresh_turn(settings)
    print(f"done in {time.monotonic() - started:.0f} s. The stack keeps running: `strata status`, "
          "`strata report`, `strata down`.")
    return 0
