"""RM noise (seed §5.1 row 1): score the same responses many times and look at the spread.

Symptom: the reward curve oscillates wildly (±2.0). Check: take 100 responses, score each 10 times
with the same RM, look at the standard deviation. Cure (R8): an ensemble of light RMs voting (3
models) and/or a scoring temperature of 0.3.

The measurement is the mean over items of the population std of that item's scores across the
repeats; the worst item's std is reported beside it. A deterministic RM (eval mode, no sampling)
has a spread of 0 up to float noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from strata_tools.diagnose.items import Pair, ScoredBatch
from strata_tools.diagnose.verdict import CheckResult, Verdict

NAME = "rm-noise"
CURE = ("serve an ensemble of light RMs and/or a scoring temperature (R8): svc_reward --light-rm A,B,C "
        "--aggregation mean (3 models voting) --temperature 0.3")


@dataclass(frozen=True)
class RmNoiseConfig:
    n_responses: int = 100     # distinct (prompt, response) items
    repeats: int = 10          # scorings of each item
    max_spread: float = 0.1    # mean per-item std (0-5 scale) above which the check alarms


@dataclass(frozen=True)
class NoiseMeasurement:
    spread: float                  # mean per-item std across repeats
    worst: float                   # largest per-item std
    n_items: int
    repeats: int
    rm_version: str
    ensemble_members: int          # members behind the served reward (1 = a single RM)
    member_disagreement: float     # mean per-item std across ensemble members (0 for one RM)


def repeat_spread(rounds: Sequence[Sequence[float]]) -> tuple[float, float]:
    """``rounds[r][i]`` = score of item i in repeat r -> (mean per-item std, max per-item std)."""
    if len(rounds) < 2:
        raise ValueError("need at least 2 repeats to measure a spread")
    n = len(rounds[0])
    if n == 0 or any(len(r) != n for r in rounds):
        raise ValueError("every repeat must score the same, non-empty list of items")
    stds = []
    for i in range(n):
        values = [r[i] for r in rounds]
        mean = sum(values) / len(values)
        stds.append(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)))
    return sum(stds) / n, max(stds)


def members_of(rm_version: str) -> int:
    """Ensemble size from a served version label (members are joined by ``+``, R8)."""
    return rm_version.count("+") + 1 if rm_version else 1


def measure(score: Callable[[Sequence[Pair]], ScoredBatch], items: Sequence[Pair], repeats: int) -> NoiseMeasurement:
    """Score ``items`` ``repeats`` times through ``score`` (one RM deployment)."""
    batches = [score(items) for _ in range(repeats)]
    spread, worst = repeat_spread([b.rewards for b in batches])
    disagreement = sum(sum(b.spreads) / len(b.spreads) for b in batches) / len(batches)
    version = batches[-1].rm_version
    return NoiseMeasurement(spread, worst, len(items), repeats, version, members_of(version), disagreement)


def evaluate(m: NoiseMeasurement, config: RmNoiseConfig, ensemble: NoiseMeasurement | None = None) -> CheckResult:
    """ALARM when the served RM's repeat spread is over ``max_spread``; ``ensemble`` is the same
    measurement on a deployment configured with the cure (shown for comparison, not judged)."""
    what = f"ensemble of {m.ensemble_members}" if m.ensemble_members > 1 else "single RM"
    summary = (f"score spread {m.spread:.3f} (mean std of {m.n_items} responses x {m.repeats} scorings, "
               f"worst {m.worst:.3f}); {what} {m.rm_version}")
    details: dict[str, float | int | str] = {
        "spread": m.spread, "worst": m.worst, "items": m.n_items, "repeats": m.repeats,
        "rm_version": m.rm_version, "ensemble_members": m.ensemble_members,
        "member_disagreement": m.member_disagreement,
    }
    if m.ensemble_members > 1:
        summary += f", members disagree by {m.member_disagreement:.3f}"
    if ensemble is not None:
        summary += f"; under the ensemble ({ensemble.ensemble_members} members, {ensemble.rm_version}): " \
                   f"{ensemble.spread:.3f}"
        details |= {"ensemble_spread": ensemble.spread, "ensemble_version": ensemble.rm_version,
                    "ensemble_members_compared": ensemble.ensemble_members}
    verdict = Verdict.ALARM if m.spread > config.max_spread else Verdict.PASS
    return CheckResult(NAME, verdict, m.spread, config.max_spread, f"spread > {config.max_spread:g} alarms",
                       summary, CURE, details)
