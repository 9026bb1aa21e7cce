"""Intervals clustered by paraphrase family, on constructed examples with known answers."""

from __future__ import annotations

import math
import statistics

import pytest

from strata_tools.intervals import cluster_bootstrap, clustered_se
from strata_tools.train_summary import paired_change


def test_equal_clusters_give_the_standard_error_of_the_cluster_means() -> None:
    # Four families of three paraphrases; the paraphrases of one family agree exactly. The evidence is four
    # numbers, not twelve: the SE is stdev(family means) / sqrt(4).
    means = [0.1, 0.5, -0.2, 0.4]
    values = [m for m in means for _ in range(3)]
    families = [f for f in "abcd" for _ in range(3)]
    assert clustered_se(values, families) == pytest.approx(statistics.stdev(means) / 2)
    naive = statistics.stdev(values) / math.sqrt(len(values))
    assert clustered_se(values, families) > 1.6 * naive  # what treating them as 12 prompts understates


def test_singleton_clusters_give_the_usual_standard_error() -> None:
    values = [0.3, -0.1, 0.8, 0.2, 0.0]
    # CR1 with one item a cluster: sqrt(n/(n-1) * sum r^2) / n = stdev / sqrt(n).
    assert clustered_se(values, range(5)) == pytest.approx(statistics.stdev(values) / math.sqrt(5))
    assert math.isnan(clustered_se(values, ["one"] * 5))
    with pytest.raises(ValueError, match="one cluster per value"):
        clustered_se(values, ["a"])


def test_a_paired_change_clusters_its_standard_error_when_told_the_families() -> None:
    before, after = [1.0] * 6, [1.5, 1.5, 0.5, 0.5, 2.0, 2.0]
    change = paired_change(before, after, ["x", "x", "y", "y", "z", "z"])
    assert (change.mean, change.n, change.clusters) == (pytest.approx(1 / 3), 6, 3)
    assert change.stderr == pytest.approx(statistics.stdev([0.5, -0.5, 1.0]) / math.sqrt(3))
    assert "clustered by family: 6 prompts, 3 families" in str(change)
    assert paired_change(before, after).clusters is None


def test_the_cluster_bootstrap_resamples_whole_families() -> None:
    # Each family's members are identical, so every resample's mean is a mean of family means: the interval
    # lies within the family means' range and its width matches the clustered SE's order.
    means = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    values = [m for m in means for _ in range(4)]
    families = [i for i in range(8) for _ in range(4)]
    interval = cluster_bootstrap(lambda idx: statistics.fmean(values[i] for i in idx), families, seed=3)
    assert interval.estimate == pytest.approx(3.5) and interval.clusters == 8
    assert 0.0 <= interval.low < 3.5 < interval.high <= 7.0
    se = clustered_se(values, families)
    assert 2.5 * se < interval.high - interval.low < 5 * se  # about 2 x 1.96 SE
    assert cluster_bootstrap(lambda idx: statistics.fmean(values[i] for i in idx), families, seed=3) == interval
    nan_only = cluster_bootstrap(lambda idx: float("nan"), families)
    assert math.isnan(nan_only.low) and math.isnan(nan_only.high)
