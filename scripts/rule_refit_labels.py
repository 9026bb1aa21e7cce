"""Does a rule refitted on people's labels keep what the rule fitted on the oracle's buys? (issue 61, item 2)

A refresh turn refits the escalation rule in service on people's scores of a few dozen held-out Level-1
answers (``strata_tools.rm.rule_refit``). This reads what such a refit keeps, on the default zoo:

1. Level-1's answers to the validation (``fresh``) and sealed test splits, prompted, scored and given their
   neighbourhood's record as ``strata calibrate rule --record-rounds`` gives them (the same code).
2. The reference: the rule ``calibrate rule`` fits on every validation answer's oracle label, and the light
   RM's threshold chosen there.
3. The refit: ``--draws`` times per size n, n validation answers drawn at random, scored by a simulated
   person (the oracle, noise sd 0.3, rounded to halves: ``SimulatedAnnotator``'s), refitted by the refresh's
   own ``refit`` with the reference in service (its features, target catch and penalty), or with ``--first``
   fitted as a first rule (``strata rm refresh --fit-rule``); a refit the refresh would refuse (too few bad
   answers, or no better than the light score out of fold) is counted, not read.
4. Each rule read on the sealed test split (nothing fitted there): AUC, catch and share escalated.

    STRATA_ZOO_PRESET=default .venv/bin/python scripts/rule_refit_labels.py --label-share 0.2
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from strata.config import StrataSettings

BAD_BELOW, TARGET_CATCH = 1.5, 0.9


def person(oracle: float, rng: random.Random, noise_sd: float = 0.3) -> float:
    """``SimulatedAnnotator.annotate`` without drift or tic tolerance, from the oracle's score."""
    return min(5.0, max(0.0, round((oracle + rng.gauss(0.0, noise_sd)) / 0.5) * 0.5))


def spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    low, high = ordered[int(0.1 * (len(ordered) - 1))], ordered[int(0.9 * (len(ordered) - 1))]
    return f"{statistics.median(ordered):.3f} [{low:.3f}, {high:.3f}]"


def refits(fresh: Any, test: Any, reference: Any, threshold: float, args: argparse.Namespace) -> None:
    """Per size: ``args.draws`` refits of ``reference`` on that many validation answers scored by a simulated
    person, each read on the test split; one line of medians and percentiles."""
    from strata_tools.rm.escalation import held_out
    from strata_tools.rm.rule_refit import RefitRows, RuleSpec, refit

    rng = random.Random(args.seed + 1)
    for size in (int(s) for s in args.sizes.split(",")):
        aucs, catches, shares, few, no_better, agree = [], [], [], 0, 0, []
        for _ in range(args.draws):
            chosen = rng.sample(range(len(fresh.scores)), min(size, len(fresh.scores)))
            rows = RefitRows([fresh.features[i] for i in chosen],
                             [person(fresh.oracle[i], rng) < BAD_BELOW for i in chosen],
                             [fresh.families[i] for i in chosen])
            spec = RuleSpec.first() if args.first else RuleSpec.of(reference)
            result = refit(spec, rows, min_answers=min(size, 40), min_bad=args.min_bad,
                           seed=args.seed)
            if isinstance(result, str):
                no_better += "no better" in result
                few += "no better" not in result
                continue
            figures = held_out(test, result[0], threshold, BAD_BELOW, args.seed)
            aucs.append(figures.rule_auc.estimate)
            catches.append(figures.rule_catch.estimate)
            shares.append(figures.rule_escalated.estimate)
            agree.append(sum(x == y for x, y in zip(
                (result[0].escalates(f) for f in test.features), (reference.escalates(f) for f in test.features),
                strict=True)) / len(test.features))
        print(f"refit on {size} people-labelled answers ({args.draws} draws; refused: {few} under {args.min_bad} bad, "
              f"{no_better} ranking no better than the light score out of fold): test AUC {spread(aucs)}, "
              f"catches {spread(catches)}, escalates {spread(shares)}, "
              f"agrees with the reference on {spread(agree)} of the answers (median [10th, 90th percentile])")


def main() -> int:
    from strata_tools.rm.escalation import (
        RecordHistory,
        choose_threshold,
        fit_escalation_rule,
        held_out,
        judge_level1,
        live_scoring_options,
    )
    from strata_tools.zoo.build import ensure_zoo

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record-rounds", type=int, default=3)
    parser.add_argument("--label-share", type=float, default=0.2, help="share of earlier answers behind the record")
    parser.add_argument("--prompts", type=int, default=280)
    parser.add_argument("--sizes", default="40,80,160", help="labelled answers per refit, comma-separated")
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--min-bad", type=int, default=8, help="the refresh's --rule-min-bad")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", action="store_true", help="fit a first rule (`strata rm refresh --fit-rule`: the "
                        "light score and the record) instead of refitting the reference's features")
    parser.add_argument("--cache", type=Path, default=None, help="keep the judged answers here (a pickle) and reuse "
                        "them: the refits rerun in seconds")
    args = parser.parse_args()

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    zoo = ensure_zoo(StrataSettings())
    light, options = [str(zoo.light_rm)], live_scoring_options()
    history = RecordHistory(args.record_rounds, args.label_share)
    if args.cache is not None and args.cache.exists():
        fresh, test = pickle.loads(args.cache.read_bytes())
    else:
        fresh = judge_level1(zoo, "fresh", args.prompts, args.seed, light, options, history, say)
        test = judge_level1(zoo, "test", args.prompts, args.seed, light, options, history, say, report_only=True)
        if args.cache is not None:
            args.cache.write_bytes(pickle.dumps((fresh, test)))
    reference = fit_escalation_rule(fresh, BAD_BELOW, TARGET_CATCH, seed=args.seed).rule
    threshold = choose_threshold(fresh, BAD_BELOW, TARGET_CATCH).threshold
    ref = held_out(test, reference, threshold, BAD_BELOW, args.seed)
    print(f"validation: {len(fresh.scores)} Level-1 answers, {sum(fresh.bad(BAD_BELOW))} bad; test: "
          f"{ref.answers} answers, {ref.bad} bad, {ref.families} families; record: {args.record_rounds} rounds at "
          f"{args.label_share:.0%} labelled")
    print(f"reference rule (oracle labels of all {len(fresh.scores)} validation answers) on "
          f"{', '.join(reference.features)}")
    print(f"  test: light threshold AUC {ref.light_auc}, catches {ref.light_catch}, escalates {ref.light_escalated}")
    print(f"  test: reference rule  AUC {ref.rule_auc}, catches {ref.rule_catch}, escalates {ref.rule_escalated}")
    refits(fresh, test, reference, threshold, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
