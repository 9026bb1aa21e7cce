"""The cluster-robust standard error of a mean (R27): paraphrases of one request, or audits of one prompt,
are not independent items. Pure; the tools' bootstrap intervals are in ``strata_tools.intervals``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence


def clustered_se(values: Sequence[float], clusters: Sequence[Hashable]) -> float:
    """Standard error of ``mean(values)`` with items grouped by ``clusters`` (same length): the sum of each
    cluster's residuals, squared, over n², times G/(G-1). ``nan`` with fewer than two clusters."""
    if len(values) != len(clusters):
        raise ValueError(f"one cluster per value: {len(values)} values, {len(clusters)} clusters")
    mean = statistics.fmean(values)
    sums: dict[Hashable, float] = {}
    for value, cluster in zip(values, clusters, strict=True):
        sums[cluster] = sums.get(cluster, 0.0) + (value - mean)
    g, n = len(sums), len(values)
    if g < 2:
        return float("nan")
    return math.sqrt(g / (g - 1) * sum(s * s for s in sums.values())) / n
