"""Replay-based cost-quality evaluation of Level-1 -> Level-2 routing, RouteLLM style (arXiv 2406.18665).

Every prompt has its recorded Level-2 answer (from an all-Level-2 run) and, unless it was cautious (sent
straight to Level-2 by the probe), its recorded Level-1 answer; each answer carries its oracle score (0..5),
its tier's RM score and its cost. A router is a set of escalated prompt hashes; ``evaluate`` turns it into
an arm's figures, ``compare`` sets them against the all-Level-2 baseline, ``sweep`` traces the threshold
router's curve, ``ceiling`` the best curve any router could reach on the same answers, and ``pgr`` /
``apgr`` / ``cpt`` summarise a curve of (Level-2 share, quality) points.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ALL_LEVEL2 = "all-Level-2"
RANDOM_ROUTER = "random router"


@dataclass(frozen=True)
class Answer:
    """One recorded answer: oracle score, its tier's RM score and its cost."""

    oracle: float
    rm: float
    device_seconds: float
    param_tokens: float


@dataclass(frozen=True)
class PromptOutcome:
    """A prompt's recorded answers; ``level1`` is None when the prompt was cautious."""

    prompt_hash: str
    level1: Answer | None
    level2: Answer
    risk: bool = False
    human_seconds: float = 0.0
    # A cautious prompt's Level-1 answer, generated to measure but never served: RouteLLM's 0 % end needs
    # every prompt's weak answer.
    unrouted_level1: Answer | None = None


@dataclass(frozen=True)
class ArmFigures:
    """Cost and quality figures of one routing arm, optionally compared against a baseline."""

    name: str
    prompts: int
    device_seconds: float
    param_tokens: float
    human_seconds: float
    mean_oracle: float
    level2_share: float
    bad_case_catch: float | None
    false_escalation: float | None
    saving: float | None = None
    param_token_saving: float | None = None
    quality_ratio: float | None = None


@dataclass(frozen=True)
class ExpectedScores:
    """A prompt's expected oracle score at Level-2 (the mean over several sampled answers) and, for a cautious
    prompt, at Level-1 (None otherwise: the router judges the Level-1 answer it sees, so that answer stays)."""

    level2: float
    samples: int  # answers per tier behind each mean
    level1: float | None = None


def with_expected(outcomes: Sequence[PromptOutcome], expected: Mapping[str, ExpectedScores]) -> list[PromptOutcome]:
    """``outcomes`` with each Level-2 answer's oracle score replaced by its prompt's expectation (the router
    escalates before it sees Level-2's answer, so that answer's luck is no router's doing), and each cautious
    prompt given its unrouted Level-1 answer (expected score, no cost: RouteLLM's axis counts calls). The
    Level-1 answers stay the ones served: the router saw each and its light-RM score. Costs stay the live ones."""
    missing = [o.prompt_hash for o in outcomes if o.prompt_hash not in expected
               or (o.level1 is None and expected[o.prompt_hash].level1 is None)]
    if missing:
        raise ValueError(f"{len(missing)} prompts have no expected scores, e.g. {missing[0][:12]}")
    out = []
    for o in outcomes:
        e = expected[o.prompt_hash]
        unrouted = None if o.level1 is not None else Answer(e.level1, math.nan, 0.0, 0.0)  # type: ignore[arg-type]
        out.append(dataclasses.replace(o, level2=dataclasses.replace(o.level2, oracle=e.level2),
                                       unrouted_level1=unrouted))
    return out


def _check_outcomes(outcomes: Sequence[PromptOutcome]) -> set[str]:
    if not outcomes:
        raise ValueError("no prompt outcomes")
    hashes = {o.prompt_hash for o in outcomes}
    if len(hashes) != len(outcomes):
        raise ValueError("duplicate prompt hashes among the outcomes")
    return hashes


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def evaluate(
    name: str,
    outcomes: Sequence[PromptOutcome],
    escalated: Collection[str],
    bad_threshold: float,
    keep_better: bool = False,
) -> ArmFigures:
    """Figures of the arm that escalates ``escalated`` (cautious prompts are always at Level-2)."""
    hashes = _check_outcomes(outcomes)
    unknown = set(escalated) - hashes
    if unknown:
        raise ValueError(f"escalated hashes not among the outcomes: {sorted(unknown)}")
    device = params = human = quality = 0.0
    at_level2 = bad = bad_caught = good = good_escalated = 0
    for o in outcomes:
        up = o.level1 is None or o.prompt_hash in escalated
        if o.level1 is not None:
            device += o.level1.device_seconds
            params += o.level1.param_tokens
            if o.level1.oracle < bad_threshold:
                bad += 1
                bad_caught += up
            else:
                good += 1
                good_escalated += up
        if not up:
            assert o.level1 is not None
            quality += o.level1.oracle
            continue
        at_level2 += 1
        device += o.level2.device_seconds
        params += o.level2.param_tokens
        human += o.human_seconds
        if keep_better and o.level1 is not None and o.level1.rm > o.level2.rm:
            quality += o.level1.oracle
        else:
            quality += o.level2.oracle
    n = len(outcomes)
    return ArmFigures(
        name=name,
        prompts=n,
        device_seconds=device,
        param_tokens=params,
        human_seconds=human,
        mean_oracle=quality / n,
        level2_share=at_level2 / n,
        bad_case_catch=_share(bad_caught, bad),
        false_escalation=_share(good_escalated, good),
    )


def all_level2(outcomes: Sequence[PromptOutcome], bad_threshold: float) -> ArmFigures:
    """The all-Level-2 baseline: Level-2 costs only, since that run never ran Level-1."""
    _check_outcomes(outcomes)
    n = len(outcomes)
    return ArmFigures(
        name=ALL_LEVEL2,
        prompts=n,
        device_seconds=sum(o.level2.device_seconds for o in outcomes),
        param_tokens=sum(o.level2.param_tokens for o in outcomes),
        human_seconds=sum(o.human_seconds for o in outcomes),
        mean_oracle=sum(o.level2.oracle for o in outcomes) / n,
        level2_share=1.0,
        bad_case_catch=None,
        false_escalation=None,
    )


def compare(arm: ArmFigures, baseline: ArmFigures) -> ArmFigures:
    """A copy of ``arm`` with its savings and quality ratio against ``baseline``."""
    return dataclasses.replace(
        arm,
        saving=1.0 - arm.device_seconds / baseline.device_seconds if baseline.device_seconds else None,
        param_token_saving=1.0 - arm.param_tokens / baseline.param_tokens if baseline.param_tokens else None,
        quality_ratio=arm.mean_oracle / baseline.mean_oracle if baseline.mean_oracle else None,
    )


def threshold_router(outcomes: Sequence[PromptOutcome], threshold: float) -> frozenset[str]:
    """Escalate the non-cautious prompts whose Level-1 RM score is below ``threshold``."""
    return frozenset(o.prompt_hash for o in outcomes if o.level1 is not None and o.level1.rm < threshold)


def oracle_router(outcomes: Sequence[PromptOutcome], bad_threshold: float) -> frozenset[str]:
    """Escalate exactly the non-cautious prompts whose Level-1 oracle score is below ``bad_threshold``."""
    return frozenset(o.prompt_hash for o in outcomes if o.level1 is not None and o.level1.oracle < bad_threshold)


def random_router(outcomes: Sequence[PromptOutcome], share: float, seed: int) -> frozenset[str]:
    """Escalate random non-cautious prompts so that, cautious ones included, ``share`` of prompts are at Level-2."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    candidates = sorted(o.prompt_hash for o in outcomes if o.level1 is not None)
    cautious = len(outcomes) - len(candidates)
    k = min(max(round(share * len(outcomes)) - cautious, 0), len(candidates))
    return frozenset(random.Random(seed).sample(candidates, k))


def random_router_figures(
    outcomes: Sequence[PromptOutcome],
    share: float,
    bad_threshold: float,
    baseline: ArmFigures,
    seeds: int = 200,
) -> ArmFigures:
    """The random router's figures, each numeric field averaged over ``seeds`` draws, compared to ``baseline``."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    draws = [
        evaluate(RANDOM_ROUTER, outcomes, random_router(outcomes, share, seed), bad_threshold)
        for seed in range(seeds)
    ]
    means: dict[str, Any] = {}
    for field in dataclasses.fields(ArmFigures):
        if field.name in ("name", "prompts"):
            continue
        values = [getattr(d, field.name) for d in draws]
        # Catch / false-escalation are None in every draw or in none: they depend on the outcomes alone.
        means[field.name] = None if values[0] is None else sum(values) / seeds
    return compare(dataclasses.replace(draws[0], **means), baseline)


def sweep(
    outcomes: Sequence[PromptOutcome],
    bad_threshold: float,
    baseline: ArmFigures,
    keep_better: bool = False,
) -> list[ArmFigures]:
    """The threshold router at every useful threshold, compared to ``baseline``, by Level-2 share ascending."""
    _check_outcomes(outcomes)
    # Just above each distinct RM score, so that each threshold escalates one more prefix of the sorted prompts.
    thresholds = [-math.inf] + [
        math.nextafter(rm, math.inf) for rm in sorted({o.level1.rm for o in outcomes if o.level1 is not None})
    ]
    arms = []
    for t in thresholds:
        name = "threshold=-inf" if t == -math.inf else f"threshold={t:.3f}"
        arm = evaluate(name, outcomes, threshold_router(outcomes, t), bad_threshold, keep_better)
        arms.append(compare(arm, baseline))
    return sorted(arms, key=lambda a: a.level2_share)


def ceiling(outcomes: Sequence[PromptOutcome], bad_threshold: float, baseline: ArmFigures) -> list[ArmFigures]:
    """The best quality any router reaches for its cost, compared to ``baseline``, by Level-2 share ascending.

    Escalating a prompt adds its Level-2 answer's cost and its oracle gain (Level-2 minus Level-1); taking the
    prompts in order of gain per unit of that cost is optimal for the fractional problem, so the line between
    consecutive points bounds what any router's set of prompts reaches for its cost (the points themselves
    need not: read savings off the line, :func:`ceiling_saving_at`). Given expected Level-2 scores
    (``with_expected``), Level-2's luck is out of it.
    """
    _check_outcomes(outcomes)

    def value(o: PromptOutcome) -> float:
        assert o.level1 is not None
        gain = o.level2.oracle - o.level1.oracle
        return gain / o.level2.param_tokens if o.level2.param_tokens > 0 else math.copysign(math.inf, gain)

    by_value = sorted((o for o in outcomes if o.level1 is not None), key=lambda o: (-value(o), o.prompt_hash))
    return [
        compare(evaluate(f"ceiling k={k}", outcomes, frozenset(o.prompt_hash for o in by_value[:k]), bad_threshold),
                baseline)
        for k in range(len(by_value) + 1)
    ]


def cheapest_reaching(arms: Sequence[ArmFigures], quality_ratio: float) -> ArmFigures | None:
    """The arm with the largest device-seconds saving among those at or above ``quality_ratio``, or None."""
    reaching = [a for a in arms if a.quality_ratio is not None and a.quality_ratio >= quality_ratio]
    return max(reaching, key=lambda a: a.saving if a.saving is not None else -math.inf, default=None)


def best_saving_at(arms: Sequence[ArmFigures], quality_ratio: float) -> float | None:
    """The largest params-x-tokens saving among ``arms`` at or above ``quality_ratio``, or None."""
    savings = [a.param_token_saving for a in arms if a.quality_ratio is not None and a.param_token_saving is not None
               and a.quality_ratio >= quality_ratio]
    return max(savings, default=None)


def ceiling_saving_at(ceiling_arms: Sequence[ArmFigures], quality_ratio: float) -> float | None:
    """The most params-x-tokens saving any router reaches at quality >= ``quality_ratio``: read off the line
    between the ceiling's points (in its order, cost rising), where the quality first reaches the target,
    which bounds every set of prompts, unlike the points alone; None when the ceiling never reaches it."""
    for before, after in itertools.pairwise([None, *ceiling_arms]):
        assert after is not None
        if after.quality_ratio is None or after.param_token_saving is None or after.quality_ratio < quality_ratio:
            continue
        if before is None or before.quality_ratio is None or before.param_token_saving is None:
            return after.param_token_saving
        share = (quality_ratio - before.quality_ratio) / (after.quality_ratio - before.quality_ratio)
        return before.param_token_saving + share * (after.param_token_saving - before.param_token_saving)
    return None


def share_of_ceiling_saving(router: ArmFigures, ceiling_arms: Sequence[ArmFigures],
                            quality_ratio: float) -> float | None:
    """The router's params-x-tokens saving at its operating point (one arm, its threshold chosen beforehand, not
    the best of a sweep picked after the fact) as a share of the most any router saves at quality >=
    ``quality_ratio`` (:func:`ceiling_saving_at`): 0 when the router falls short of that quality; None when
    the ceiling itself saves nothing there (no share to take)."""
    ceiling_saving = ceiling_saving_at(ceiling_arms, quality_ratio)
    if ceiling_saving is None or ceiling_saving <= 0:
        return None
    if router.quality_ratio is None or router.quality_ratio < quality_ratio or router.param_token_saving is None:
        return 0.0
    return router.param_token_saving / ceiling_saving


def pgr(quality: float, weak: float, strong: float) -> float:
    """Performance gap recovered: how far ``quality`` goes from the weak to the strong quality."""
    if strong == weak:
        raise ValueError("PGR is undefined when the strong and weak qualities are equal")
    return (quality - weak) / (strong - weak)


def _curve(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    best: dict[float, float] = {}
    for share, quality in points:
        best[share] = max(quality, best.get(share, -math.inf))
    return sorted(best.items())


def apgr(points: Sequence[tuple[float, float]], weak: float, strong: float) -> float:
    """Average PGR over the Level-2 share axis (trapezoids), the best quality kept at each share."""
    curve = _curve(points)
    if len(curve) < 2:
        raise ValueError("APGR needs points at two or more distinct shares")
    area = sum(
        (s1 - s0) * (pgr(q0, weak, strong) + pgr(q1, weak, strong)) / 2
        for (s0, q0), (s1, q1) in itertools.pairwise(curve)
    )
    return area / (curve[-1][0] - curve[0][0])


def cpt(points: Sequence[tuple[float, float]], weak: float, strong: float, target_pgr: float) -> float | None:
    """Call-performance threshold: the smallest Level-2 share reaching ``target_pgr`` (interpolated), or None."""
    curve = [(share, pgr(quality, weak, strong)) for share, quality in _curve(points)]
    if not curve:
        raise ValueError("CPT needs at least one point")
    if curve[0][1] >= target_pgr:
        return curve[0][0]
    for (s0, p0), (s1, p1) in itertools.pairwise(curve):
        if p0 < target_pgr <= p1:
            return s0 + (target_pgr - p0) / (p1 - p0) * (s1 - s0)
    return None


def route_llm_curve(outcomes: Sequence[PromptOutcome]) -> list[tuple[float, float]]:
    """The whole router on RouteLLM's axis: (share of all prompts at Level-2, mean oracle), from every prompt
    answered by Level-1 (0 %) to every prompt at Level-2 (100 %). The router escalates cautious prompts first
    (the probe's caution outranks any score), then the others by ascending Level-1 RM score, equal scores
    together, as one threshold moves over them. Every cautious prompt needs its ``unrouted_level1`` answer."""
    _check_outcomes(outcomes)
    missing = sum(o.level1 is None and o.unrouted_level1 is None for o in outcomes)
    if missing:
        raise ValueError(f"{missing} cautious prompts have no Level-1 answer: RouteLLM's 0 % end needs one each")

    def weak(o: PromptOutcome) -> Answer:
        answer = o.level1 if o.level1 is not None else o.unrouted_level1
        assert answer is not None
        return answer

    n = len(outcomes)
    quality = sum(weak(o).oracle for o in outcomes)
    points = [(0.0, quality / n)]
    escalated = 0
    groups: list[list[PromptOutcome]] = [[o for o in outcomes if o.level1 is None]]
    for _, group in itertools.groupby(sorted((o for o in outcomes if o.level1 is not None),
                                             key=lambda o: o.level1.rm),  # type: ignore[union-attr]
                                      key=lambda o: o.level1.rm):  # type: ignore[union-attr]
        groups.append(list(group))
    for group in groups:
        if not group:
            continue
        escalated += len(group)
        quality += sum(o.level2.oracle - weak(o).oracle for o in group)
        points.append((escalated / n, quality / n))
    return points


def _compared(arm: ArmFigures) -> tuple[float, float, float]:
    if arm.quality_ratio is None or arm.saving is None:
        raise ValueError(f"arm {arm.name!r} has no saving or quality ratio: compare() it to the baseline first")
    return arm.level2_share, arm.saving, arm.quality_ratio


def plot_curve(path: str | Path, sweep_arms: Sequence[ArmFigures], marks: Mapping[str, ArmFigures],
               ceiling_arms: Sequence[ArmFigures] = ()) -> None:
    """Save a PNG of quality ratio against Level-2 share and against device-seconds saving."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    line = [_compared(a) for a in sweep_arms]
    best = [_compared(a) for a in ceiling_arms]
    points = {label: _compared(a) for label, a in marks.items()}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    try:
        for ax, x, xlabel in ((axes[0], 0, "Level-2 share"), (axes[1], 1, "device-seconds saving vs all-Level-2")):
            ax.plot([p[x] for p in line], [p[2] for p in line], "-o", markersize=3, label="threshold sweep")
            if best:
                ax.plot([p[x] for p in best], [p[2] for p in best], "--", color="grey",
                        label="ceiling (any router)")
            for label, p in points.items():
                ax.scatter([p[x]], [p[2]], s=50, zorder=3, label=label)
                ax.annotate(label, (p[x], p[2]), textcoords="offset points", xytext=(5, 5), fontsize=8)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("quality ratio vs all-Level-2")
            ax.grid(True, alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle("Strata tiers: cost-quality curve")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def to_json(arm: ArmFigures) -> dict[str, Any]:
    """The arm's figures as a JSON-ready dict."""
    return dataclasses.asdict(arm)
