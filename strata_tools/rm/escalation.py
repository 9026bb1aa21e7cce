"""The light RM as an escalation rule (R3), measured on labelled Level-1 answers.

On a split the benches do not otherwise use (the suite's ``fresh`` prompts), the zoo's probe
proposes directions, Level-1 answers as it does live (``strata_tools.level1``), the light RM scores
each answer and the oracle judges it; prompts the probe sends straight to Level-2 are left out,
since no threshold applies to them. ``strata calibrate escalation`` prints and stores what these
answers say; ``strata bench tiers`` and ``strata demo`` serve the threshold they choose
(``resolve_threshold``), so that their router is calibrated for the RM it runs rather than typed.

With a :class:`RecordHistory`, each answer also carries the neighbourhood's record as the scheduler would
route it on: earlier rounds of Level-1 answers to the same prompts (the epochs a training run has seen),
a share of them labelled by a simulated annotator (drawn by response hash, as svc_reward draws the share
it sends to the desk), summed over each prompt's nearest prompts by the scheduler's own encoder (its
``k`` nearest at cosine ``min_similarity`` or more, the prompt itself included).
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from strata.confidence import logprob_summary
from strata.contract.checksums import weights_checksum
from strata.errors import CliError
from strata_tools.intervals import Interval, cluster_bootstraps
from strata_tools.level1 import LivePrompting, generate_answers, probe_prompts
from strata_tools.rm.calibration import OperatingPoint, operating_point, printable_threshold, threshold_for_catch
from strata_tools.rm.models import ZooModels
from strata_tools.task.oracle import judge
from strata_tools.task.seal import check_sealed
from strata_tools.task.suite import load_suite
from svc_reward.calibration_store import write_rule
from svc_reward.escalation_rule import (
    FEATURES,
    EscalationRule,
    RuleReport,
    Signals,
    auc,
    evaluate_rule,
    features,
    fit_rule,
    record_bad_share,
    select_features,
    signal_aucs,
)

if TYPE_CHECKING:  # torch and the services' settings: imported by the run
    from strata_tools.task.suite import PromptRecord
    from svc_probe.core import ProbeResult
    from svc_reward.models import ScoringOptions


@dataclass(frozen=True)
class JudgedLevel1:
    """Level-1's answers to a split's sample, as the light RM and the oracle score them."""

    split: str
    prompts: int                 # prompts sampled from the split
    scores: list[float]          # the light RM's raw reward of each Level-1 answer
    oracle: list[float]          # the oracle's score of that answer
    # Each answer's escalation features as the reward service computes them live (svc_reward.escalation_rule),
    # and its prompt's paraphrase family (folds of a cross-validation split by family).
    features: list[dict[str, float | None]] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    history: RecordHistory | None = None  # what each answer's record is made of (resolved), when it has one
    # The answers themselves, for other judges to score the same ones (``scripts/escalation_ceiling.py``).
    prompt_texts: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)

    def bad(self, bad_threshold: float) -> list[bool]:
        """Whether the oracle scores each answer under ``bad_threshold`` (a bad case)."""
        return [o < bad_threshold for o in self.oracle]


@dataclass(frozen=True)
class ChosenThreshold:
    """The lowest raw light-RM threshold that escalates ``target_catch`` of the bad cases."""

    threshold: float             # rounded up to the 3 decimals printed (still catching)
    target_catch: float
    bad_threshold: float
    bad_cases: int
    point: OperatingPoint        # catch, false escalations and share escalated at ``threshold``

    def describe(self, judged: JudgedLevel1) -> str:
        p = self.point
        return (f"{self.threshold:.3f} (raw light-RM score): the lowest catching {self.target_catch:.0%} of the "
                f"{self.bad_cases} bad cases (oracle < {self.bad_threshold:g}) among {len(judged.scores)} Level-1 "
                f"answers of the {judged.split} split; there it catches {_pct(p.catch)} and escalates "
                f"{p.escalated_share:.1%} of the answers")


@dataclass(frozen=True)
class RecordHistory:
    """The labelled history behind each answer's neighbourhood record (``strata_tools.rm.record``)."""

    rounds: int                        # earlier rounds of Level-1 answers to the same prompts
    label_share: float | None = None   # share of them people label; None: svc_reward's annotate_level1_share
    bad_below: float | None = None     # a label under this says bad; None: the scheduler's record_bad_below


CALIBRATED, SERVED = "calibrated", "served"
CALIBRATION_PROMPTS = 200  # `strata calibrate escalation`'s default


@dataclass(frozen=True)
class ServedThreshold:
    value: float                 # the raw light-RM score under which Level-1 answers escalate
    source: str                  # where it comes from, for the report


def add_threshold_arguments(parser: argparse.ArgumentParser) -> None:
    """``--escalation-threshold``, ``--target-catch``, ``--calibration-split``: the threshold a run serves."""
    parser.add_argument("--escalation-threshold", default=CALIBRATED, metavar="calibrated|served|X",
                        help="the light-RM threshold served (raw score): calibrated (default) measures the lowest "
                             "catching --target-catch of the bad cases on the --calibration-split's Level-1 answers, "
                             "as `strata calibrate escalation` does; served: the reward service's setting "
                             "(STRATA_ESCALATION_THRESHOLD, else the brief's 3.2); or a number")
    parser.add_argument("--target-catch", type=float, default=0.9,
                        help="share of bad cases the calibrated threshold escalates on the calibration split")
    parser.add_argument("--calibration-split", default="fresh", choices=("fresh", "train"),
                        help="labelled prompts the calibrated threshold is chosen on (never the eval split)")


def resolve_threshold(args: argparse.Namespace, zoo: ZooModels, light_paths: list[str], bad_threshold: float,
                      seed: int, progress: Callable[[str], None]) -> ServedThreshold:
    """The raw threshold ``args.escalation_threshold`` asks for (the arguments of ``add_threshold_arguments``):
    measured on the calibration split for the light RM ``light_paths`` (a few seconds of Level-1 generation),
    the reward service's setting, or a number."""
    from svc_reward.config import RewardSettings
    from svc_reward.decide import escalation_threshold

    choice = args.escalation_threshold
    if choice == SERVED:
        # Compared with raw scores, so a calibration's stored threshold (calibrated scale) does not apply.
        value = escalation_threshold(RewardSettings().escalation_threshold, None)
        return ServedThreshold(value, f"{value:g}, the reward service's setting (STRATA_ESCALATION_THRESHOLD, "
                                      "else the brief's)")
    if choice != CALIBRATED:
        try:
            value = float(choice)
        except ValueError:
            raise CliError(f"--escalation-threshold must be {CALIBRATED}, {SERVED} or a number, got {choice!r}"
                           ) from None
        if not math.isfinite(value):
            raise CliError(f"--escalation-threshold must be finite, got {choice!r}")
        return ServedThreshold(value, f"{value:g}, given (--escalation-threshold)")
    if not 0 < args.target_catch <= 1:
        raise CliError("--target-catch must be in (0, 1]")
    progress(f"[calibrate] the light RM's escalation threshold on {CALIBRATION_PROMPTS} {args.calibration_split}-split "
             f"prompts' Level-1 answers, for a {args.target_catch:.0%} catch of the bad cases")
    judged = judge_level1(zoo, args.calibration_split, CALIBRATION_PROMPTS, seed, light_paths, live_scoring_options())
    chosen = choose_threshold(judged, bad_threshold, args.target_catch)
    return ServedThreshold(chosen.threshold, f"calibrated, {chosen.describe(judged)}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def judge_level1(zoo: ZooModels, split: str, prompts: int, seed: int, light_paths: list[str],
                 options: ScoringOptions, history: RecordHistory | None = None,
                 progress: Callable[[str], None] = lambda _: None, report_only: bool = False) -> JudgedLevel1:
    """``prompts`` of ``split`` (seeded sample), answered by Level-1 and scored by the light RM ``light_paths``
    (raw scores) and the oracle; with ``history``, each answer's features hold its neighbourhood's record.
    The sealed test split is refused unless ``report_only`` (figures of a rule chosen elsewhere, nothing
    fitted on them). CliError when the probe leaves no prompt to Level-1."""
    records = load_suite(split)
    records = random.Random(seed).sample(records, min(prompts, len(records)))
    if not report_only:
        check_sealed((r.text for r in records), "the escalation threshold's calibration")
    level1_records = _level1_records(records, zoo)
    scores, oracle, features, responses = _score_level1(zoo, level1_records, light_paths, options, seed)
    if history is not None and history.rounds > 0:
        from strata_tools.rm.record import neighbourhood_records

        records_of, history = neighbourhood_records(zoo, records, level1_records, history, seed, progress)
        features = [{**row, "record_bad": record_bad_share(*records_of[r.text])}
                    for row, (r, _) in zip(features, level1_records, strict=True)]
    else:
        history = None
    return JudgedLevel1(split, len(records), scores, oracle, features, [r.family for r, _ in level1_records],
                        history, [r.text for r, _ in level1_records], responses)




def choose_threshold(judged: JudgedLevel1, bad_threshold: float, target_catch: float) -> ChosenThreshold:
    """The raw threshold for ``target_catch``; CliError when the answers hold no bad case."""
    bad = judged.bad(bad_threshold)
    try:
        chosen = printable_threshold(threshold_for_catch(judged.scores, bad, target_catch))
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    return ChosenThreshold(chosen, target_catch, bad_threshold, sum(bad), operating_point(judged.scores, bad, chosen))


def _level1_records(records: list[PromptRecord], zoo: ZooModels) -> list[tuple[PromptRecord, ProbeResult]]:
    """The prompts the zoo's probe leaves to Level-1 (not cautious), each with its probe result."""
    results = probe_prompts(zoo.probe, [r.text for r in records])
    level1_records = [(r, res) for r, res in zip(records, results, strict=True) if not res.caution]
    if not level1_records:
        raise CliError("the probe sends every prompt to Level-2; no Level-1 answer to measure")
    return level1_records


def _score_level1(zoo: ZooModels, level1_records: list[tuple[PromptRecord, ProbeResult]], light_paths: list[str],
                  options: ScoringOptions, seed: int
                  ) -> tuple[list[float], list[float], list[dict[str, float | None]], list[str]]:
    """Level-1's answers, prompted and sampled as the live stack does (``strata_tools.level1``): the light
    RM's raw scores, the oracle's, each answer's escalation features as the reward service reads them
    from the rollout event (the generator's log-probabilities, the members' spread, the answer's form), and
    the answers' texts."""
    from svc_generator.backends.hf import HfBackend
    from svc_reward.models import RewardModels

    prompts = [r.text for r, _ in level1_records]
    prompting = LivePrompting.live(1)
    answers = generate_answers(HfBackend(str(zoo.level1), "cpu"), prompting, prompts,
                               [prompting.directions(res) for _, res in level1_records], seed)
    rms = RewardModels(light_paths, None, options)
    scored = rms.score(prompts, [a.text for a in answers])  # raw: fitted on
    oracle = [judge(r, a.text).score for (r, _), a in zip(level1_records, answers, strict=True)]
    rows = []
    for answer, reward, spread in zip(answers, scored.rewards, scored.spreads, strict=True):
        confidence = logprob_summary(answer.logprobs)
        rows.append(features(Signals(reward, spread, confidence.mean if confidence else None,
                                     confidence.min if confidence else None, len(answer.token_ids),
                                     prompting.sampling.max_new_tokens or 0, answer.text)))
    return scored.rewards, oracle, rows, [a.text for a in answers]


@dataclass(frozen=True)
class FittedRule:
    """An escalation rule fitted on a split's answers, with what chose it."""

    rule: EscalationRule
    report: RuleReport                      # out of fold: each signal alone, the light score, the rule
    steps: list[tuple[str, float]]          # forward selection: (feature added, out-of-fold AUC); empty: all kept


def fit_escalation_rule(judged: JudgedLevel1, bad_threshold: float, target_catch: float, folds: int = 5,
                        l2: float = 1.0, seed: int = 0, all_features: bool = False) -> FittedRule:
    """The rule on the features forward selection keeps (or all), its out-of-fold report, and what it was
    fitted on in ``rule.fitted``. CliError when the answers cannot fit one (too few bad, say)."""
    bad = judged.bad(bad_threshold)
    try:
        steps: list[tuple[str, float]] = []
        names = list(FEATURES)
        if not all_features:
            names, steps = select_features(judged.features, bad, judged.families, target_catch, folds, l2, seed)
        rows = [{n: r.get(n) for n in names} for r in judged.features]
        report = evaluate_rule(rows, bad, judged.families, target_catch, folds, l2, seed)
        rule = fit_rule(rows, bad, target_catch, l2=l2)
        report = replace(report, single=signal_aucs(judged.features, bad))  # every signal, chosen or not
    except ValueError as exc:
        raise CliError(f"{exc} ({sum(bad)} bad of {len(bad)} answers on {judged.split}): more prompts") from exc
    history = judged.history
    return FittedRule(replace(rule, fitted={
        "split": judged.split, "answers": len(bad), "bad": sum(bad), "bad_threshold": bad_threshold, "l2": l2,
        **({"record_rounds": history.rounds, "label_share": history.label_share,
            "record_bad_below": history.bad_below} if history else {}),
        "folds": report.folds, "light_auc": report.light_auc, "combined_auc": report.combined_auc,
        "light_catch": report.light_catch, "light_escalated": report.light_escalated,
        "combined_catch": report.combined_catch, "combined_escalated": report.combined_escalated,
        "selection": [list(step) for step in steps]}), report, steps)


RULE_PROMPTS = 280  # `strata calibrate rule`'s default


def serve_record_rule(zoo: ZooModels, light_dir: Path, split: str, history: RecordHistory, bad_threshold: float,
                      target_catch: float, seed: int, progress: Callable[[str], None]) -> tuple[Path, str]:
    """The escalation rule on the neighbourhood's record, fitted as `strata calibrate rule` fits it on
    ``split`` (``RULE_PROMPTS`` prompts, ``history`` behind each record) and written into ``light_dir``, a
    fresh copy of the zoo's light RM, for a reward service to serve. Returns the copy and a line saying
    what it serves."""
    progress(f"[rule] the escalation rule on {RULE_PROMPTS} {split}-split prompts' Level-1 answers, each with its "
             f"neighbourhood's record ({history.rounds} earlier rounds)")
    judged = judge_level1(zoo, split, RULE_PROMPTS, seed, [str(zoo.rm_light)], live_scoring_options(), history,
                          progress)
    fitted = fit_escalation_rule(judged, bad_threshold, target_catch, seed=seed)
    if light_dir.exists():
        shutil.rmtree(light_dir)
    shutil.copytree(zoo.rm_light, light_dir)
    rule = replace(fitted.rule, checksum=weights_checksum([str(light_dir)]))
    write_rule(light_dir, rule)
    resolved = judged.history or history
    report = fitted.report
    return light_dir, (f"escalation rule served: on {', '.join(rule.features)}, fitted on {len(judged.scores)} "
                       f"{split}-split answers with {resolved.rounds} earlier rounds at {resolved.label_share:.0%} "
                       f"labelled; out of fold AUC {_num(report.combined_auc)} (the light score's "
                       f"{_num(report.light_auc)}), escalating {_pct(report.combined_escalated)} for a catch of "
                       f"{_pct(report.combined_catch)}; Level-1 answers without a record: the threshold")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def live_scoring_options() -> ScoringOptions:
    """How the reward service scores, on the CPU (its settings' defaults)."""
    from svc_reward.config import RewardSettings
    from svc_reward.models import ScoringOptions

    return replace(ScoringOptions.of(RewardSettings()), device="cpu", dtype="auto")


@dataclass(frozen=True)
class HeldOut:
    """A rule and the light threshold, both chosen on another split, read on held-out answers."""

    answers: int
    bad: int
    families: int
    light_auc: Interval
    rule_auc: Interval
    light_catch: Interval
    light_escalated: Interval
    rule_catch: Interval
    rule_escalated: Interval
    escalated_difference: Interval  # rule minus light threshold, paired by answer
    catch_difference: Interval      # the same for the share of bad answers caught


def held_out(judged: JudgedLevel1, rule: EscalationRule, light_threshold: float, bad_threshold: float,
             seed: int = 0) -> HeldOut:
    """``rule`` (its own threshold) against the light score at ``light_threshold`` on ``judged``'s answers, with
    95 % intervals from a bootstrap over paraphrase families. An answer the rule cannot judge (a signal
    missing) is decided by the threshold, as live."""
    bad = judged.bad(bad_threshold)
    light_escalates = [s < light_threshold for s in judged.scores]
    probability = [rule.probability(f) for f in judged.features]
    rule_escalates = [p >= rule.threshold if p is not None else e
                      for p, e in zip(probability, light_escalates, strict=True)]
    risk = [p if p is not None else float(e) for p, e in zip(probability, light_escalates, strict=True)]

    def figures(idx: Sequence[int]) -> list[float]:
        b = [bad[i] for i in idx]
        n_bad = sum(b) or math.nan
        light, ruled = [light_escalates[i] for i in idx], [rule_escalates[i] for i in idx]
        return [_nan_if_none(auc([-judged.scores[i] for i in idx], b)), _nan_if_none(auc([risk[i] for i in idx], b)),
                sum(e for e, x in zip(light, b, strict=True) if x) / n_bad, sum(light) / len(idx),
                sum(e for e, x in zip(ruled, b, strict=True) if x) / n_bad, sum(ruled) / len(idx),
                (sum(ruled) - sum(light)) / len(idx),
                sum(r - e for r, e, x in zip(ruled, light, b, strict=True) if x) / n_bad]

    intervals = cluster_bootstraps(figures, judged.families, seed)
    return HeldOut(len(bad), sum(bad), len(set(judged.families)), *intervals)


def _nan_if_none(value: float | None) -> float:
    return math.nan if value is None else value
