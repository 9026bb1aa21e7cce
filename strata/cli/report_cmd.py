"""``strata report``: tier mix, escalations, cost per tier and the saving against all-Level-2 (R4)."""

from __future__ import annotations

import argparse
import json

import redis

from strata import ledger
from strata.cli.main import CliError
from strata.config import StrataSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="tier mix, escalation rate, cost and saving (R4)")
    parser.add_argument("--level2-seconds-per-token", type=float, default=None,
                        help="Level-2 cost per token when no Level-2 rollout was measured yet")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = StrataSettings()
    client = redis.Redis.from_url(settings.redis_address, socket_timeout=5)
    try:
        summary = ledger.read(client, args.level2_seconds_per_token)
    except redis.ConnectionError as exc:
        raise CliError(f"Redis at {settings.redis_address} does not answer ({exc}); run `strata infra up`") from exc
    finally:
        client.close()
    rollouts = sum(t.rollouts for t in summary.tiers)
    finals = sum(v for k, v in summary.counts.items() if k.startswith("final_tier"))
    escalations = summary.counts.get("escalations", 0)
    level1_finals_or_escalations = summary.counts.get("final_tier1", 0) + escalations
    escalation_rate = escalations / level1_finals_or_escalations if level1_finals_or_escalations else None
    if args.json:
        print(json.dumps({
            "tiers": [t.__dict__ for t in summary.tiers], "counts": summary.counts,
            "escalation_rate": escalation_rate, "total_device_seconds": summary.total_device_seconds,
            "all_level2_device_seconds": summary.all_level2_device_seconds, "saving": summary.saving,
        }, indent=2))
        return 0
    print(f"{'tier':<8} {'rollouts':>9} {'share':>7} {'tokens':>9} {'device s':>10} {'ms/token':>9}")
    for tier in summary.tiers:
        share = tier.rollouts / rollouts if rollouts else 0.0
        per_token = f"{1000 * tier.seconds_per_token:.2f}" if tier.seconds_per_token else "-"
        print(f"Level-{tier.tier:<2} {tier.rollouts:>9} {share:>7.1%} {tier.tokens:>9} "
              f"{tier.device_seconds:>10.2f} {per_token:>9}")
    print(f"final rewards: {finals}   escalations: {escalations}"
          + (f" ({escalation_rate:.1%} of Level-1 prompts)" if escalation_rate is not None else ""))
    if summary.saving is None:
        print("saving vs all-Level-2: unknown (no Level-2 rollout measured; pass --level2-seconds-per-token)")
    else:
        print(f"device time {summary.total_device_seconds:.2f} s vs {summary.all_level2_device_seconds:.2f} s "
              f"if everything ran at Level-2: saving {summary.saving:.1%}")
    return 0
