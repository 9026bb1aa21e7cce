"""The headline: a run's own traffic against all-Level-2 on the same prompts, its escalation rule replayed
(the threshold sweep, RouteLLM's figures, the ceiling of any router), with intervals over paraphrase
families; and the last line `strata bench tiers` and the demo print."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from strata_tools.intervals import Interval, cluster_bootstrap, cluster_bootstraps
from strata_tools.rm.onpolicy import detection_auc
from strata_tools.tiering import tier_eval
from strata_tools.tiering.answers import Answers, baseline_figures, live_figures
from strata_tools.tiering.tier_eval import Answer, ArmFigures, PromptOutcome

# Issue 18's acceptance: the quality ratio and Level-2 share the tiered rollout must reach.
TARGET_QUALITY_RATIO = 0.95
TARGET_LEVEL2_SHARE = 0.25
HEADLINE_ARM = "tiered + skip"
THRESHOLD_GRID = (1.0, 2.0, 2.2, 2.4, 2.6, 2.8, 3.0, 3.2, 3.4)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


@dataclass(frozen=True)
class Headline:
    """One run's own traffic against the all-Level-2 baseline on the same prompts, and its escalation
    rule judged on the replay of those prompts (the run's Level-1 answers, the baseline's Level-2 ones):
    the figures of the bench's last line."""

    baseline: ArmFigures
    arm: ArmFigures
    sweep: SweepFigures
    oracle_router: ArmFigures
    replayed: int                     # prompts of the replay: skipped ones have no answer of their own
    intervals: HeadlineIntervals | None = None  # bootstrap over paraphrase families, when they were given

    @property
    def apgr(self) -> float | None:
        return self.sweep.route_llm["apgr"]

    def line(self) -> str:
        return headline_line(self.arm, self.apgr, self.sweep.ceiling_share, self.intervals)


def headline_line(arm: ArmFigures, apgr: float | None, ceiling_share: float | None,
                  intervals: HeadlineIntervals | None = None, escalation_auc: float | None = None) -> str:
    """The bench's last line (and the demo's headline): params-x-tokens saving first, device-seconds beside;
    with ``intervals``, the saving's and the quality ratio's 95 % bounds (bootstrap over families); with
    ``escalation_auc``, the served escalation signal's bad-case AUC on the run's Level-1 answers."""
    line = (f"tiers saving={num(arm.param_token_saving)} device_saving={num(arm.saving)} "
            f"quality_ratio={num(arm.quality_ratio)} bad_case_catch={num(arm.bad_case_catch)} "
            f"level2_share={arm.level2_share:.3f} apgr={num(apgr)} ceiling_share_of_saving={num(ceiling_share)}")
    if intervals is not None:
        line += (f" saving_lo={intervals.saving.low:.3f} saving_hi={intervals.saving.high:.3f} "
                 f"quality_ratio_lo={intervals.quality_ratio.low:.3f} "
                 f"quality_ratio_hi={intervals.quality_ratio.high:.3f}")
        if intervals.apgr is not None:
            line += f" apgr_lo={intervals.apgr.low:.3f} apgr_hi={intervals.apgr.high:.3f}"
    if escalation_auc is not None:
        line += f" escalation_auc={num(escalation_auc)}"
    return line


def escalation_auc(replay: Sequence[PromptOutcome], bad_threshold: float) -> float | None:
    """How well the light RM's reward, the signal the served threshold escalates on, finds the bad Level-1
    answers (oracle under ``bad_threshold``): the probability a bad answer scores under a good one (ties
    half; a prompt's answers averaged, as the replay keeps them); None without both kinds."""
    answered = [o.level1 for o in replay if o.level1 is not None and not o.risk]
    auc = detection_auc([a.rm for a in answered], [a.oracle < bad_threshold for a in answered])
    return None if math.isnan(auc) else auc


@dataclass(frozen=True)
class HeadlineIntervals:
    saving: Interval          # params x tokens saving against all-Level-2
    quality_ratio: Interval   # mean oracle against all-Level-2's, on the prompts with an answer of their own
    apgr: Interval | None = None  # RouteLLM's APGR of the whole router, over 0-100 % of Level-2 calls


def apgr_interval(replay: Sequence[PromptOutcome], families: Sequence[str], seed: int = 0,
                  draws: int = 300) -> Interval | None:
    """RouteLLM's APGR of the whole router with a 95 % interval from resampling whole paraphrase families (each
    draw re-traces the curve on the drawn prompts); None when the replay has no APGR."""
    if route_llm_figures(replay)["apgr"] is None:
        return None

    def value(idx: Sequence[int]) -> float:
        drawn = [dataclasses.replace(replay[i], prompt_hash=f"{replay[i].prompt_hash}#{k}")
                 for k, i in enumerate(idx)]
        apgr = route_llm_figures(drawn)["apgr"]
        return float("nan") if apgr is None else apgr

    return cluster_bootstrap(value, families, seed, draws)


def headline_intervals(name: str, own: Sequence[Answers], baseline: Sequence[Answers], hashes: Sequence[str],
                       risks: Sequence[bool], families: Sequence[str], bad_threshold: float, seed: int = 0,
                       draws: int = 500) -> HeadlineIntervals:
    """The headline arm's saving and quality ratio, each with a 95 % interval from resampling whole paraphrase
    families of the prompts (arm and baseline resampled together: the comparison stays paired)."""
    def values(idx: Sequence[int]) -> tuple[float, float]:
        drawn = [f"{hashes[i]}#{k}" for k, i in enumerate(idx)]  # a family drawn twice: two distinct prompts
        try:
            level2, base = baseline_figures(drawn, [baseline[i] for i in idx], [risks[i] for i in idx],
                                            bad_threshold)
            arm = live_figures(name, [own[i] for i in idx], drawn, level2, bad_threshold, base)
        except ValueError:  # a draw of skipped prompts only: no quality to compare
            return float("nan"), float("nan")
        saving, quality_ratio = arm.param_token_saving, arm.quality_ratio
        return (float("nan") if saving is None else saving, float("nan") if quality_ratio is None else quality_ratio)

    saving, quality_ratio = cluster_bootstraps(values, families, seed, draws)
    return HeadlineIntervals(saving, quality_ratio)


def headline_of(name: str, own: Sequence[Answers], baseline: Sequence[Answers], hashes: Sequence[str],
                risks: Sequence[bool], bad_threshold: float, level2_samples: int = 1,
                families: Sequence[str] | None = None,
                expected: Mapping[str, tier_eval.ExpectedScores] | None = None) -> Headline:
    """The headline of a run whose requests got ``own`` answers, against ``baseline`` (the same prompts,
    ``hashes``, through all-Level-2, ``level2_samples`` samples each). Skipped prompts cost their encoding
    and are left out of the quality mean and of the replay; the replay's baseline is all-Level-2 on the
    prompts it keeps, and a replayed escalation pays for one Level-2 sample, as a live one does. With
    ``expected`` scores by prompt hash (:func:`expected_scores`), the router's figures (sweep, ceiling, APGR)
    are of expected quality; the live arms' figures stay what the run served."""
    if not (len(own) == len(baseline) == len(hashes) == len(risks)) or not hashes:
        raise ValueError("headline_of needs one own answer, one baseline answer, a hash and a risk flag per prompt")
    if level2_samples < 1:
        raise ValueError("level2_samples must be >= 1")
    kept = [i for i, a in enumerate(own) if not a.skipped]
    if not kept:
        raise ValueError("every prompt was skipped: no answer of the run's own to judge or replay")
    level2, base = baseline_figures(hashes, baseline, risks, bad_threshold)
    arm = live_figures(name, own, hashes, level2, bad_threshold, base)

    def escalation(i: int) -> tuple[Answer, float]:
        """What escalating prompt ``i`` costs: one of the baseline's samples (a prompt sent straight to
        Level-2 rolls out every sample there, as the baseline does)."""
        if own[i].level1 is None:
            return level2[i], baseline[i].human_seconds
        one = dataclasses.replace(level2[i], device_seconds=level2[i].device_seconds / level2_samples,
                                  param_tokens=level2[i].param_tokens / level2_samples)
        return one, baseline[i].human_seconds / level2_samples

    replay = []
    for i in kept:
        answer, human = escalation(i)
        replay.append(PromptOutcome(hashes[i], own[i].level1, answer, risks[i], human_seconds=human))
    served = frozenset(hashes[i] for i in kept if own[i].escalated)
    _, replay_base = baseline_figures([hashes[i] for i in kept], [baseline[i] for i in kept],
                                      [risks[i] for i in kept], bad_threshold)
    if expected is not None:
        replay, replay_base = expected_replay(replay, replay_base, expected)
    oracle_arm = tier_eval.compare(tier_eval.evaluate("oracle router (replay)", replay,
                                                      tier_eval.oracle_router(replay, bad_threshold), bad_threshold),
                                   replay_base)
    intervals = None
    if families is not None:
        intervals = dataclasses.replace(
            headline_intervals(name, own, baseline, hashes, risks, families, bad_threshold),
            apgr=apgr_interval(replay, [families[i] for i in kept]))
    return Headline(base, arm, sweep_figures(replay, replay_base, bad_threshold, served, expected is not None),
                    oracle_arm, len(replay), intervals)


def expected_replay(replay: Sequence[PromptOutcome], baseline: ArmFigures,
                    expected: Mapping[str, tier_eval.ExpectedScores]) -> tuple[list[PromptOutcome], ArmFigures]:
    """``replay`` and its all-Level-2 ``baseline`` with expected scores: the baseline keeps its costs, its quality
    becomes the expected Level-2 mean."""
    scored = tier_eval.with_expected(replay, expected)
    rescored = dataclasses.replace(baseline, mean_oracle=statistics.fmean(o.level2.oracle for o in scored))
    return scored, tier_eval.compare(rescored, rescored)


@dataclass
class SweepFigures:
    """The replayed threshold sweep, the RouteLLM figures of its curve, and the ceiling of any router."""

    arms: list[ArmFigures]
    strong: float                     # all-Level-2's quality on the replay (RouteLLM's ends: ``route_llm``)
    route_llm: dict[str, float | None]
    ceiling: list[ArmFigures]
    ceiling_share: float | None       # the served router's PxT saving / the ceiling's best at the target quality
    router: ArmFigures                # the served router (its live escalations) on the replay
    replay: list[PromptOutcome]       # what the figures were read off
    expected: bool = False            # scores are expectations over several samples per prompt and tier


def route_llm_figures(replay: Sequence[PromptOutcome]) -> dict[str, float | None]:
    """RouteLLM's APGR, CPT(50 %) and CPT(80 %) of the whole router (probe caution, then the light-RM threshold)
    on its 0-100 % axis of Level-2 calls (``tier_eval.route_llm_curve``), with the curve's ends as weak and
    strong; None each when a cautious prompt has no Level-1 answer to start the axis from, or the curve is
    flat (weak = strong)."""
    none: dict[str, float | None] = {"apgr": None, "cpt50": None, "cpt80": None, "weak": None, "strong": None}
    try:
        points = tier_eval.route_llm_curve(replay)
    except ValueError:
        return none
    weak, strong = points[0][1], points[-1][1]
    if strong == weak:
        return {**none, "weak": weak, "strong": strong}
    return {"apgr": tier_eval.apgr(points, weak, strong), "cpt50": tier_eval.cpt(points, weak, strong, 0.5),
            "cpt80": tier_eval.cpt(points, weak, strong, 0.8), "weak": weak, "strong": strong}


def sweep_figures(replay: Sequence[PromptOutcome], baseline: ArmFigures, bad_threshold: float,
                  served: Collection[str], expected: bool = False) -> SweepFigures:
    """The threshold sweep over ``replay``, RouteLLM's figures of the whole router, the ceiling, and the router's
    share of the ceiling's saving at its operating point: the prompts it escalated live (``served``, under a
    threshold calibrated on the validation split); ``baseline`` is all-Level-2 on the replay's prompts.
    ``expected``: the replay's scores are expectations (``tier_eval.with_expected``), as the figures then are."""
    sweep = tier_eval.sweep(replay, bad_threshold, baseline)
    best = tier_eval.ceiling(replay, bad_threshold, baseline)
    router = tier_eval.compare(tier_eval.evaluate("served router", replay, frozenset(served), bad_threshold),
                               baseline)
    return SweepFigures(sweep, baseline.mean_oracle, route_llm_figures(replay), best,
                        tier_eval.share_of_ceiling_saving(router, best, TARGET_QUALITY_RATIO), router, list(replay),
                        expected)

