"""Prometheus metrics of the learner (prefix ``strata_learner_``).

State (version, step, sample counts, the last update's metrics, the last weight-sync time) is read
from the engine's status at scrape time by one collector, so the engine stays the only bookkeeper.
Durations are histograms, observed by the update loop and the rollout tail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from svc_learner.core import LearnerStatus

UPDATE_SECONDS = Histogram(
    "strata_learner_update_seconds", "Wall time of one PPO update (all epochs)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)  # fmt: skip
CHECKPOINT_SECONDS = Histogram("strata_learner_checkpoint_seconds", "Write + publish of one policy version")
SYNC_SECONDS = Histogram(
    "strata_learner_weight_sync_seconds", "Policy-updated publish -> first rollout stamped with the new version",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)  # fmt: skip

# Update metrics exported as gauges: Prometheus name -> metric name in the update's dict (issue 6, item 3).
UPDATE_GAUGES: dict[str, tuple[str, str]] = {
    "strata_learner_mean_reward": ("charts/mean_reward", "Mean final reward of the last batch (0-5)"),
    "strata_learner_kl": ("charts/kl", "Per-token KL (k3) of the policy to the reference at the last update"),
    "strata_learner_clipfrac": ("losses/clipfrac", "Share of response tokens whose ratio was clipped"),
    "strata_learner_clip_epsilon": ("charts/clip_epsilon", "PPO clip epsilon in use (fixed or KL-adaptive, R17)"),
    "strata_learner_kl_coef": ("charts/kl_coef", "KL-penalty coefficient of the last update (warm-up, R17)"),
    "strata_learner_entropy": ("losses/entropy", "Mean policy entropy over response tokens"),
    "strata_learner_value_loss": ("losses/value_loss", "Value-head loss"),
    "strata_learner_policy_loss": ("losses/policy_loss", "Clipped policy loss"),
    "strata_learner_approx_kl": ("losses/approx_kl", "k3 KL between the updated policy and pi_old"),
    "strata_learner_importance_weight": ("charts/importance_weight", "Mean truncated importance weight"),
    "strata_learner_level2_importance_weight": (
        "off_policy/level2_is_weight_mean", "Mean truncated importance weight of the Level-2 rows' tokens"),
    "strata_learner_tokens_per_second": ("perf/tokens_per_second", "Batch tokens x epochs per second of update"),
}


class _StatusCollector(Collector):
    """Renders the learner's status; ``source`` is set by the service (one learner per process)."""

    def __init__(self) -> None:
        self.source: Callable[[], LearnerStatus] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.source is None:
            return
        status = self.source()
        yield GaugeMetricFamily("strata_learner_policy_version", "Policy version of the latest checkpoint",
                                value=status.policy_version)  # fmt: skip
        yield GaugeMetricFamily("strata_learner_step", "PPO updates applied", value=status.step)
        yield GaugeMetricFamily("strata_learner_pending_samples", "Accepted samples waiting for a batch",
                                value=status.pending)  # fmt: skip
        samples = CounterMetricFamily("strata_learner_samples", "Reward events by outcome (accepted, dropped_stale, "
                                      "skipped_reused, ...)", labels=["outcome"])  # fmt: skip
        for outcome, count in sorted(status.counts.items()):
            samples.add_metric([outcome], count)
        yield samples
        yield CounterMetricFamily("strata_learner_samples_dropped_stale", "Samples refused as too stale (R13)",
                                  value=status.counts.get("dropped_stale", 0))  # fmt: skip
        for name, (key, help_text) in UPDATE_GAUGES.items():
            if key in status.metrics:
                yield GaugeMetricFamily(name, help_text, value=status.metrics[key])
        if status.sync_seconds is not None:
            yield GaugeMetricFamily("strata_learner_last_weight_sync_seconds",
                                    "Last measured publish -> first rollout on the new version",
                                    value=status.sync_seconds)  # fmt: skip


_COLLECTOR = _StatusCollector()
REGISTRY.register(_COLLECTOR)


def expose(status: Callable[[], LearnerStatus]) -> None:
    """Export this learner's status (the latest call wins: one learner per process)."""
    _COLLECTOR.source = status
