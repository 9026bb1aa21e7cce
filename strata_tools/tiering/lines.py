"""The report's tables and lines: the arms' table, the router against the ceiling, the threshold sweep,
the projection at other model sizes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from strata import ledger
from strata_tools.pricing import PriceAs, reprice
from strata_tools.tiering import tier_eval
from strata_tools.tiering.arms import ArmRun
from strata_tools.tiering.headline import (
    HEADLINE_ARM,
    TARGET_LEVEL2_SHARE,
    TARGET_QUALITY_RATIO,
    THRESHOLD_GRID,
    SweepFigures,
    num,
    pct,
)
from strata_tools.tiering.tier_eval import ArmFigures, PromptOutcome


def arm_table(arms: Sequence[ArmFigures]) -> list[str]:
    lines = [f"{'arm':<32} {'device s':>9} {'saving':>7} {'PxT sav.':>8} {'human h':>8} {'oracle':>7} "
             f"{'quality':>8} {'L2 share':>8} {'catch':>6} {'false esc':>9}"]
    for a in arms:
        lines.append(f"{a.name:<32} {a.device_seconds:>9.1f} {pct(a.saving):>7} {pct(a.param_token_saving):>8} "
                     f"{a.human_seconds / 3600:>8.2f} {a.mean_oracle:>7.3f} {num(a.quality_ratio):>8} "
                     f"{pct(a.level2_share):>8} {pct(a.bad_case_catch):>6} {pct(a.false_escalation):>9}")
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
                      f"{num(route_llm['weak'])}, strong {num(route_llm['strong'])}): "
                      f"APGR {num(route_llm['apgr'])}, CPT(50%) {pct(route_llm['cpt50'])}, "
                      f"CPT(80%) {pct(route_llm['cpt80'])}")
    return [route_line,
            *ceiling_lines(sweep.ceiling, oracle_arm, router_arm, router_label),
            f"params x tokens saving at quality >= {TARGET_QUALITY_RATIO} ({scores}): the served router "
            f"{pct(sweep.router.param_token_saving)} at quality {num(sweep.router.quality_ratio)} (best threshold of "
            f"the sweep, chosen after the fact: {pct(router)}), ceiling {pct(best)}: {num(sweep.ceiling_share)} "
            "of the ceiling's"]


def threshold_lines(replay: list[PromptOutcome], bad_threshold: float, baseline: ArmFigures,
                     served: float) -> list[str]:
    """The replayed threshold router at each threshold of ``THRESHOLD_GRID`` and at the ``served`` one, one row
    each under a header."""
    lines = [f"escalation threshold (replay): {'threshold':>9} {'L2 share':>8} {'catch':>6} {'false esc':>9} "
             f"{'saving':>7} {'PxT sav.':>8} {'quality':>8}"]
    for t in sorted({*THRESHOLD_GRID, served}):
        a = tier_eval.compare(tier_eval.evaluate(f"t={t}", replay, tier_eval.threshold_router(replay, t),
                                                 bad_threshold), baseline)
        mark = "  <- served" if t == served else ""
        lines.append(f"{'':<30} {t:>9.3f} {pct(a.level2_share):>8} {pct(a.bad_case_catch):>6} "
                     f"{pct(a.false_escalation):>9} {pct(a.saving):>7} {pct(a.param_token_saving):>8} "
                     f"{num(a.quality_ratio):>8}{mark}")
    return lines


def ceiling_lines(best: Sequence[ArmFigures], oracle_arm: ArmFigures, router_arm: ArmFigures | None = None,
                  router_label: str = "the tiered arm's") -> list[str]:
    """What the best router possible on these answers reaches: at the lowest share, at the target, at the
    oracle router's share, at the served router's (when given), and the cheapest at the target quality."""
    floor = best[0]
    lines = [f"ceiling (any router, escalating the prompts of largest oracle gain per Level-2 cost first; cautious "
             f"prompts are Level-2, so the share starts at {pct(floor.level2_share)}):",
             f"  {'':<30} {'L2 share':>8} {'saving':>7} {'PxT sav.':>8} {'quality':>8}"]

    def row(label: str, a: ArmFigures) -> str:
        return (f"  {label:<30} {pct(a.level2_share):>8} {pct(a.saving):>7} {pct(a.param_token_saving):>8} "
                f"{num(a.quality_ratio):>8}")

    lines.append(row("lowest share", floor))
    at_target = [a for a in best if a.level2_share <= TARGET_LEVEL2_SHARE + 1e-9]
    lines.append(row(f"share <= {TARGET_LEVEL2_SHARE:.0%}", at_target[-1]) if at_target
                 else f"  {'share <= ' + format(TARGET_LEVEL2_SHARE, '.0%'):<30} unreachable: cautious prompts alone "
                      f"are {pct(floor.level2_share)}")
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
        lines.append(f"  {name:<22} measured {measured_total:.3g} ({pct(1 - measured_total / measured_base)} saved)"
                     f"   at these sizes {priced_total:.3g} ({pct(1 - priced_total / priced_base)} saved){note}")
    return lines


def stage_lines(stages: Sequence[ledger.StageCost]) -> list[str]:
    return ledger.stage_table([s for s in stages if s.items or s.device_seconds])

