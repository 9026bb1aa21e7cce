"""The tables of a full ``strata bench scheduler`` run and its last line: ``Measured`` holds what they
quote; the three rules side by side with each skip rule's error (and its anatomy), the ceiling at the reuse
budget, R11 with cluster marking as configured and flipped, both encoders (``--compare-encoder``), the live
stream beside the simulated one (``--live``), and the ``scheduler trigger_reduction=...`` line.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from strata_tools.bench.reuse_ceiling import CeilingResult
from strata_tools.bench.scheduler.common import AUDITED, OWN_HISTORY
from strata_tools.bench.scheduler.encoders import TunedRun
from strata_tools.bench.scheduler.latency import LatencyRow, latency_fields
from strata_tools.bench.scheduler.live import LiveResult, live_passes
from strata_tools.bench.scheduler.stream import RuleResult
from strata_tools.bench.simulated_tier import EXPECTED_SAMPLES
from strata_tools.rm.onpolicy import BAD_THRESHOLD

if TYPE_CHECKING:
    from svc_scheduler.config import SchedulerSettings


@dataclass
class Measured:
    """Everything a full run's tables and last line quote."""

    everything: RuleResult
    greso: RuleResult
    knn: RuleResult
    ceiling: CeilingResult
    latency: list[LatencyRow]
    recall_suite: float
    live: LiveResult | None  # --live: the real tiers
    sim_subset: RuleResult | None  # --live: the simulated tier on the live stream
    flipped: RuleResult | None  # --compare-cluster-marking
    tuned: TunedRun | None = None  # --compare-encoder


def print_rules(measured: Measured) -> None:
    """The three rules' table, the knn decisions by the rule that made them and each skip rule's error."""
    knn = measured.knn
    print()
    print(f"{'rule':<34} {'submitted':>9} {'rollouts':>9} {'trigger':>8} {'level-2':>8} {'skipped':>8} "
          f"{'reuse MAE':>10}")
    for rule in (measured.everything, measured.greso, knn):
        skipped = rule.submitted - rule.rollouts
        print(f"{rule.name:<34} {rule.submitted:>9} {rule.rollouts:>9} {rule.trigger_rate:>8.3f} "
              f"{rule.level2:>8} {skipped:>8} {rule.mae:>10.3f}")
    print("knn decisions by rule: " + ", ".join(f"{name} {count} ({count / knn.submitted:.1%})"
                                               for name, count in knn.reasons.most_common()))
    print("knn reuse MAE by rule: " + ", ".join(f"{name} {np.mean(errors):.3f} over {len(errors)} skips"
                                              for name, errors in sorted(knn.errors_by_rule.items())))
    for name, parts in sorted(knn.anatomy.items()):
        against, truth_noise, drift = (np.array(column) for column in zip(*parts, strict=True))
        moved = f"; the policy moved it by {np.nanmean(drift):.3f} since the reused rollout" if name == OWN_HISTORY \
            else ""
        print(f"  error anatomy, {name}: {np.mean(knn.errors_by_rule[name]):.3f} against the truth "
              f"(--truth-samples rollouts), {np.mean(against):.3f} against the expected reward "
              f"({EXPECTED_SAMPLES} rollouts), which the truth itself misses by {np.mean(truth_noise):.3f}{moved}")


def print_ceiling(args: argparse.Namespace, settings: SchedulerSettings, ceiling: CeilingResult) -> None:
    """The trigger reduction any rule could reach at the reuse budget, by history and variance bound."""
    print(f"ceiling at reuse MAE <= {args.reuse_budget:g} (any rule: the history of every earlier submission, "
          "a perfect choice of what to skip; docs/scheduler.md):")
    audit_kept = 1 - settings.audit_share
    for of_family, label in ((False, "own history (GRESO's information)"), (True, "paraphrase family")):
        for bound, which in ((None, ""), (settings.high_variance_threshold, "R11"),
                             (settings.low_variance_threshold, "R10")):
            most, mae = ceiling.reduction(of_family, args.reuse_budget, bound)
            name = label if bound is None else f"  prompts varying < {bound:g} ({which} ref.)"
            print(f"  {name:<34} trigger reduction {most:.3f} at reuse MAE {mae:.3f} "
                  f"({most * audit_kept:.3f} after auditing {settings.audit_share:.0%})")
    print("  (the R10/R11 rows are references, not bounds: they keep the prompts whose *true* variance is under "
          "the rule's bound, which no rule knows; a rule whose variance estimate errs low can skip more)")


def print_r11(settings: SchedulerSettings, measured: Measured) -> None:
    """R11's aim with cluster marking as configured (and flipped), then the audited skips."""
    knn, flipped, everything = measured.knn, measured.flipped, measured.everything
    arms = [(settings.cluster_marking, knn)] + ([] if flipped is None else [(not settings.cluster_marking, flipped)])
    for marking, rule in sorted(arms, key=lambda arm: not arm[0]):
        print(f"R11 with cluster marking {'on' if marking else 'off'}: {rule.nonrisk_level2} of {rule.nonrisk} "
              f"non-risk submissions to Level-2 ({rule.level2_share:.1%}); {rule.bad_level2} of {rule.bad_samples} "
              f"bad rollouts (oracle < {BAD_THRESHOLD:g}) in them ({rule.bad_caught:.1%}); trigger reduction "
              f"{1 - rule.trigger_rate / everything.trigger_rate:.3f}, reuse MAE {rule.mae:.3f}")
    print(f"knn rollouts include {knn.reasons[AUDITED]} audited skips (audit_share {settings.audit_share:g}: "
          "rolled out anyway to measure the reused reward, docs/scheduler.md)")


def print_tuned(settings: SchedulerSettings, measured: Measured) -> None:
    """Both encoders on the same stream: trigger reduction, reuse error, where the skips came from."""
    assert measured.tuned is not None
    everything, base, tuned = measured.everything, measured.knn, measured.tuned
    print(f"encoders on the same stream (issue 39): off-the-shelf at cosine floor {settings.min_similarity:g}, "
          f"{tuned.encoder_id} at {tuned.min_similarity:g}")
    arms = [("off-the-shelf", base), ("fine-tuned", tuned.knn)]
    if tuned.base_at_floor is not None:
        arms.insert(1, (f"off-the-shelf at {tuned.min_similarity:g}", tuned.base_at_floor))
    for name, rule in arms:
        skips = {reason: count for reason, count in rule.reasons.items() if reason.endswith("-> skip")}
        print(f"  {name:<26} trigger reduction {1 - rule.trigger_rate / everything.trigger_rate:.3f}, reuse MAE "
              f"{rule.mae:.3f}, Level-2 {rule.level2} (non-risk {rule.level2_share:.1%}, catching "
              f"{rule.bad_caught:.1%} of bad rollouts, risk {rule.reasons['risk topic -> Level-2']}); skips: "
              + ", ".join(f"{reason} {count}" for reason, count in sorted(skips.items())))
    if tuned.later is not None:
        everything_later = tuned.later[0]
        print(f"  the stream again from policy v{tuned.later_version} (later epochs; the encoder learned from "
              f"v1-v{tuned.later_version}):")
        for name, rule in (("off-the-shelf", tuned.later[1]), ("fine-tuned", tuned.later[2])):
            print(f"    {name:<24} trigger reduction {1 - rule.trigger_rate / everything_later.trigger_rate:.3f}, "
                  f"reuse MAE {rule.mae:.3f}, Level-2 {rule.level2}")
    if tuned.fit is not None:
        c = tuned.fit.comparison
        print(f"  AUC of the cosine for reward agreement, off-the-shelf -> fine-tuned: held-out families "
              f"{c.base_auc:.3f} -> {c.tuned_auc:.3f} ({c.eval_pairs} pairs), the prompts it trained on "
              f"{c.train_base_auc:.3f} -> {c.train_tuned_auc:.3f}")


def print_live(args: argparse.Namespace, live: LiveResult, sim_subset: RuleResult) -> None:
    """The live stream through the simulated tier and the real tiers, side by side."""
    print(f"live stream: {args.live_families} families x 7 paraphrases x {live_passes(args)} passes; the simulated "
          f"tier's reuse MAE is against the oracle truth, the live one is the audit's (fresh light/strong-RM "
          f"rewards of {live.audits_scored} of {live.audits} audited skips)")
    sim_skipped = sim_subset.submitted - sim_subset.rollouts
    print(f"{'knn, simulated tier (same stream)':<34} {sim_subset.submitted:>9} {sim_subset.rollouts:>9} "
          f"{sim_subset.trigger_rate:>8.3f} {sim_subset.level2:>8} {sim_skipped:>8} {sim_subset.mae:>10.3f}")
    mae = "-" if live.audit_mae is None else f"{live.audit_mae:.3f}"
    print(f"{'knn, real tiers (zoo ' + live.zoo + ')':<34} {live.submitted:>9} {live.rollouts:>9} "
          f"{live.trigger_rate:>8.3f} {live.level2:>8} {live.skipped:>8} {mae:>10}")
    precision = "-" if live.audit_precision is None else f"{live.audit_precision:.1%}"
    interval = "" if live.audit_mae_ci95 is None else f" ± {live.audit_mae_ci95:.3f} (95 %)"
    if live.policy_versions:
        print(f"live policy: v{live.policy_versions[0]} after the first batch -> v{live.policy_versions[-1]} "
              "at the end (trained by the learner on the live rewards)")
    sim_rate = sim_skipped / sim_subset.submitted if sim_subset.submitted else 0.0
    ratio = f"{live.skip_rate / sim_rate:.2f}x" if sim_rate else "-"
    print(f"live trigger reduction {live.skip_rate:.3f} against the simulated tier's {sim_rate:.3f} on the same stream "
          f"and audit share: {ratio} (issue 39 asks >= 0.8x)")
    print(f"live: skip rate {live.skip_rate:.1%}, audit reuse error {mae}{interval}, audit precision {precision}, "
          f"{live.audit_distrusts} audits that erred distrusted the neighbours they reused and raised "
          f"{live.audit_floors} neighbours' similarity floors, high-uncertainty marks "
          f"{live.marks}, {live.wall_s:.0f} s")


def print_last_line(args: argparse.Namespace, settings: SchedulerSettings, measured: Measured) -> None:
    """The ``scheduler trigger_reduction=...`` line the docs quote."""
    everything, greso, knn, flipped, live = (measured.everything, measured.greso, measured.knn, measured.flipped,
                                              measured.live)
    audit_kept = 1 - settings.audit_share
    greso_reduction = 1 - greso.trigger_rate / everything.trigger_rate
    reduction = 1 - knn.trigger_rate / everything.trigger_rate
    live_rate = "nan" if live is None else f"{live.skip_rate:.3f}"
    live_mae = "nan" if live is None or live.audit_mae is None else f"{live.audit_mae:.3f}"
    live_audits = "nan" if live is None else str(live.audits_scored)
    r10_reference, _ = measured.ceiling.reduction(True, args.reuse_budget, settings.low_variance_threshold)
    r11_reference, _ = measured.ceiling.reduction(True, args.reuse_budget, settings.high_variance_threshold)
    live_bounds = ("nan", "nan") if live is None or live.audit_mae is None or live.audit_mae_ci95 is None else (
        f"{live.audit_mae - live.audit_mae_ci95:.3f}", f"{live.audit_mae + live.audit_mae_ci95:.3f}")
    print(f"scheduler trigger_reduction={reduction:.3f} reuse_mae={knn.mae:.3f} "
          f"greso_trigger_reduction={greso_reduction:.3f} r10_reference={r10_reference * audit_kept:.3f} "
          f"live_skip_rate={live_rate} live_reuse_mae={live_mae} live_audits={live_audits} "
          f"live_reuse_mae_lo={live_bounds[0]} live_reuse_mae_hi={live_bounds[1]} "
          f"r11_reference={r11_reference * audit_kept:.3f} "
          f"{latency_fields(measured.latency)} level2_share={knn.level2_share:.3f} "
          f"bad_caught={knn.bad_caught:.3f}"
          + ("" if flipped is None else f" flipped_level2_share={flipped.level2_share:.3f} "
                                        f"flipped_bad_caught={flipped.bad_caught:.3f}")
          + ("" if measured.tuned is None else
             f" tuned_trigger_reduction={1 - measured.tuned.knn.trigger_rate / everything.trigger_rate:.3f} "
             f"tuned_reuse_mae={measured.tuned.knn.mae:.3f}"))
