"""``strata bench level0``: what the Level-0 probe's directions and caution do for Level-1 (R1, R2).

**Directions.** On the suite's ``fresh`` prompts (held out from the zoo's training and from the
other benches), Level-1 answers the same prompts under each way of writing its ``Directions:`` line,
and the oracle judges every answer:

- ``none``: no line (the bare prompt);
- ``likelihood top-3``: the zoo probe's three best directions (the top 3 of R1, what the stack
  forwarded before ``forward_directions = 1``), and its ``top-1`` (what it forwards now);
- ``head top-3`` / ``head top-1``: a directions head fitted here on the ``train`` split (as
  ``strata probe train`` fits one), on the probe LM's last hidden state;
- ``true intent``: the direction a good answer follows, the ceiling of any probe.

Per arm: the oracle mean, its paired change against ``none`` with the standard error (same prompts,
same sampling seeds), the bad-case share (oracle < 1.5), the oracle's intent component (0-1: how far
the answer does what the prompt asks; what a directions line can move) and how often the line's
first direction is the prompt's intent.

**Caution.** Level-1's answers to ``train`` prompts (the served directions), judged by the oracle,
label each prompt "Level-1 fails here"; a second head, fitted on those labels, predicts it for the
fresh prompts. As detectors of Level-1's bad answers on the fresh prompts (the answers of the arm
the probe's ``forward_directions`` serves): the AUC and the share of bad cases caught at the keyword
net's flag rate, for the keywords (what sends a prompt to Level-2 today besides the probe), the
likelihood probe's risk, the head's topic risk, the learned failure head, and the learned head beside
the keywords (a keyword match first, then the head's ranking: what serving both would flag). Labels
in a deployment come from the desk's scores of sampled Level-1 answers; here the oracle stands in
for the annotators.

Generation is in process, with the generator's default sampling and without rollout dropout (as
``strata calibrate escalation``). Last line:
``level0 served_vs_none=<d> head_vs_none=<d> intent_vs_none=<d> keyword_auc=<a> learned_auc=<a>``
(``served``: the arm ``forward_directions`` serves; ``head``: head top-3).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from strata.config import StrataSettings
from strata.contract.directions import DIRECTION_NAMES, DIRECTIONS
from strata.errors import CliError
from strata.risk import match_keywords
from strata_tools.rm.onpolicy import BAD_THRESHOLD
from strata_tools.task.oracle import judge
from strata_tools.task.suite import load_suite
from strata_tools.train_summary import paired_change

if TYPE_CHECKING:
    import torch

    from strata.models.loading import LoadedModel
    from strata.models.probe_head import DirectionsHead
    from strata_tools.task.suite import PromptRecord
    from svc_probe.core import ProbeResult

ARMS = ("none", "likelihood top-3", "likelihood top-1", "head top-3", "head top-1", "true intent")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=200, help="fresh prompts Level-1 answers in every arm")
    parser.add_argument("--train-prompts", type=int, default=600,
                        help="train prompts whose Level-1 answers label the learned caution")
    parser.add_argument("--seeds", type=int, default=2, help="sampling seeds per arm (the arms share them)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the generator's")
    parser.add_argument("--seed", type=int, default=0, help="prompt sampling and the heads' fits")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")


@dataclass(frozen=True)
class _Models:
    """The zoo's probe and Level-1, and the probe rules and sampling the stack serves with."""

    zoo: str
    probe_lm: LoadedModel
    level1: LoadedModel
    rules: Any  # svc_probe.core.ProbeRules
    max_prompt_tokens: int
    forward_directions: int  # how many of the probe's directions the stack forwards (ProbeSettings)
    sampling: Any  # strata.models.generation.SamplingConfig, seed unset


@dataclass(frozen=True)
class _Arm:
    """One way of writing the directions line: the oracle score of every (seed, prompt) answer."""

    name: str
    scores: list[float]
    on_intent: list[float]  # the oracle's intent component (0-1): how far the answer does what was asked
    first_is_intent: float

    @property
    def bad_share(self) -> float:
        return sum(s < BAD_THRESHOLD for s in self.scores) / len(self.scores)


@dataclass(frozen=True)
class _Detector:
    name: str
    auc: float | None
    caught: float  # share of bad cases among the flagged at the keywords' flag rate


def run(args: argparse.Namespace) -> int:
    if args.prompts < 10 or args.train_prompts < 50 or args.seeds < 1:
        raise CliError("--prompts must be >= 10, --train-prompts >= 50 and --seeds >= 1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    models = _load(args)
    rng = random.Random(args.seed)
    fresh_split, train_split = load_suite("fresh"), load_suite("train")
    fresh = rng.sample(fresh_split, min(args.prompts, len(fresh_split)))
    train = rng.sample(train_split, min(args.train_prompts, len(train_split)))
    print(f"level0 bench: zoo {models.zoo}; {len(fresh)} fresh prompts ({sum(r.risk for r in fresh)} risk) x "
          f"{args.seeds} seeds per arm; {len(train)} train prompts label the learned caution", flush=True)
    # Fitted on every train prompt: its intent and its topic's risk flag (as `strata probe train`).
    head = _fit_head(models, train_split, [r.risk for r in train_split], args.seed, "intent and topic risk")
    probed = {"likelihood": _probe(models, fresh, None), "head": _probe(models, fresh, head)}
    arms = [_run_arm(models, name, fresh, _lines(name, fresh, probed), args.seeds) for name in ARMS]
    _print_arms(arms, len(fresh), args.seeds)
    served_train = _probe(models, train, None)
    failed = _failures(models, train, [_served_line(p)[: models.forward_directions] for p in served_train])
    print(f"caution labels: {sum(failed)} of {len(train)} train prompts get a bad Level-1 answer "
          f"({sum(failed) / len(train):.1%})", flush=True)
    failure_head = _fit_head(models, train, failed, args.seed, "intent and Level-1 failures")
    served = next(a for a in arms if a.name == _served_arm(models.forward_directions))
    detectors = _detectors(models, fresh, probed, head, failure_head, served, args.seeds)
    _print_detectors(detectors, served)
    by_name = {a.name: a for a in arms}
    none = by_name["none"].scores
    keyword, learned = detectors[0], next(d for d in detectors if d.name == "learned failure")
    print(f"done in {time.perf_counter() - started:.0f} s")
    print(f"level0 served_vs_none={paired_change(none, served.scores).mean:+.3f} "
          f"head_vs_none={paired_change(none, by_name['head top-3'].scores).mean:+.3f} "
          f"intent_vs_none={paired_change(none, by_name['true intent'].scores).mean:+.3f} "
          f"keyword_auc={_fmt(keyword.auc)} learned_auc={_fmt(learned.auc)}")
    return 0


def _load(args: argparse.Namespace) -> _Models:
    """The built zoo's probe and Level-1 on the CPU, with the probe rules and sampling the services default to."""
    from strata.models.generation import SamplingConfig
    from strata.models.loading import load_causal_lm
    from strata_tools.zoo.build import ensure_zoo
    from svc_generator.config import GeneratorSettings
    from svc_probe.config import ProbeSettings
    from svc_probe.core import ProbeRules

    zoo = ensure_zoo(StrataSettings())
    probe_settings = ProbeSettings()
    rules = ProbeRules.of(probe_settings)
    defaults = GeneratorSettings().sampling_defaults()
    sampling = SamplingConfig(defaults.temperature, defaults.top_p, args.max_new_tokens or defaults.max_new_tokens)
    _served_arm(probe_settings.forward_directions)  # one the bench measures, before any model loads
    return _Models(zoo.root.name, load_causal_lm(zoo.probe, device="cpu"), load_causal_lm(zoo.level1, device="cpu"),
                   rules, probe_settings.max_prompt_tokens, probe_settings.forward_directions, sampling)


def _features(models: _Models, records: Sequence[PromptRecord], batch: int = 64) -> torch.Tensor:
    """The probe LM's last hidden state for each prompt, as ``strata probe train`` reads it: (N, H)."""
    import torch

    from strata.models.probe_head import prompt_features

    with torch.no_grad():
        parts = [prompt_features(models.probe_lm, [r.text for r in records[i : i + batch]], models.max_prompt_tokens)[0]
                 for i in range(0, len(records), batch)]
    return torch.cat(parts).cpu()


def _fit_head(models: _Models, records: Sequence[PromptRecord], risk: Sequence[bool], seed: int,
              what: str) -> DirectionsHead:
    """A head fitted on ``records``: directions from their intents, its risk output from ``risk``."""
    import torch

    from strata.models.probe_head import DirectionsHead, FitConfig, fit_head

    names = list(DIRECTION_NAMES)
    directions = torch.tensor([names.index(r.intent) for r in records])
    weights = fit_head(_features(models, records), directions, torch.tensor(list(risk)), len(names),
                       FitConfig(seed=seed))
    return DirectionsHead(tuple((n, DIRECTIONS[n]) for n in names), *weights, info={"fitted": what})


def _probe(models: _Models, records: Sequence[PromptRecord], head: DirectionsHead | None) -> list[ProbeResult]:
    """The probe's answer for each prompt, by likelihood (``head`` None) or by ``head``."""
    from svc_probe.core import probe

    results: list[ProbeResult] = []
    for i in range(0, len(records), 32):
        results += probe(models.probe_lm, [r.text for r in records[i : i + 32]], models.rules,
                         models.max_prompt_tokens, head)
    return results


def _served_arm(forward_directions: int) -> str:
    """The arm the stack serves: the zoo probe's (likelihood) top ``forward_directions``."""
    if forward_directions == 0:
        return "none"
    if f"likelihood top-{forward_directions}" not in ARMS:
        raise CliError(f"forward_directions={forward_directions}: the bench measures 0, 1 and 3")
    return f"likelihood top-{forward_directions}"


def _served_line(result: ProbeResult) -> tuple[str, ...]:
    return tuple(name for name, _ in result.directions)


def _lines(arm: str, records: Sequence[PromptRecord], probed: dict[str, list[ProbeResult]]) -> list[tuple[str, ...]]:
    """The directions line each prompt gets in ``arm``."""
    if arm == "none":
        return [() for _ in records]
    if arm == "true intent":
        return [(r.intent,) for r in records]
    method, top = arm.split(" top-")
    return [_served_line(result)[: int(top)] for result in probed[method]]


def _answer(models: _Models, records: Sequence[PromptRecord], lines: Sequence[tuple[str, ...]],
            seed: int) -> list[tuple[float, float]]:
    """The oracle's (score, intent component) of Level-1's answer to each prompt under its directions line."""
    from strata.models.generation import generate

    sampling = dataclasses.replace(models.sampling, seed=seed)
    answers = generate(models.level1, [r.text for r in records], list(lines), sampling, batch_size=32)
    judged = [judge(r, a.text) for r, a in zip(records, answers, strict=True)]
    return [(j.score, j.breakdown["intent"]) for j in judged]


def _run_arm(models: _Models, name: str, records: Sequence[PromptRecord], lines: Sequence[tuple[str, ...]],
             seeds: int) -> _Arm:
    started = time.perf_counter()
    judged = [j for seed in range(seeds) for j in _answer(models, records, lines, seed)]
    first = sum(bool(line) and line[0] == r.intent for r, line in zip(records, lines, strict=True)) / len(records)
    print(f"  {name:<17} {len(judged)} answers in {time.perf_counter() - started:.0f} s", flush=True)
    return _Arm(name, [score for score, _ in judged], [intent for _, intent in judged], first)


def _failures(models: _Models, records: Sequence[PromptRecord], lines: Sequence[tuple[str, ...]]) -> list[bool]:
    """Whether Level-1's answer (seed 0, the served line) to each prompt is a bad case."""
    return [score < BAD_THRESHOLD for score, _ in _answer(models, records, lines, seed=0)]


def _print_arms(arms: Sequence[_Arm], prompts: int, seeds: int) -> None:
    none = arms[0].scores
    print(f"directions for Level-1 ({prompts} fresh prompts x {seeds} seeds, oracle 0-5):")
    print(f"  {'arm':<17} {'oracle':>7} {'vs none':>16} {'bad':>6} {'on intent':>10} {'1st = intent':>13}")
    for arm in arms:
        change = paired_change(none, arm.scores)
        delta = "-" if arm is arms[0] else f"{change.mean:+.3f} ± {change.stderr:.3f}"
        print(f"  {arm.name:<17} {statistics.fmean(arm.scores):>7.3f} {delta:>16} {arm.bad_share:>6.1%} "
              f"{statistics.fmean(arm.on_intent):>10.3f} {arm.first_is_intent:>13.1%}")


def _detectors(models: _Models, records: Sequence[PromptRecord], probed: dict[str, list[ProbeResult]],
               head: DirectionsHead, failure_head: DirectionsHead, served: _Arm, seeds: int) -> list[_Detector]:
    """Keywords, likelihood risk, head topic risk and the learned failure head against the served arm's bad answers."""
    bad = [s < BAD_THRESHOLD for s in served.scores]  # seed-major: seeds x prompts
    keyword = [float(match_keywords(r.text, {"risk": models.rules.risk_keywords}) is not None) for r in records]
    failure = [p.risk for p in _probe(models, records, failure_head)]
    signals: list[tuple[str, list[float]]] = [
        ("keywords", keyword),
        ("likelihood risk", [p.risk for p in probed["likelihood"]]),
        ("head topic risk", [p.risk for p in probed["head"]]),
        ("learned failure", failure),
        ("keywords + learned", [k + f for k, f in zip(keyword, failure, strict=True)]),  # keywords first
    ]
    flag_rate = sum(keyword) / len(keyword)
    return [_detector(name, values * seeds, bad, flag_rate) for name, values in signals]


def _detector(name: str, scores: list[float], bad: list[bool], flag_rate: float) -> _Detector:
    from strata.models.probe_head import roc_auc

    flagged = _top_share(scores, flag_rate)
    caught = sum(f and b for f, b in zip(flagged, bad, strict=True)) / max(1, sum(bad))
    return _Detector(name, roc_auc(scores, bad), caught)


def _top_share(scores: Sequence[float], share: float) -> list[bool]:
    """Flags on the ``share`` of items with the highest scores (ties broken by order)."""
    k = round(share * len(scores))
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    chosen = set(order[:k])
    return [i in chosen for i in range(len(scores))]


def _print_detectors(detectors: Sequence[_Detector], served: _Arm) -> None:
    bad = sum(s < BAD_THRESHOLD for s in served.scores)
    print(f"caution as a detector of Level-1's bad answers ({bad} of {len(served.scores)} served answers bad):")
    print(f"  {'detector':<18} {'AUC':>6} {'caught at the keywords flag rate':>33}")
    for d in detectors:
        print(f"  {d.name:<18} {_fmt(d.auc):>6} {d.caught:>33.1%}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"

