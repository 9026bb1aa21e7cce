"""``strata calibrate escalation`` / ``unsafe``: thresholds and detectors measured before they are served.

``escalation``: the escalation threshold for a target bad-case catch rate (R3).

On a validation split the bench never uses (the suite's ``fresh`` prompts by default), the zoo's
probe proposes directions, Level-1 answers with the generator's default sampling, the served light
RM scores each answer and the oracle judges it. Prompts the probe would send straight to Level-2
are left out: no threshold applies to them. The command prints the trade-off (catch rate, false
escalations and the share escalated per threshold) and the lowest threshold that reaches
``--target-catch``, as the setting to give the reward service.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata.errors import CliError

if TYPE_CHECKING:  # torch and the services' settings: imported by the run, not by `strata calibrate --help`
    from strata_tools.zoo.build import ZooPaths
    from strata_tools.zoo.suite import PromptRecord
    from svc_probe.config import ProbeSettings
    from svc_probe.core import ProbeResult
    from svc_reward.calibrate import OperatingPoint
    from svc_reward.config import RewardSettings


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
    escalation.add_argument("--json", action="store_true", help="machine-readable output")
    escalation.set_defaults(func=run_escalation)
    unsafe = sub.add_parser("unsafe", help="the unsafe-advice detector against the oracle on the suite's answers")
    unsafe.add_argument("--split", default="fresh", choices=("fresh", "eval", "train", "all"),
                        help="prompts whose answers are judged")
    unsafe.add_argument("--seed", type=int, default=0)
    unsafe.add_argument("--json", action="store_true", help="machine-readable output")
    unsafe.set_defaults(func=run_unsafe)


def run_unsafe(args: argparse.Namespace) -> int:
    from collections import defaultdict

    from strata.risk import detect_unsafe_advice
    from strata_tools.zoo.corpus import DEGRADATIONS, RISK_ONLY_DEGRADATIONS, degrade, reference_response
    from strata_tools.zoo.oracle import judge
    from strata_tools.zoo.suite import load_suite
    from svc_reward.calibrate import detection_figures

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
    scores: list[float]          # the light RM's reward of each Level-1 answer
    bad: list[bool]              # whether the oracle scores that answer under --bad-threshold
    chosen: float
    current: float               # the reward service's threshold now
    points: list[OperatingPoint]


def _level1_records(records: list[PromptRecord], probe_settings: ProbeSettings,
                    zoo: ZooPaths) -> list[tuple[PromptRecord, ProbeResult]]:
    """The prompts the zoo's probe leaves to Level-1 (not cautious), each with its probe result."""
    from strata.models.loading import load_causal_lm
    from svc_probe.core import ProbeRules, probe

    rules = ProbeRules.of(probe_settings)
    probe_lm = load_causal_lm(zoo.probe, device="cpu")
    results = probe(probe_lm, [r.text for r in records], rules, probe_settings.max_prompt_tokens)
    level1_records = [(r, res) for r, res in zip(records, results, strict=True) if not res.caution]
    if not level1_records:
        raise CliError("the probe sends every prompt to Level-2; nothing to calibrate")
    return level1_records


def _score_level1(args: argparse.Namespace, zoo: ZooPaths, level1_records: list[tuple[PromptRecord, ProbeResult]],
                  reward_settings: RewardSettings) -> tuple[list[float], list[bool]]:
    """Level-1's answers with the generator's default sampling: the light RM's scores, and which are bad cases."""
    from strata.models.generation import SamplingConfig, generate
    from strata.models.loading import load_causal_lm
    from strata_tools.zoo.oracle import judge
    from svc_generator.config import GeneratorSettings
    from svc_reward.models import RewardModels, ScoringOptions

    defaults = GeneratorSettings().sampling_defaults()
    sampling = SamplingConfig(defaults.temperature, defaults.top_p, defaults.max_new_tokens, args.seed)
    level1 = load_causal_lm(zoo.level1, device="cpu")
    answers = generate(level1, [r.text for r, _ in level1_records],
                       [tuple(n for n, _ in res.directions) for _, res in level1_records], sampling)
    options = dataclasses.replace(ScoringOptions.of(reward_settings), device="cpu", dtype="auto")
    rms = RewardModels([str(zoo.light_rm)], None, options)
    scores = rms.score([r.text for r, _ in level1_records], [a.text for a in answers]).rewards
    oracle = [judge(r, a.text).score for (r, _), a in zip(level1_records, answers, strict=True)]
    bad = [o < args.bad_threshold for o in oracle]
    return scores, bad


def _print_escalation(args: argparse.Namespace, measured: _Escalation) -> None:
    """The trade-off table, the current and chosen thresholds marked, and how to serve the chosen one."""
    chosen = measured.chosen
    print(f"zoo {measured.zoo}; {args.split} split: {measured.prompts} prompts, {measured.prompts - measured.level1} "
          f"cautious (Level-2 whatever the threshold), {len(measured.scores)} Level-1 answers, {sum(measured.bad)} bad "
          f"(oracle < {args.bad_threshold})")
    print(f"{'threshold':>10} {'catch':>7} {'false esc':>10} {'escalated':>10}")
    for p in measured.points:
        mark = "  <- current" if p.threshold == measured.current else ""
        mark += "  <- chosen" if p.threshold == chosen else ""
        catch = "-" if p.catch is None else f"{p.catch:.1%}"
        false = "-" if p.false_escalation is None else f"{p.false_escalation:.1%}"
        print(f"{p.threshold:>10.3f} {catch:>7} {false:>10} {p.escalated_share:>10.1%}{mark}")
    print(f"lowest threshold catching {args.target_catch:.0%} of bad cases: {chosen:.3f}; serve it with "
          f"STRATA_ESCALATION_THRESHOLD={chosen:.3f} (svc_reward --escalation-threshold)")


def run_escalation(args: argparse.Namespace) -> int:
    from strata.config import StrataSettings
    from strata_tools.zoo.build import ensure_zoo
    from strata_tools.zoo.suite import load_suite
    from svc_probe.config import ProbeSettings
    from svc_reward.calibrate import operating_points, threshold_for_catch
    from svc_reward.config import RewardSettings

    if args.prompts < 10 or not 0 < args.target_catch <= 1:
        raise CliError("--prompts must be >= 10 and --target-catch in (0, 1]")
    settings = StrataSettings()
    zoo = ensure_zoo(settings)
    records = load_suite(args.split)
    records = random.Random(args.seed).sample(records, min(args.prompts, len(records)))
    probe_settings, reward_settings = ProbeSettings(), RewardSettings()
    level1_records = _level1_records(records, probe_settings, zoo)
    scores, bad = _score_level1(args, zoo, level1_records, reward_settings)
    try:
        chosen = threshold_for_catch(scores, bad, args.target_catch)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    grid = sorted({round(2.0 + 0.2 * i, 1) for i in range(11)} | {reward_settings.escalation_threshold, chosen})
    measured = _Escalation(zoo.root.name, len(records), len(level1_records), scores, bad, chosen,
                           reward_settings.escalation_threshold, operating_points(scores, bad, grid))
    if args.json:
        print(json.dumps({
            "zoo": measured.zoo, "split": args.split, "answers": len(measured.scores), "bad_cases": sum(measured.bad),
            "cautious_left_out": measured.prompts - measured.level1, "target_catch": args.target_catch,
            "threshold": measured.chosen, "current_threshold": measured.current,
            "points": [p.__dict__ for p in measured.points],
        }, indent=2))
        return 0
    _print_escalation(args, measured)
    return 0
