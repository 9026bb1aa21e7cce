"""A refresh turn refits the escalation rule for its candidate light RM (issue 61, item 2).

A rule is bound to the light RM's weights (its ``light`` and ``spread`` features are that RM's scores), so
a promoted candidate without one of its own would be served the single threshold. When the version in
service has a rule, the turn refits it on what production has: people's scores of Level-1 answers (the
desk's ``annotate_level1_share``, a fair sample of Level-1's answers whatever their route), re-scored by
the candidate, with the other signals the reward worker kept for each (``svc_reward.signals_store``).

Only the turn's held-out slice is used: the candidate was trained on the rest, so its scores there would
read better than they will live. The rule keeps the features, target catch, penalty and bad-label line of
the rule in service; nothing is selected on so few labels. Audited answers are not used: the audit draws
from the answers that passed, which would teach the rule a world without the ones it escalates.
"""

from __future__ import annotations

import dataclasses as dc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata.contract.checksums import weights_checksum
from strata.hashing import content_hash
from strata_tools.rm.escalation import live_scoring_options
from svc_reward.calibration_store import write_rule
from svc_reward.escalation_rule import EscalationRule, RuleReport, evaluate_rule, features, fit_rule
from svc_reward.signals_store import StoredSignals

DEFAULT_BAD_BELOW = 1.5  # `strata calibrate rule --bad-threshold`'s default, for a rule that does not say its own


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


def refit(current: EscalationRule, rows: RefitRows, min_answers: int, min_bad: int, seed: int = 0
          ) -> tuple[EscalationRule, RuleReport | None] | str:
    """The rule in service refitted on ``rows`` (its features, target catch and penalty; no checksum yet) with
    its out-of-fold report (None when the folds cannot judge it), or why it cannot be refitted."""
    n_bad = sum(rows.bad)
    if len(rows.bad) < min_answers or n_bad < min_bad or n_bad == len(rows.bad):
        return (f"{len(rows.bad)} labelled Level-1 answers with kept signals held out, {n_bad} bad; at least "
                f"{min_answers} and {min_bad} bad (rule_min_answers, rule_min_bad) to refit the escalation rule")
    l2 = float(current.fitted.get("l2", 1.0))
    narrowed = [{name: row.get(name) for name in current.features} for row in rows.features]
    try:
        rule = fit_rule(narrowed, rows.bad, current.target_catch, names=current.features, l2=l2)
    except ValueError as exc:
        return f"the escalation rule cannot be refitted on these labels: {exc}"
    if not rule.features:
        return "every signal of the rule in service is constant on these labels: nothing to refit on"
    try:
        report: RuleReport | None = evaluate_rule(narrowed, rows.bad, rows.groups, current.target_catch,
                                                  folds=5, l2=l2, seed=seed)
    except ValueError:  # a fold without both kinds of answer: the fit stands, its report does not
        report = None
    return rule, report


def carry_rule(current_paths: Sequence[Any], candidate: Any, held: Sequence[Mapping[str, Any]],
               read_kept: Callable[[Sequence[str]], Mapping[str, StoredSignals]], min_answers: int, min_bad: int,
               bad_below: float | None = None, seed: int = 0,
               progress: Callable[[str], None] = print) -> str:
    """Refit and store the candidate light RM's escalation rule when the version in service has one.
    ``read_kept`` gives the kept signals of the answers by response hash (Redis in a turn). Returns the
    ``TurnReport.rule`` text: "" (the version in service has no rule), "refitted ...", or why not."""
    from svc_reward.models import RewardModels, served_rule

    current = served_rule([str(p) for p in current_paths])
    if current is None:
        return ""
    kept = read_kept([content_hash(str(row["response"])) for row in held])
    labelled = [(row, kept[h]) for row in held if (h := content_hash(str(row["response"]))) in kept]
    paths = [str(p) for p in candidate.paths]
    if labelled:
        scored = RewardModels(paths, None, live_scoring_options()).score(
            [str(row["prompt"]) for row, _ in labelled], [str(row["response"]) for row, _ in labelled])
        rewards, spreads = scored.rewards, scored.spreads
    else:
        rewards, spreads = [], []
    line = bad_below if bad_below is not None else float(current.fitted.get("bad_threshold", DEFAULT_BAD_BELOW))
    rows = refit_rows(labelled, rewards, spreads, line)
    result = refit(current, rows, min_answers, min_bad, seed)
    if isinstance(result, str):
        progress(f"escalation rule of {candidate.version}: not refitted ({result}); it will escalate on the "
                 "threshold if promoted")
        return f"not refitted: {result}"
    rule, report = result
    fitted = {"source": "strata rm refresh", "at": time.time(), "answers": len(rows.bad), "bad": sum(rows.bad),
              "bad_threshold": line, "labels": "people", "l2": float(current.fitted.get("l2", 1.0)),
              **({} if report is None else {"folds": report.folds, "light_auc": report.light_auc,
                                            "combined_auc": report.combined_auc,
                                            "combined_catch": report.combined_catch,
                                            "combined_escalated": report.combined_escalated})}
    rule = dc.replace(rule, checksum=weights_checksum(paths), fitted=fitted)
    write_rule(paths[0], rule)
    figures = ("" if report is None or report.combined_auc is None
               else f"; out of fold AUC {report.combined_auc:.3f} (the light score's "
                    f"{_num(report.light_auc)})")
    text = (f"refitted on {len(rows.bad)} held-out Level-1 answers ({sum(rows.bad)} bad under {line:g}) on "
            f"{', '.join(rule.features)}, escalating at P(bad) >= {rule.threshold:.3f}{figures}")
    progress(f"escalation rule of {candidate.version}: {text}")
    return text


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
