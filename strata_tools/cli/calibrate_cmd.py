"""``strata calibrate escalation`` / ``unsafe``: thresholds and detectors measured before they are served.

``escalation``: the escalation threshold for a target bad-case catch rate (R3).

On a validation split the bench never uses (the suite's ``fresh`` prompts by default), the zoo's
probe proposes directions, Level-1 answers with the generator's default sampling, the served light
RM scores each answer and the oracle judges it. Prompts the probe would send straight to Level-2
are left out: no threshold applies to them. The command prints the trade-off (catch rate, false
escalations and the share escalated per threshold) and the lowest threshold that reaches
``--target-catch``, as the setting to give the reward service.

It also fits the light RM's score calibration: an isotonic map of its raw score onto the oracle's
0-5 scale (``strata_tools.rm.calibration.fit_isotonic``), with its mean absolute error against the oracle
(in-sample and cross-validated) and the chosen threshold on the calibrated scale. ``--write``
stores it beside the light RM's weights (``strata_calibration.json`` in the first member's
directory) and in the RM registry under that version; svc_reward serves it whenever it loads that
version (at start, or when the version is promoted), and then compares the escalation threshold
with the calibrated score (``use_calibration``).

``unsafe``: the reward service's unsafe-advice detector (``strata.risk.detect_unsafe_advice``, R12)
against the oracle's unsafe judgement on the suite's answers: each prompt's reference answer and
every degradation of it the zoo trains on (unsafe advice and missing caution on risk prompts only).
Recall on the unsafe answers, false positives on the others, per degradation kind.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from strata.config import StrataSettings
from strata.contract.checksums import version_id, weights_checksum
from strata.errors import CliError
from strata.risk import detect_unsafe_advice
from strata_tools.rm.calibration import (
    OperatingPoint,
    cross_validated_error,
    detection_figures,
    fit_isotonic,
    mean_absolute_error,
    operating_point,
    operating_points,
    printable_threshold,
    threshold_for_catch,
)
from strata_tools.rm.escalation import (
    HeldOut,
    RecordHistory,
    choose_threshold,
    fit_escalation_rule,
    held_out,
    judge_level1,
    live_scoring_options,
)
from strata_tools.rm.versions import open_registry
from strata_tools.task.corpus import DEGRADATIONS, RISK_ONLY_DEGRADATIONS, degrade, reference_response
from strata_tools.task.oracle import judge
from strata_tools.task.suite import load_suite
from svc_reward.calibration_store import write_calibration, write_rule
from svc_reward.escalation_rule import EscalationRule, RuleReport

if TYPE_CHECKING:  # torch and the services' settings: imported by the run, not by `strata calibrate --help`
    from svc_reward.calibrate import ScoreCalibration
    from svc_reward.models import ScoringOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("calibrate", help="choose thresholds from measurements (escalation)")
    sub = parser.add_subparsers(dest="calibrate_what", metavar="WHAT", required=True)
    escalation = sub.add_parser("escalation", help="the light-RM escalation threshold for a target catch rate",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    escalation.add_argument("--split", default="fresh", choices=("fresh", "eval", "train"),
                            help="validation prompts (fresh: held out from the zoo's training and the benches)")
    escalation.add_argument("--prompts", type=int, default=200, help="prompts to answer (risk ones included)")
    escalation.add_argument("--bad-threshold", type=float, default=1.5,
                            help="oracle score under which a Level-1 answer is a bad case")
    escalation.add_argument("--target-catch", type=float, default=0.9, help="share of bad cases to escalate")
    escalation.add_argument("--seed", type=int, default=0)
    escalation.add_argument("--light-rm", default=None, metavar="DIR[,DIR...]",
                            help="light RM to calibrate, several directories for an ensemble (default: the zoo's)")
    escalation.add_argument("--write", action="store_true",
                            help="store the score calibration with the light RM (its first directory) and in the "
                                 "RM registry: svc_reward serves it when it loads that RM")
    escalation.add_argument("--json", action="store_true", help="machine-readable output")
    escalation.set_defaults(func=run_escalation)
    rule = sub.add_parser("rule", help="a learned escalation rule on several signals (issue 61), beside the threshold")
    rule.add_argument("--split", default="fresh", choices=("fresh", "train"),
                      help="the prompts it is fitted and cross-validated on (fresh: the validation split)")
    rule.add_argument("--prompts", type=int, default=280, help="prompts to answer (risk ones included)")
    rule.add_argument("--bad-threshold", type=float, default=1.5,
                      help="oracle score under which a Level-1 answer is a bad case")
    rule.add_argument("--target-catch", type=float, default=0.9, help="share of bad answers the rule escalates")
    rule.add_argument("--folds", type=int, default=5, help="cross-validation folds, split by paraphrase family")
    rule.add_argument("--l2", type=float, default=1.0, help="L2 penalty of the logistic regression")
    rule.add_argument("--all-features", action="store_true",
                      help="fit on every signal; default: forward selection from the light score, keeping a "
                           "signal only where it raises the out-of-fold AUC")
    rule.add_argument("--record-rounds", type=int, default=0, metavar="N",
                      help="earlier rounds of Level-1 answers to the same prompts behind each answer's neighbourhood "
                           "record (the epochs a run has seen; strata_tools.rm.record); 0 (the default): no record "
                           "signal. At the default 5 %% of answers labelled the record did not pay on the sealed "
                           "test split; with --label-share 0.2 it did (docs/tiers.md)")
    rule.add_argument("--label-share", type=float, default=None, metavar="SHARE",
                      help="share of those answers people label (default: the reward service's "
                           "annotate_level1_share, what it sends to the desk)")
    rule.add_argument("--report-on", choices=("test",), default=None,
                      help="then read the rule and the light RM's threshold, both chosen on --split, on the sealed "
                           "test split's Level-1 answers (nothing fitted there), with intervals over families")
    rule.add_argument("--seed", type=int, default=0)
    rule.add_argument("--light-rm", default=None, metavar="DIR[,DIR...]",
                      help="light RM whose rule this is, several directories for an ensemble (default: the zoo's)")
    rule.add_argument("--write", action="store_true",
                      help="store the rule with the light RM (its first directory): svc_reward then escalates by "
                           "it whenever it serves that RM, and by the threshold where an answer lacks a signal")
    rule.add_argument("--json", action="store_true", help="machine-readable output")
    rule.set_defaults(func=run_rule)
    unsafe = sub.add_parser("unsafe", help="the unsafe-advice detector against the oracle on the suite's answers")
    unsafe.add_argument("--split", default="fresh", choices=("fresh", "eval", "train", "all"),
                        help="prompts whose answers are judged")
    unsafe.add_argument("--seed", type=int, default=0)
    unsafe.add_argument("--json", action="store_true", help="machine-readable output")
    unsafe.set_defaults(func=run_unsafe)


def run_unsafe(args: argparse.Namespace) -> int:

    records = load_suite(None if args.split == "all" else args.split)
    rng = random.Random(args.seed)
    labels: list[bool] = []
    flags: list[bool] = []
    by_kind: dict[str, list[tuple[bool, bool]]] = defaultdict(list)
    for record in records:
        reference = reference_response(record, rng)
        kinds = [k for k in DEGRADATIONS if record.risk or k not in RISK_ONLY_DEGRADATIONS]
        for kind, response in [("reference", reference), *((k, degrade(record, reference, k, rng)) for k in kinds)]:
            label = bool(judge(record, response).breakdown["unsafe"])
            flag = detect_unsafe_advice(response) is not None
            labels.append(label)
            flags.append(flag)
            by_kind[kind].append((label, flag))
    figures = detection_figures(labels, flags)
    if args.json:
        print(json.dumps({"split": args.split, "prompts": len(records), **figures.__dict__,
                          "flag_rate_by_kind": {k: sum(f for _, f in v) / len(v) for k, v in by_kind.items()}}))
        return 0

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    print(f"suite split {args.split}: {len(records)} prompts ({sum(r.risk for r in records)} risk), "
          f"{figures.items} answers, {figures.positives} unsafe by the oracle")
    print(f"unsafe-advice detector: recall {pct(figures.recall)}, false positives {pct(figures.false_positive_rate)}, "
          f"precision {pct(figures.precision)}")
    print(f"{'answer':<14} {'answers':>8} {'unsafe':>7} {'flagged':>8}")
    for kind, rows in by_kind.items():
        print(f"{kind:<14} {len(rows):>8} {sum(y for y, _ in rows):>7} {pct(sum(f for _, f in rows) / len(rows)):>8}")
    return 0


@dataclass(frozen=True)
class _Escalation:
    """What ``calibrate escalation`` measured, and the threshold it chose."""

    zoo: str                     # the zoo directory's name
    prompts: int                 # prompts sampled from the split
    level1: int                  # of them, those the probe leaves to Level-1
    scores: list[float]          # the light RM's raw reward of each Level-1 answer
    oracle: list[float]          # the oracle's score of that answer
    bad: list[bool]              # whether the oracle scores that answer under --bad-threshold
    chosen: float
    current: float               # the reward service's threshold now
    points: list[OperatingPoint]


@dataclass(frozen=True)
class _Calibrated:
    """The light RM's score calibration fitted on the same answers, and the threshold on its scale."""

    calibration: ScoreCalibration
    chosen: float                # the lowest calibrated threshold that reaches --target-catch
    point: OperatingPoint        # at ``chosen``, on the calibrated scores
    current_point: OperatingPoint  # the service's threshold, compared with the calibrated scores
    mae_raw: float               # mean |raw - oracle|
    mae_calibrated: float        # mean |calibrated - oracle|, in-sample
    mae_cross_validated: float | None  # the same on answers each fold's fit did not see


def _calibrate(args: argparse.Namespace, measured: _Escalation, light_paths: list[str],
               options: ScoringOptions) -> _Calibrated:

    source = f"oracle, {args.split} split, {len(measured.scores)} Level-1 answers, zoo {measured.zoo}"
    try:
        calibration = fit_isotonic(measured.scores, measured.oracle, checksum=weights_checksum(light_paths),
                                   source=source, temperature=options.temperature, aggregation=options.aggregation)
    except ValueError as exc:
        raise CliError(f"cannot calibrate the light RM's score: {exc}") from exc
    calibrated = calibration.apply_all(measured.scores)
    # Searched on the calibrated scores rather than taken as calibration.apply(chosen): beyond the end
    # knots the map is flat, and a bad case mapped there equals the mapped threshold, so is not under it.
    chosen = printable_threshold(threshold_for_catch(calibrated, measured.bad, args.target_catch))
    # Stored with the map, so that a reward service with no threshold set serves this one with it.
    calibration = dataclasses.replace(calibration, escalation_threshold=chosen, target_catch=args.target_catch,
                                      bad_threshold=args.bad_threshold)
    return _Calibrated(calibration, chosen, operating_point(calibrated, measured.bad, chosen),
                       operating_point(calibrated, measured.bad, measured.current),
                       mean_absolute_error(measured.scores, measured.oracle),
                       mean_absolute_error(calibrated, measured.oracle),
                       cross_validated_error(measured.scores, measured.oracle, seed=args.seed))


def _write(light_paths: list[str], calibration: ScoreCalibration, json_output: bool) -> tuple[str, str | None]:
    """Write the calibration beside the light RM, then into the registry. The file's path, and the
    version it is registered under (None when Redis did not answer: the file alone is then written)."""
    from svc_reward.registry import RegistryError, UnknownVersionError, describe

    try:
        path = str(write_calibration(light_paths[0], calibration))
    except ValueError as exc:
        raise CliError(f"{exc}. More --prompts, or a light RM that reads these answers") from exc
    except OSError as exc:
        raise CliError(f"cannot write the calibration into {light_paths[0]} ({exc.strerror}): give --light-rm a "
                       "writable copy of the RM, or run where the model directory is writable") from exc
    version = version_id("light", calibration.checksum)
    try:
        registry = open_registry(StrataSettings())
        try:
            registry.get(version)
        except UnknownVersionError:
            registry.register(describe("light", light_paths, config={"source": "strata calibrate escalation"}))
        registry.set_calibration(version, calibration)
    except (CliError, RegistryError, redis.RedisError, OSError) as exc:  # the file is written: never fail now
        print(f"calibration written to {path} only, not to the RM registry ({exc.__cause__ or exc}); svc_reward "
              f"registers it when it starts on this RM, or run this again with --write once Redis answers",
              file=sys.stderr if json_output else sys.stdout)
        return path, None
    return path, version


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _print_escalation(args: argparse.Namespace, measured: _Escalation) -> None:
    """The trade-off table, the current and chosen thresholds marked."""
    chosen = measured.chosen
    print(f"zoo {measured.zoo}; {args.split} split: {measured.prompts} prompts, {measured.prompts - measured.level1} "
          f"cautious (Level-2 whatever the threshold), {len(measured.scores)} Level-1 answers, {sum(measured.bad)} bad "
          f"(oracle < {args.bad_threshold})")
    print(f"{'threshold':>10} {'catch':>7} {'false esc':>10} {'escalated':>10}")
    for p in measured.points:
        mark = "  <- current" if p.threshold == measured.current else ""
        mark += "  <- chosen" if p.threshold == chosen else ""
        print(f"{p.threshold:>10.3f} {_pct(p.catch):>7} {_pct(p.false_escalation):>10} {p.escalated_share:>10.1%}"
              f"{mark}")
    print(f"lowest threshold catching {args.target_catch:.0%} of bad cases: {chosen:.3f} (raw light-RM score)")


def _print_calibration(args: argparse.Namespace, measured: _Escalation, fitted: _Calibrated,
                       written: tuple[str, str | None] | None) -> None:
    """The calibration's fit, the threshold on its scale, and how to serve one or the other."""
    cal, point, current = fitted.calibration, fitted.point, fitted.current_point
    cv = "-" if fitted.mae_cross_validated is None else f"{fitted.mae_cross_validated:.3f}"
    print(f"score calibration (isotonic, {len(cal.raw)} knots, {cal.answers} answers): mean absolute error vs the "
          f"oracle {fitted.mae_raw:.3f} raw, {fitted.mae_calibrated:.3f} calibrated ({cv} cross-validated)")
    print(f"on the calibrated scale: lowest threshold catching {args.target_catch:.0%}: {fitted.chosen:.3f} (catch "
          f"{_pct(point.catch)}, false esc {_pct(point.false_escalation)}, escalated {point.escalated_share:.1%}); "
          f"the current {measured.current:g} there: catch {_pct(current.catch)}, false esc "
          f"{_pct(current.false_escalation)}, escalated {current.escalated_share:.1%}")
    if written is None:
        print(f"serve it with STRATA_ESCALATION_THRESHOLD={measured.chosen:.3f} (svc_reward --escalation-threshold, "
              f"raw score); or --write the calibration, which stores "
              f"{fitted.chosen:.3f} with it: a reward service with no threshold set serves both")
        return
    path, version = written
    print(f"calibration written to {path}{f' and registered with {version}' if version else ''}, with its "
          f"threshold {fitted.chosen:.3f} (calibrated scale): a reward service with no STRATA_ESCALATION_THRESHOLD "
          f"set serves both once it loads this RM (a restart, or a promotion of it)")


def run_escalation(args: argparse.Namespace) -> int:
    from strata_tools.zoo.build import ensure_zoo
    from svc_reward.config import RewardSettings
    from svc_reward.decide import escalation_threshold
    from svc_reward.models import ScoringOptions

    if args.prompts < 10 or not 0 < args.target_catch <= 1:
        raise CliError("--prompts must be >= 10 and --target-catch in (0, 1]")
    settings = StrataSettings()
    zoo = ensure_zoo(settings)
    light_paths = [p.strip() for p in args.light_rm.split(",") if p.strip()] if args.light_rm else [str(zoo.light_rm)]
    if not light_paths:
        raise CliError("--light-rm names no directory")
    reward_settings = RewardSettings()
    options = dataclasses.replace(ScoringOptions.of(reward_settings), device="cpu", dtype="auto")
    judged = judge_level1(zoo, args.split, args.prompts, args.seed, light_paths, options)
    scores, oracle, bad = judged.scores, judged.oracle, judged.bad(args.bad_threshold)
    chosen = choose_threshold(judged, args.bad_threshold, args.target_catch).threshold
    current = escalation_threshold(reward_settings.escalation_threshold, None)  # the typed one, raw
    grid = sorted({round(2.0 + 0.2 * i, 1) for i in range(11)} | {current, chosen})
    measured = _Escalation(zoo.root.name, judged.prompts, len(scores), scores, oracle, bad, chosen,
                           current, operating_points(scores, bad, grid))
    fitted = _calibrate(args, measured, light_paths, options)
    written = _write(light_paths, fitted.calibration, args.json) if args.write else None
    if args.json:
        print(json.dumps(_escalation_json(args, measured, fitted, written), indent=2))
        return 0
    _print_escalation(args, measured)
    _print_calibration(args, measured, fitted, written)
    return 0


def _escalation_json(args: argparse.Namespace, measured: _Escalation, fitted: _Calibrated,
                     written: tuple[str, str | None] | None) -> dict[str, object]:
    return {
        "zoo": measured.zoo, "split": args.split, "answers": len(measured.scores), "bad_cases": sum(measured.bad),
        "cautious_left_out": measured.prompts - measured.level1, "target_catch": args.target_catch,
        "threshold": measured.chosen, "current_threshold": measured.current,
        "points": [p.__dict__ for p in measured.points],
        "calibration": fitted.calibration.to_dict(), "calibrated_threshold": fitted.chosen,
        "calibrated_point": fitted.point.__dict__, "current_threshold_calibrated_point": fitted.current_point.__dict__,
        "mae_raw": fitted.mae_raw, "mae_calibrated": fitted.mae_calibrated,
        "mae_calibrated_cross_validated": fitted.mae_cross_validated,
        "written": written[0] if written else None, "registered": written[1] if written else None,
    }


def run_rule(args: argparse.Namespace) -> int:
    """Fit the escalation rule on the split's Level-1 answers (prompted and scored as live), report what each
    signal buys out of fold against the light RM's score alone, and --write it beside the light RM."""
    from strata_tools.zoo.build import ensure_zoo

    if args.prompts < 20 or not 0 < args.target_catch <= 1 or args.folds < 2:
        raise CliError("--prompts must be >= 20, --target-catch in (0, 1] and --folds >= 2")
    if args.record_rounds < 0 or not (args.label_share is None or 0 <= args.label_share <= 1):
        raise CliError("--record-rounds must be >= 0 and --label-share in [0, 1]")
    history = RecordHistory(args.record_rounds, args.label_share)
    zoo = ensure_zoo(StrataSettings())
    light_paths = [p.strip() for p in args.light_rm.split(",") if p.strip()] if args.light_rm else [str(zoo.light_rm)]
    options = live_scoring_options()
    judged = judge_level1(zoo, args.split, args.prompts, args.seed, light_paths, options, history,
                          lambda line: print(line, file=sys.stderr, flush=True))
    bad = judged.bad(args.bad_threshold)
    fitted = fit_escalation_rule(judged, args.bad_threshold, args.target_catch, args.folds, args.l2, args.seed,
                                 args.all_features)
    report, steps = fitted.report, fitted.steps
    rule = dataclasses.replace(fitted.rule, checksum=weights_checksum(light_paths))
    held = None
    if args.report_on:
        held = held_out(judge_level1(zoo, args.report_on, args.prompts, args.seed, light_paths, options, history,
                                     lambda line: print(line, file=sys.stderr, flush=True), report_only=True),
                        rule, choose_threshold(judged, args.bad_threshold, args.target_catch).threshold,
                        args.bad_threshold, args.seed)
    path = None
    if args.write:
        try:
            path = str(write_rule(light_paths[0], rule))
        except OSError as exc:
            raise CliError(f"cannot write the rule into {light_paths[0]} ({exc.strerror}): give --light-rm a "
                           "writable copy of the RM") from exc
    if args.json:
        print(json.dumps({"zoo": zoo.root.name, "rule": rule.to_dict(), "single_auc": dict(report.single),
                          "written": path, "held_out": None if held is None else dataclasses.asdict(held)},
                         indent=2))
        return 0
    _print_rule(args, zoo.root.name, len(bad), sum(bad), report, rule, steps, path)
    if held is not None:
        _print_held_out(args, held, rule)
    return 0


def _print_held_out(args: argparse.Namespace, held: HeldOut, rule: EscalationRule) -> None:
    print(f"held out: {held.answers} Level-1 answers of the sealed {args.report_on} split ({held.bad} bad, "
          f"{held.families} families), the rule and the light RM's threshold both chosen on {args.split} "
          "(95 % intervals, families resampled):")
    print(f"  light RM score alone: AUC {held.light_auc}, catches {held.light_catch}, escalates "
          f"{held.light_escalated}")
    print(f"  rule on {', '.join(rule.features)}: AUC {held.rule_auc}, catches {held.rule_catch}, escalates "
          f"{held.rule_escalated}")
    print(f"  rule minus threshold: share escalated {held.escalated_difference}, catch {held.catch_difference}")


def _print_rule(args: argparse.Namespace, zoo: str, answers: int, bad: int, report: RuleReport,
                rule: EscalationRule, steps: list[tuple[str, float]], path: str | None) -> None:
    print(f"zoo {zoo}: {answers} Level-1 answers of the {args.split} split, {bad} bad "
          f"(oracle < {args.bad_threshold:g}); out of fold, {report.folds} folds split by paraphrase family")
    if rule.fitted.get("record_rounds"):
        print(f"neighbourhood record: {rule.fitted['record_rounds']} earlier rounds of Level-1 answers to these "
              f"prompts, {rule.fitted['label_share']:.0%} labelled by a simulated annotator, summed over each prompt's "
              "similar neighbours (strata_tools.rm.record)")
    print("signal alone (AUC as a detector of bad answers, either direction):")
    for name, value in report.single.items():
        print(f"  {name:<16} {'-' if value is None else f'{value:.3f}'}")
    if steps:
        print("forward selection (out-of-fold AUC): " + " -> ".join(f"+{n} {a:.3f}" for n, a in steps))
    print(f"out of fold, the threshold of each fold chosen on the others for a {args.target_catch:.0%} catch:")
    print(f"  light RM score alone: AUC {_num(report.light_auc)}, catches {_pct(report.light_catch)}, escalates "
          f"{_pct(report.light_escalated)}")
    print(f"  rule on {', '.join(rule.features)}: AUC {_num(report.combined_auc)}, catches "
          f"{_pct(report.combined_catch)}, escalates {_pct(report.combined_escalated)}")
    weights = ", ".join(f"{n} {w:+.2f}" for n, w in zip(rule.features, rule.weights, strict=True))
    print(f"fitted on all answers: weights per standard deviation {weights}; escalates at P(bad) >= "
          f"{rule.threshold:.3f}")
    print(f"rule written to {path}: svc_reward escalates by it when it serves this light RM" if path else
          "not written (--write stores it beside the light RM)")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
