"""A refresh turn refits the escalation rule for its candidate light RM, or fits a first one (issue 61, item 2).

A rule is bound to the light RM's weights (its ``light`` and ``spread`` features are that RM's scores), so
a promoted candidate without one of its own would be served the single threshold. When the version in
service has a rule (or ``fit_rule`` asks for a first one), the turn fits it on what production has: people's
scores of Level-1 answers (the desk's ``annotate_level1_share``, a fair sample of Level-1's answers whatever
their route), re-scored by the candidate, with the other signals the reward worker kept for each
(``svc_reward.signals_store``). The rule is kept only if it ranks those labels better than the candidate's
score alone by more than their noise; else the threshold decides.

Only the turn's held-out slice is used: the candidate was trained on the rest, so its scores there would
read better than they will live. The rule keeps the features, target catch, penalty and bad-label line of
the rule in service; nothing is selected on so few labels. Audited answers are not used: the audit draws
from the answers that passed, which would teach the rule a world without the ones it escalates.
"""

from __future__ import annotations

import dataclasses as dc
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata.contract.checksums import weights_checksum
from strata.hashing import content_hash
from strata_tools.intervals import Interval, cluster_bootstrap
from strata_tools.rm.escalation import live_scoring_options
from svc_reward.calibration_store import write_rule
from svc_reward.escalation_rule import (
    EscalationRule,
    RuleReport,
    auc,
    evaluate_rule,
    features,
    fit_rule,
    fold_of,
    fold_rules,
)
from svc_reward.signals_store import StoredSignals

DEFAULT_BAD_BELOW = 1.5  # `strata calibrate rule --bad-threshold`'s default, for a rule that does not say its own
DEFAULT_TARGET_CATCH = 0.9  # `strata calibrate rule --target-catch`'s default
# A first rule fitted on people's labels (no rule in service, ``fit_rule``): the light score and the
# neighbourhood's record, the pair forward selection kept on the validation split at 20 % and 50 % labelled
# and that held on the sealed test split (docs/results.md). No selection on a turn's few dozen labels.
FIT_FEATURES = ("light", "record_bad")
# A rule is kept only where the lower end of its out-of-fold AUC gain over the light score, an interval at
# this level over prompts (a one-sided 90 % bound), is above zero: stricter refused most good rules on a few
# hundred labels, the point estimate alone kept rules that lost on the sealed test split (docs/results.md).
GAIN_LEVEL = 0.8


@dataclass(frozen=True)
class RuleSpec:
    """What a refit keeps of the rule in service: its features, target catch, penalty and bad-label line."""

    features: tuple[str, ...]
    target_catch: float
    l2: float
    bad_below: float

    @classmethod
    def of(cls, rule: EscalationRule, bad_below: float | None = None, target_catch: float | None = None) -> RuleSpec:
        line = bad_below if bad_below is not None else float(rule.fitted.get("bad_threshold", DEFAULT_BAD_BELOW))
        catch = rule.target_catch if target_catch is None else target_catch
        return cls(rule.features, catch, float(rule.fitted.get("l2", 1.0)), line)

    @classmethod
    def first(cls, bad_below: float | None = None, target_catch: float | None = None) -> RuleSpec:
        return cls(FIT_FEATURES, DEFAULT_TARGET_CATCH if target_catch is None else target_catch, 1.0,
                   DEFAULT_BAD_BELOW if bad_below is None else bad_below)


@dataclass(frozen=True)
class RefitRows:
    """The labelled Level-1 answers a rule is refitted on: features as the candidate scores them."""

    features: list[dict[str, float | None]]
    bad: list[bool]
    groups: list[str]  # the prompt's hash: answers to one prompt stay in one fold


def refit_rows(labelled: Sequence[tuple[Mapping[str, Any], StoredSignals]], rewards: Sequence[float],
               spreads: Sequence[float], bad_below: float) -> RefitRows:
    """Each labelled answer (its row {prompt, response, score} and kept signals) with the candidate's reward
    and spread, as features; bad when people scored it under ``bad_below``."""
    rows = [features(kept.signals(reward, spread, str(row["response"])))
            for (row, kept), reward, spread in zip(labelled, rewards, spreads, strict=True)]
    return RefitRows(rows, [float(row["score"]) < bad_below for row, _ in labelled],
                     [content_hash(str(row["prompt"])) for row, _ in labelled])


def refit(spec: RuleSpec, rows: RefitRows, min_answers: int, min_bad: int, seed: int = 0
          ) -> tuple[EscalationRule, RuleReport, Interval] | str:
    """The rule ``spec`` describes fitted on ``rows`` (no checksum yet) with its out-of-fold report (folds by
    prompt), or why none is served: too few labels, nothing to fit on, or a rule that ranks the labels no
    better out of fold than the light score alone, beyond the noise of so few labels (then the threshold should
    decide). With the rule: its out-of-fold report and AUC gain over the score (``auc_gain``)."""
    n_bad = sum(rows.bad)
    if len(rows.bad) < min_answers or n_bad < min_bad or n_bad == len(rows.bad):
        return (f"{len(rows.bad)} labelled Level-1 answers with kept signals held out, {n_bad} bad; at least "
                f"{min_answers} and {min_bad} bad (rule_min_answers, rule_min_bad) to fit the escalation rule")
    try:
        rule = fit_rule(rows.features, rows.bad, spec.target_catch, names=spec.features, l2=spec.l2)
        report = evaluate_rule(rows.features, rows.bad, rows.groups, spec.target_catch, folds=5, l2=spec.l2,
                               seed=seed, names=spec.features)
    except ValueError as exc:
        return f"the escalation rule cannot be fitted on these labels: {exc}"
    if not rule.features:
        return f"every signal of the rule ({', '.join(spec.features)}) is constant on these labels: nothing to fit on"
    gain = auc_gain(rows, spec, seed=seed)
    if not gain.low > 0:  # nan (no fold could judge) refuses too
        return (f"out of fold the rule ranks these labels no better than the light score alone beyond noise (AUC "
                f"{_num(report.combined_auc)} against {_num(report.light_auc)}; gain {gain.estimate:+.3f}, "
                f"{GAIN_LEVEL:.0%} interval over prompts [{gain.low:+.3f}, {gain.high:+.3f}]): the threshold decides")
    return rule, report, gain


def auc_gain(rows: RefitRows, spec: RuleSpec, folds: int = 5, seed: int = 0, level: float = GAIN_LEVEL) -> Interval:
    """The rule's out-of-fold bad-case AUC minus the light score's on the same answers, paired, as
    ``evaluate_rule`` reads it (within each fold, weighted by its answers), with an interval from a bootstrap
    over prompts: its lower end is a one-sided (1 + ``level``) / 2 bound."""
    fold = fold_of(rows.groups, folds, seed)
    rules = fold_rules(rows.features, rows.bad, fold, folds, spec.target_catch, spec.features, spec.l2)
    probability = [(rules[f].probability(row) or 0.0) if f in rules else 0.0
                   for row, f in zip(rows.features, fold, strict=True)]
    light = [-(row.get("light") or 0.0) for row in rows.features]

    def gain(idx: Sequence[int]) -> float:
        total = weight = 0.0
        for k in rules:  # as evaluate_rule: a fold without a rule is not read
            members = [i for i in idx if fold[i] == k]
            bad = [rows.bad[i] for i in members]
            ruled, scored = auc([probability[i] for i in members], bad), auc([light[i] for i in members], bad)
            if ruled is not None and scored is not None:
                total += (ruled - scored) * len(members)
                weight += len(members)
        return total / weight if weight else math.nan

    return cluster_bootstrap(gain, rows.groups, seed, level=level)


def carry_rule(current_paths: Sequence[Any], candidate: Any, held: Sequence[Mapping[str, Any]],
               read_kept: Callable[[Sequence[str]], Mapping[str, StoredSignals]], min_answers: int, min_bad: int,
               bad_below: float | None = None, fit_new: bool = False, seed: int = 0,
               progress: Callable[[str], None] = print, target_catch: float | None = None) -> str:
    """Fit and store the candidate light RM's escalation rule: the rule in service refitted, or with
    ``fit_new`` and none in service a first one (``FIT_FEATURES``). ``read_kept`` gives the kept signals of
    the answers by response hash (Redis in a turn). Returns the ``TurnReport.rule`` text: "" (no rule in
    service, none asked for), "refitted ..." or "fitted ..." with its figures, or "not refitted: " / "not
    fitted: " and why."""
    from svc_reward.models import served_rule

    current = served_rule([str(p) for p in current_paths])
    if current is None and not fit_new:
        return ""
    spec = (RuleSpec.of(current, bad_below, target_catch) if current is not None
            else RuleSpec.first(bad_below, target_catch))
    verb = "refitted" if current is not None else "fitted"
    paths = [str(p) for p in candidate.paths]
    rows = _scored_rows(held, read_kept, paths, spec.bad_below)
    result = refit(spec, rows, min_answers, min_bad, seed)
    if isinstance(result, str):
        progress(f"escalation rule of {candidate.version}: not {verb} ({result}); it will escalate on the "
                 "threshold if promoted")
        return f"not {verb}: {result}"
    rule, report, gain = result
    fitted = {"source": "strata rm refresh", "at": time.time(), "answers": len(rows.bad), "bad": sum(rows.bad),
              "bad_threshold": spec.bad_below, "labels": "people", "l2": spec.l2, "folds": report.folds,
              "light_auc": report.light_auc, "combined_auc": report.combined_auc,
              "combined_catch": report.combined_catch, "combined_escalated": report.combined_escalated,
              "auc_gain": gain.estimate, "auc_gain_low": gain.low}
    rule = dc.replace(rule, checksum=weights_checksum(paths), fitted=fitted)
    write_rule(paths[0], rule)
    text = (f"{verb} on {len(rows.bad)} held-out Level-1 answers ({sum(rows.bad)} bad under {spec.bad_below:g}) "
            f"on {', '.join(rule.features)}, escalating at P(bad) >= {rule.threshold:.3f} for a "
            f"{spec.target_catch:.0%} catch of those labelled bad; out of fold AUC "
            f"{_num(report.combined_auc)} (the light score's {_num(report.light_auc)}; gain {gain.estimate:+.3f}, "
            f"one-sided {(1 + GAIN_LEVEL) / 2:.0%} lower bound {gain.low:+.3f})")
    progress(f"escalation rule of {candidate.version}: {text}")
    return text


def _scored_rows(held: Sequence[Mapping[str, Any]], read_kept: Callable[[Sequence[str]], Mapping[str, StoredSignals]],
                 paths: list[str], bad_below: float) -> RefitRows:
    """The held-out labels whose answers have kept signals, scored by the light RM ``paths`` as svc_reward
    scores (raw)."""
    from svc_reward.models import RewardModels

    kept = read_kept([content_hash(str(row["response"])) for row in held])
    labelled = [(row, kept[h]) for row in held if (h := content_hash(str(row["response"]))) in kept]
    if not labelled:
        return refit_rows([], [], [], bad_below)
    scored = RewardModels(paths, None, live_scoring_options()).score(
        [str(row["prompt"]) for row, _ in labelled], [str(row["response"]) for row, _ in labelled])
    return refit_rows(labelled, scored.rewards, scored.spreads, bad_below)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
