"""How far can escalation on the first pass go? Bounds on issue 61's targets from the signals the system has.

Level-1 answers the sealed test split as live (``strata calibrate rule``'s code: the probe's directions,
rollout dropout, one answer a prompt); each answer carries every signal the reward service decides on (the
light RM's score, the generator's log-probabilities, the answer's form, and with ``--record-rounds`` the
neighbourhood's record), and is scored again by the zoo's strong RM, by its trunk before growth and by every
``--member``. With ``--siblings K``, Level-1 answers each prompt K more times as live (another seed each),
and the light RM's mean over those siblings is one more signal (not served; measured here): what an RLHF
request's group of samples says of its prompt before any label (GRPO and RLOO sample several answers a
prompt). Level-2's expected score on each prompt is the mean oracle of ``--level2-samples`` answers,
sampled as ``strata bench tiers`` samples them (the same function).

Everything below is chosen **on the answers it reads**: each score's threshold, so no threshold on that score
does better on these answers (a bound), and a logistic rule fitted in sample on every signal, the strong RM's
score included, by the served rule's own fit (maximum likelihood, L2 1): an optimistic reading of the rule the
system would fit, not the best of all rules (a fit for share or APGR could do better). APGR is over the
prompts the probe leaves to Level-1. Intervals: 95 %, whole paraphrase families resampled, each draw choosing
again.

1. Per detector: bad-case AUC, and the least share escalated for a ``--catch`` catch.
2. The AUC an equal-variance binormal detector needs for that catch at ``--share`` (at this bad rate).
3. APGR (RouteLLM's) of escalating in each detector's order, beside a perfect judge of the Level-1 answer
   (the oracle's own score) and the order of largest oracle gain.

    STRATA_ZOO_PRESET=default .venv/bin/python scripts/escalation_ceiling.py
    STRATA_ZOO_PRESET=default .venv/bin/python scripts/escalation_ceiling.py --record-rounds 3 --label-share 0.5
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.hashing import content_hash
from strata_tools.bench.tiers import expected_scores
from strata_tools.intervals import Interval, cluster_bootstraps
from strata_tools.level1 import LivePrompting, generate_answers, probe_prompts
from strata_tools.rm.ceiling import binormal_auc_needed, escalation_apgr, least_share_for_catch
from strata_tools.rm.escalation import RecordHistory, judge_level1, live_scoring_options
from strata_tools.rm.onpolicy import BAD_THRESHOLD, detection_auc
from strata_tools.task.suite import load_suite
from strata_tools.zoo.build import ZooSettings, ensure_zoo
from svc_generator.backends.hf import HfBackend
from svc_reward.escalation_rule import FEATURES, fit_rule, signal_aucs
from svc_reward.models import RewardModels

Rows = Sequence[dict[str, float | None]]


def score_suspicion(name: str) -> Callable[[Rows, Sequence[bool]], list[float]]:
    """The score ``name`` of each row, lowest most suspicious (an RM's reward)."""
    def suspicion(rows: Rows, _bad: Sequence[bool]) -> list[float]:
        return [-float(r[name]) for r in rows]  # type: ignore[arg-type]
    return suspicion


def rule_suspicion(names: Sequence[str], catch: float) -> Callable[[Rows, Sequence[bool]], list[float]]:
    """A logistic rule on ``names`` (those every row has) fitted on the rows it then scores: P(bad)."""
    def suspicion(rows: Rows, bad: Sequence[bool]) -> list[float]:
        rule = fit_rule(rows, bad, catch, names=names)
        return [rule.probability(r) or 0.0 for r in rows]
    return suspicion


def sibling_scores(zoo: Any, prompts: Sequence[str], count: int, seed: int) -> list[list[float]]:
    """``count`` more Level-1 answers to each prompt, prompted and sampled as live (seeds apart from the judged
    answers'), each scored raw by the zoo's light RM as the reward service scores it."""
    prompting = LivePrompting.live(1)
    directions = [prompting.directions(result) for result in probe_prompts(zoo.probe, prompts)]
    backend = HfBackend(str(zoo.level1), "cpu")
    light = RewardModels([str(zoo.rm_light)], None, live_scoring_options())
    columns = []
    for k in range(count):
        print(f"siblings: Level-1 answer {k + 1} of {count} to each of {len(prompts)} prompts")
        answers = generate_answers(backend, prompting, prompts, directions, seed + 7919 * (k + 1))
        columns.append(light.score(prompts, [a.text for a in answers]).rewards)
    return [list(row) for row in zip(*columns, strict=True)]


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="test", choices=("test", "fresh"))
    parser.add_argument("--prompts", type=int, default=280, help="prompts sampled from the split")
    parser.add_argument("--member", action="append", default=[], help="another RM directory to read as a detector")
    parser.add_argument("--record-rounds", type=int, default=0, help="earlier rounds behind the neighbourhood's "
                        "record (0: the first pass, no record)")
    parser.add_argument("--label-share", type=float, default=None, help="share of those rounds people label")
    parser.add_argument("--siblings", type=int, default=3, help="more Level-1 answers a prompt, for the "
                        "siblings' signal (0: none)")
    parser.add_argument("--level2-samples", type=int, default=4)
    parser.add_argument("--catch", type=float, default=0.9)
    parser.add_argument("--share", type=float, default=0.30, help="the Level-2 share the catch is wanted at")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws", type=int, default=500)
    return parser.parse_args()


@dataclass(frozen=True)
class Answers:
    """The judged Level-1 answers: each one's row of signals and scores, its label and both tiers' oracle."""

    rows: list[dict[str, float | None]]   # every served signal, and every score under its detector's name
    bad: list[bool]
    level1: list[float]                   # the oracle's score of the answer
    level2: list[float]                   # Level-2's expected oracle score on its prompt
    families: list[str]
    signals: list[str]                    # the served signals every answer has
    scores: list[str]                     # the scores read as detectors on their own
    header: str


def read_answers(args: argparse.Namespace) -> Answers:
    zoo = ensure_zoo(ZooSettings(), progress=False)
    history = RecordHistory(args.record_rounds, args.label_share) if args.record_rounds > 0 else None
    judged = judge_level1(zoo, args.split, args.prompts, args.seed, [str(zoo.rm_light)], live_scoring_options(),
                          history, progress=print, report_only=True)
    prompts, responses = judged.prompt_texts, judged.responses

    def rm_rewards(path: Path) -> list[float]:
        return RewardModels([str(path)], None, live_scoring_options()).score(prompts, responses).rewards

    scores = {"light RM": judged.scores, "strong RM": rm_rewards(Path(zoo.rm_strong)),
              "strong RM before growth": rm_rewards(Path(zoo.rm_strong) / "student_init")}
    scores |= {f"member {Path(m).name}": rm_rewards(Path(m)) for m in args.member}
    if args.siblings > 0:
        scores["siblings' light RM mean"] = [sum(s) / len(s) for s in
                                             sibling_scores(zoo, prompts, args.siblings, args.seed)]
    # Every score rides on its answer's row, so a bootstrap draw of rows carries its scores with it.
    rows: list[dict[str, float | None]] = [{**features, **{name: column[i] for name, column in scores.items()}}
                                           for i, features in enumerate(judged.features)]
    by_text = {r.text: r for r in load_suite(args.split)}
    level2_of = expected_scores(zoo, [by_text[p] for p in prompts], args.level2_samples, args.seed, progress=print)
    level2 = [level2_of[content_hash(p)].level2 for p in prompts]
    bad, level1 = judged.bad(BAD_THRESHOLD), judged.oracle
    n = len(bad)
    header = (f"zoo {zoo.config.config_hash()}; {args.split} split: {n} Level-1 answers to "
              f"{len(set(judged.families))} families, {sum(bad)} bad (oracle < {BAD_THRESHOLD:g}); Level-1 mean "
              f"oracle {sum(level1) / n:.3f}, Level-2 expected {sum(level2) / n:.3f} ({args.level2_samples} samples a "
              "prompt); " + (f"record: {args.record_rounds} earlier rounds, {judged.history.label_share:.0%} labelled"
                             if judged.history and judged.history.label_share is not None
                             else "first pass: no record"))
    return Answers(rows, bad, level1, level2, judged.families,
                   [n for n in FEATURES if all(r.get(n) is not None for r in rows)], list(scores), header)


def bounds(answers: Answers, detectors: dict[str, Callable[[Rows, Sequence[bool]], list[float]]],
           args: argparse.Namespace) -> list[Interval]:
    """Per detector its AUC, least share for the catch and APGR; then a perfect judge's and the gain order's
    APGR: each with its interval, every draw choosing again."""
    rows, bad, level1, level2 = answers.rows, answers.bad, answers.level1, answers.level2

    def apgr_of(order: Sequence[float], idx: Sequence[int]) -> float:
        try:
            return escalation_apgr(order, [level1[i] for i in idx], [level2[i] for i in idx])
        except ValueError:  # a draw where Level-2 is no better: no gap to recover
            return math.nan

    def figures(idx: Sequence[int]) -> list[float]:
        drawn_rows = [rows[i] for i in idx]
        drawn_bad = [bad[i] for i in idx]
        if not any(drawn_bad) or all(drawn_bad):
            return [math.nan] * (3 * len(detectors) + 2)
        out = []
        for detector in detectors.values():
            try:
                suspicion = detector(drawn_rows, drawn_bad)
            except ValueError:
                out += [math.nan] * 3
                continue
            out += [detection_auc([-s for s in suspicion], drawn_bad),
                    least_share_for_catch(suspicion, drawn_bad, args.catch), apgr_of(suspicion, idx)]
        out.append(apgr_of([-level1[i] for i in idx], idx))
        out.append(apgr_of([level2[i] - level1[i] for i in idx], idx))
        return out

    return cluster_bootstraps(figures, answers.families, args.seed, args.draws)


def show(interval: Interval) -> str:
    return f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def main() -> int:
    args = arguments()
    answers = read_answers(args)
    rows, bad, signals = answers.rows, answers.bad, answers.signals
    detectors = {name: score_suspicion(name) for name in answers.scores}
    detectors["rule on every served signal"] = rule_suspicion(signals, args.catch)
    if args.siblings > 0:
        detectors["rule on the served signals and the siblings"] = rule_suspicion([*signals, "siblings' light RM mean"],
                                                                                      args.catch)
    detectors["rule on the served signals and the strong RM"] = rule_suspicion([*signals, "strong RM"], args.catch)
    print(f"\n{answers.header}")
    print(f"served signals on every answer: {', '.join(signals)}; each alone, AUC either direction: "
          + ", ".join(f"{k} {v:.3f}" for k, v in signal_aucs(rows, bad).items() if v is not None and k in signals))
    intervals = bounds(answers, detectors, args)
    print(f"\nin sample (every threshold and rule chosen on these answers): bad-case AUC, least share escalated for a "
          f"{args.catch:.0%} catch, APGR of escalating in that order")
    for k, name in enumerate(detectors):
        auc_i, share_i, apgr_i = intervals[3 * k:3 * k + 3]
        print(f"  {name:58s} AUC {show(auc_i)}  share {show(share_i)}  APGR {show(apgr_i)}")
    perfect, gain = intervals[-2:]
    print(f"  {'a perfect judge of the Level-1 answer (the oracle)':58s} AUC 1.000  share "
          f"{least_share_for_catch([float(b) for b in bad], bad, args.catch):.3f}  APGR {show(perfect)}")
    print(f"  {'the order of largest oracle gain (the ceiling of any router)':58s} {'':29s}APGR {show(gain)}")
    n_bad, n = sum(bad), len(bad)
    needed = binormal_auc_needed(args.catch, args.share, n_bad / n)
    best = min(intervals[3 * k + 1].estimate for k in range(len(detectors)))
    best_apgr = max(intervals[3 * k + 2].estimate for k in range(len(detectors)))
    print(f"\nan equal-variance binormal detector needs AUC {needed:.3f} for a {args.catch:.0%} catch at "
          f"{args.share:.0%} escalated, at this bad rate ({n_bad / n:.3f})")
    print(f"ceiling best_share_at_catch={best:.3f} best_apgr={best_apgr:.3f} perfect_judge_apgr={perfect.estimate:.3f} "
          f"gain_order_apgr={gain.estimate:.3f} auc_needed={needed:.3f} answers={n} bad={n_bad}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
