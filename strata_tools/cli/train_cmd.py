"""``strata train``: PPO on the zoo's task through the running stack (``strata up`` first)."""

from __future__ import annotations

import argparse
from pathlib import Path

import grpc
from tqdm import tqdm

from strata.config import StrataSettings
from strata.errors import CliError
from strata_tools.cli.progress import redraw
from strata_tools.train import Addresses, RoundStats, TrainOptions, train
from strata_tools.train_summary import checkpoint_lines


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="run PPO through the running services; writes a reward curve")
    parser.add_argument("--updates", type=int, default=5, help="policy updates to wait for")
    parser.add_argument("--prompts-per-round", type=int, default=16)
    parser.add_argument("--n-samples", type=int, default=4, help="rollouts per prompt")
    parser.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts scored before and after")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="also score the held-out prompts every N updates in between (0: before and after only)")
    parser.add_argument("--max-rounds", type=int, default=50)
    parser.add_argument("--round-timeout", type=float, default=300.0)
    parser.add_argument("--report-dir", type=Path, default=None, help="default: <state_dir>/reports")
    for name, default in vars(Addresses()).items():
        parser.add_argument(f"--{name}-address", default=default, help=f"{name} gRPC address")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.eval_every < 0:
        raise CliError("--eval-every must be >= 0 (0: held-out scores before and after only)")
    settings = StrataSettings()
    options = TrainOptions(updates=args.updates, prompts_per_round=args.prompts_per_round, n_samples=args.n_samples,
                           eval_prompts=args.eval_prompts, round_timeout_s=args.round_timeout,
                           max_rounds=args.max_rounds, report_dir=args.report_dir or settings.state_dir / "reports",
                           eval_every=args.eval_every)
    addresses = Addresses(**{name: getattr(args, f"{name}_address") for name in vars(Addresses())})
    bar = tqdm(total=args.updates, desc="policy updates", unit="update")

    def progress(stats: RoundStats, advanced: int) -> None:
        bar.n = min(advanced, args.updates)
        reward = "-" if stats.mean_reward is None else f"{stats.mean_reward:.2f}"
        bar.set_postfix_str(f"round {stats.round} v{stats.policy_version} reward {reward} "
                            f"finals {stats.finals}", refresh=False)
        redraw(bar)

    try:
        summary = train(settings, options, addresses, progress)
    except grpc.RpcError as exc:
        raise CliError(f"a service did not answer ({exc.code().name}: {exc.details()}); "
                       "is the stack up (`strata up`, `strata status`)?") from exc
    finally:
        bar.close()
    before, after = summary.before, summary.after
    print(f"policy v{summary.start_version} -> v{summary.end_version} in {len(summary.rounds)} rounds")
    if before and after:
        print(f"held-out light-RM reward {before.mean_reward:.3f} -> {after.mean_reward:.3f} "
              f"(change {summary.reward_change}, gain {summary.reward_gain:+.1%})")
        print(f"held-out oracle score    {before.mean_oracle:.3f} -> {after.mean_oracle:.3f} "
              f"(change {summary.oracle_change})")
        print(f"hacking gap (RM change - oracle change): {summary.hacking_gap}")
        print(f"held-out bad cases       {before.bad_share:.1%} -> {after.bad_share:.1%} (oracle < 1.5)")
        print("\n".join(checkpoint_lines(summary)))
    if summary.weight_sync_s is not None:
        print(f"weight sync (publish -> first rollout on the new version): {summary.weight_sync_s:.2f} s")
    print(f"curves: {summary.png} (summary: {Path(summary.png).with_suffix('.json')})")
    return 0
