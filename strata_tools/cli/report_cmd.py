"""``strata report``: what every stage cost, per tier, and the saving against all-Level-2 (R4), then
the scheduler's live skipping and its audit (R10-R12).

Reads the cost ledger (``strata.ledger``) and the scheduler's counters and audits in Redis.
``--prompt HASH`` cuts the ledger to one prompt's requests; ``--price-as`` adds a projection of the same
work at other model sizes (``strata_tools.pricing``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence

import redis

from strata import ledger, redis_client
from strata.config import StrataSettings
from strata.errors import CliError
from strata.ledger import stage_table
from strata_tools.pricing import PriceAs, parse_price_as, reprice, reprice_baseline


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="cost per stage and tier, escalations and the saving (R4)")
    parser.add_argument("--prompt", metavar="HASH", help="only this prompt's requests (its content hash)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--price-as", metavar="SIZES", default=None,
                        help="also price the measured decisions and tokens at these model sizes, a labelled "
                             "projection beside the measured ledger: a preset (article, deployment) or "
                             "role=params pairs, e.g. level1=1.5e9,level2=8e9,rm_strong=8e9,rm_light=1e9 "
                             "(roles: encoder, probe, level1, level2, rm_light, rm_strong)")
    parser.set_defaults(func=run)


def price_option(text: str | None) -> PriceAs | None:
    """``--price-as`` parsed, or None; a CliError naming what to fix."""
    if text is None:
        return None
    try:
        return parse_price_as(text)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def projection_lines(summary: ledger.CostSummary, price: PriceAs,
                     baseline_stages: Sequence[ledger.StageCost] | None = None) -> list[str]:
    """The ledger's params x tokens at ``price``'s sizes: per stage, the total and the saving against the
    baseline repriced too (a measured one from ``baseline_stages``, the all-Level-2 arm; else the
    estimate, recomputed from the repriced Level-2 stages)."""
    stages, unpriced = reprice(summary.stages, price)
    baseline = None
    if summary.baseline is not None and summary.baseline.measured and baseline_stages is not None:
        baseline = reprice_baseline(summary.baseline, baseline_stages, price)
    projected = ledger.summarise(stages, summary.counts, baseline)
    total = projected.total_param_tokens
    shares = ", ".join(f"{s.stage}/{ledger_tier(s.tier)} {s.param_tokens:.3g} ({s.param_tokens / total:.0%})"
                       for s in stages if s.param_tokens) if total else "nothing booked"
    lines = [price.describe(), f"  params x tokens: {shares}; total {total:.3g}"]
    if projected.baseline is not None and projected.param_token_saving is not None:
        lines.append(f"  saving vs all-Level-2 at these sizes: {projected.param_token_saving:.1%} of params x tokens "
                     f"(baseline {projected.baseline.param_tokens:.3g}, "
                     f"{'measured' if projected.baseline.measured else 'estimated'}); "
                     "the measured ledger above is the figure, this is what the same work would cost")
    if unpriced:
        lines.append(f"  left at measured cost (the ledger predates sizes per stage): {', '.join(unpriced)}")
    return lines


def ledger_tier(tier: int) -> str:
    return {0: "-", 1: "L1", 2: "L2"}.get(tier, str(tier))


def summary_lines(summary: ledger.CostSummary) -> list[str]:
    counts = summary.counts
    escalations = counts.get("escalations", 0)
    level1 = counts.get("final_tier1", 0) + escalations
    rate = f" ({escalations / level1:.1%} of Level-1 outcomes)" if level1 else ""
    finals = sum(v for k, v in counts.items() if k.startswith("final_tier"))
    lines = [*stage_table(summary.stages),
             f"final rewards: {finals}   escalations Level-1 -> Level-2: {escalations}{rate}",
             f"total: {summary.total_device_seconds:.2f} device-s, {summary.total_param_tokens:.3g} params x tokens, "
             f"{summary.human_seconds:.0f} human-s (human review is reported apart from device time)"]
    if summary.baseline is None:
        lines.append("saving vs all-Level-2: no baseline (no Level-2 sample or no final reward in this ledger; "
                     "`strata bench tiers` measures one on the same prompts)")
    else:
        b = summary.baseline
        lines.append(f"all-Level-2 baseline: {b.device_seconds:.2f} device-s, {b.param_tokens:.3g} params x tokens "
                     f"({b.label})")
        lines.append(f"saving vs all-Level-2: {summary.saving:.1%} of device-s, "
                     f"{summary.param_token_saving:.1%} of params x tokens")
    return lines


def skip_lines(client: redis.Redis) -> list[str]:
    """The scheduler's live skipping (R10-R12): decisions, skip rate and the skip audit, from its Redis state."""
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.store import SchedulerStore

    store = SchedulerStore(client, SchedulerSettings())
    summary = store.summary()
    if not summary.submitted:
        return ["skipping: no prompt submitted to the scheduler yet"]
    counters = summary.counters
    return [f"skipping: {summary.submitted} prompts submitted, {counters.get('decision:skip', 0)} skipped "
            f"({summary.skip_rate:.1%}), {counters.get('decision:level_2', 0)} to Level-2, "
            f"{counters.get('high_uncertainty_marks', 0)} high-uncertainty marks",
            store.audit_summary().describe()]


def run(args: argparse.Namespace) -> int:
    price = price_option(args.price_as)
    settings = StrataSettings()
    client = redis_client.connect(settings.redis_address, socket_timeout=5)
    try:
        if args.prompt:
            requests = ledger.read_prompt(client, args.prompt)
        else:
            summary = ledger.read(client)
            skipping = skip_lines(client)
    except redis.ConnectionError as exc:
        raise CliError(f"Redis at {settings.redis_address_masked} does not answer ({exc}); "
                       "run `strata infra up`") from exc
    finally:
        client.close()
    if args.prompt:
        if not requests:
            raise CliError(f"no ledger entry for prompt {args.prompt!r} (entries expire with the content store's TTL)")
        if args.json:
            print(json.dumps({rid: [dataclasses.asdict(s) for s in stages] for rid, stages in requests.items()},
                             indent=2))
            return 0
        for request_id, stages in sorted(requests.items()):
            print(f"request {request_id}:")
            print("\n".join("  " + line for line in stage_table(stages)))
        return 0
    if args.json:
        report: dict[str, object] = {
            "stages": [dataclasses.asdict(s) for s in summary.stages], "counts": summary.counts,
            "total_device_seconds": summary.total_device_seconds, "total_param_tokens": summary.total_param_tokens,
            "human_seconds": summary.human_seconds,
            "baseline": dataclasses.asdict(summary.baseline) if summary.baseline else None,
            "saving": summary.saving, "param_token_saving": summary.param_token_saving,
        }
        if price is not None:
            stages, unpriced = reprice(summary.stages, price)
            projected = ledger.summarise(stages, summary.counts)
            report["projection"] = {"label": price.label, "sizes": dict(price.sizes),
                                    "stages": [dataclasses.asdict(s) for s in stages], "unpriced": unpriced,
                                    "total_param_tokens": projected.total_param_tokens,
                                    "param_token_saving": projected.param_token_saving}
        print(json.dumps(report, indent=2))
        return 0
    projection = projection_lines(summary, price) if price is not None else []
    print("\n".join([*summary_lines(summary), *projection, *skipping]))
    return 0
