"""Intervals that respect clusters (R27): paraphrases of one request are not independent prompts.

A held-out set of 64 prompts drawn from 40 paraphrase families carries less evidence than 64 independent
prompts, and an audit stream that judges one prompt five times carries less than five prompts. The
standard errors here treat a cluster (a paraphrase family, a prompt) as the unit of evidence:

- :func:`clustered_se` (the runtime library's, which the scheduler's skip audit uses too): the
  cluster-robust standard error of a mean (the CR1 sandwich estimator with its small-sample factor
  G/(G-1)); with one item per cluster it is the usual SE (up to that factor);
- :func:`cluster_bootstrap`: a percentile interval for any statistic, resampling whole clusters.

Pure: no I/O, no numpy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from strata.intervals import clustered_se

__all__ = ["BOOTSTRAP_DRAWS", "LEVEL", "Interval", "cluster_bootstrap", "cluster_bootstraps", "clustered_se"]

BOOTSTRAP_DRAWS = 2000
LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    clusters: int

    def __str__(self) -> str:
        return f"{self.estimate:.3f} [{self.low:.3f}, {self.high:.3f}]"


def cluster_bootstrap(statistic: Callable[[Sequence[int]], float], clusters: Sequence[Hashable], seed: int = 0,
                      draws: int = BOOTSTRAP_DRAWS, level: float = LEVEL) -> Interval:
    """A percentile interval for ``statistic`` (a function of item indices into the data it closes over):
    each draw resamples whole clusters with replacement and passes the items of the drawn clusters, with
    repeats. Draws whose statistic is ``nan`` (a resample without both kinds, say) are left out."""
    [interval] = cluster_bootstraps(lambda idx: (statistic(idx),), clusters, seed, draws, level)
    return interval


def cluster_bootstraps(statistics: Callable[[Sequence[int]], Sequence[float]], clusters: Sequence[Hashable],
                       seed: int = 0, draws: int = BOOTSTRAP_DRAWS, level: float = LEVEL) -> list[Interval]:
    """:func:`cluster_bootstrap` for several statistics computed together (``statistics`` returns one value
    per statistic): one set of draws, each evaluated once, an interval per statistic."""
    if not 0 < level < 1:
        raise ValueError("level must be in (0, 1)")
    members: dict[Hashable, list[int]] = {}
    for index, cluster in enumerate(clusters):
        members.setdefault(cluster, []).append(index)
    groups = list(members.values())
    rng = random.Random(seed)
    drawn = [statistics([i for g in rng.choices(groups, k=len(groups)) for i in g]) for _ in range(draws)]
    estimates = statistics(list(range(len(clusters))))
    return [_percentile_interval(estimate, [d[k] for d in drawn], level, len(groups))
            for k, estimate in enumerate(estimates)]


def _percentile_interval(estimate: float, drawn: Sequence[float], level: float, clusters: int) -> Interval:
    values = sorted(v for v in drawn if not math.isnan(v))
    if not values:
        return Interval(estimate, float("nan"), float("nan"), clusters)
    tail = (1 - level) / 2
    low = values[min(len(values) - 1, math.floor(tail * len(values)))]
    high = values[min(len(values) - 1, math.ceil((1 - tail) * len(values)) - 1)]
    return Interval(estimate, low, high, clusters)
