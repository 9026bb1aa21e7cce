"""Stack-wide metrics no single service owns: consumer lag, tier mix, cost per tier, escalations.

Each service exports its own process metrics; these numbers live in Kafka (committed offsets vs end
offsets of every consumer group) and in the cost ledger in Redis (``strata.ledger``, written by the
generators and the reward service), so one small exporter reads them at scrape time:

- ``strata_consumer_lag{group,topic}``: events not yet committed by a group;
- ``strata_ledger_rollouts_total{tier}``, ``strata_ledger_tokens_total{tier}``,
  ``strata_ledger_device_seconds_total{tier}``: the tier mix and cost per tier (R4);
- ``strata_ledger_events_total{name}``: ledger counters (``escalations``, ...);
- ``strata_ledger_stage_device_seconds_total{stage,tier}``, ``strata_ledger_stage_param_tokens_total{stage,tier}``,
  ``strata_ledger_human_seconds_total``: every stage's cost (encoder, probe, generate, RMs, human review);
- ``strata_ledger_saving_ratio``: 1 - actual / all-Level-2 device seconds (``strata.ledger``'s baseline);
- ``strata_scheduler_skip_rate``, ``strata_scheduler_skip_audits{state}``, ``strata_scheduler_skip_reuse_error``,
  ``strata_scheduler_skip_precision``: live skipping and its audit (R10-R12, docs/scheduler.md);
- ``strata_exporter_up{source}``: 1 when Kafka / Redis answered this scrape.

``strata diagnose exporter`` serves them (compose: the ``strata-exporter`` service).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata import ledger, redis_client
from strata.bus.admin import consumer_lags
from strata.config import StrataSettings

log = logging.getLogger(__name__)

DEFAULT_GROUPS = ("svc-scheduler-stats", "svc-probe", "svc-generator-l1", "svc-generator-l2", "svc-reward",
                  "svc-learner")


class StackCollector(Collector):
    def __init__(self, settings: StrataSettings, groups: Sequence[str] = DEFAULT_GROUPS) -> None:
        self._settings = settings
        self._groups = tuple(groups)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("strata_exporter_up", "1 when the source answered this scrape", labels=["source"])
        try:
            lags = consumer_lags(self._settings, self._groups, "strata-exporter")
            lag = GaugeMetricFamily("strata_consumer_lag", "Events not yet committed by a consumer group",
                                    labels=["group", "topic"])
            for (group, topic), value in sorted(lags.items()):
                lag.add_metric([group, topic], value)
            yield lag
            up.add_metric(["kafka"], 1)
        except Exception as exc:  # a scrape must not fail because one source is down
            log.warning("consumer lag unavailable: %s", exc)
            up.add_metric(["kafka"], 0)
        try:
            yield from self._ledger()
            yield from self._skipping()
            up.add_metric(["redis"], 1)
        except Exception as exc:
            log.warning("cost ledger unavailable: %s", exc)
            up.add_metric(["redis"], 0)
        yield up

    def _ledger(self) -> Iterator[Metric]:
        client = redis_client.connect(self._settings.redis_address, socket_timeout=5)
        try:
            summary = ledger.read(client)
        finally:
            client.close()
        rollouts = CounterMetricFamily("strata_ledger_rollouts", "Rollouts generated, per tier (R4)", labels=["tier"])
        tokens = CounterMetricFamily("strata_ledger_tokens", "Response tokens generated, per tier", labels=["tier"])
        seconds = CounterMetricFamily("strata_ledger_device_seconds", "Device seconds of generation, per tier",
                                      labels=["tier"])
        for tier in summary.tiers:
            rollouts.add_metric([str(tier.tier)], tier.rollouts)
            tokens.add_metric([str(tier.tier)], tier.tokens)
            seconds.add_metric([str(tier.tier)], tier.device_seconds)
        stage_seconds = CounterMetricFamily("strata_ledger_stage_device_seconds",
                                            "Device seconds per stage and tier (encoder, probe, generate, RMs)",
                                            labels=["stage", "tier"])
        stage_param_tokens = CounterMetricFamily("strata_ledger_stage_param_tokens",
                                                 "Parameters x tokens per stage and tier (FLOPs-proportional)",
                                                 labels=["stage", "tier"])
        human = CounterMetricFamily("strata_ledger_human_seconds", "Configured human-review seconds booked")
        for stage in summary.stages:
            stage_seconds.add_metric([stage.stage, str(stage.tier)], stage.device_seconds)
            stage_param_tokens.add_metric([stage.stage, str(stage.tier)], stage.param_tokens)
        human.add_metric([], summary.human_seconds)
        events = CounterMetricFamily("strata_ledger_events", "Ledger counters (escalations, ...)", labels=["name"])
        for name, value in sorted(summary.counts.items()):
            events.add_metric([name], value)
        yield from (rollouts, tokens, seconds, stage_seconds, stage_param_tokens, human, events)
        if summary.saving is not None:
            yield GaugeMetricFamily("strata_ledger_saving_ratio",
                                    "1 - device seconds / all-Level-2 (R4; an estimate unless measured)",
                                    value=summary.saving)


    def _skipping(self) -> Iterator[Metric]:

        from svc_scheduler.config import SchedulerSettings
        from svc_scheduler.store import SchedulerStore

        client = redis_client.connect(self._settings.redis_address, socket_timeout=5)
        try:
            store = SchedulerStore(client, SchedulerSettings())
            summary = store.summary()
            audits = store.audit_summary()
        finally:
            client.close()
        if summary.submitted:
            yield GaugeMetricFamily("strata_scheduler_skip_rate", "Share of submitted prompts skipped (R10)",
                                    value=summary.skip_rate)
        audit_counts = GaugeMetricFamily("strata_scheduler_skip_audits",
                                         "Would-be skips rolled out anyway, in the audit window", labels=["state"])
        audit_counts.add_metric(["audited"], audits.audits)
        audit_counts.add_metric(["scored"], audits.scored)
        yield audit_counts
        if audits.reuse_mae is not None and audits.precision is not None:
            yield GaugeMetricFamily("strata_scheduler_skip_reuse_error",
                                    "Mean |fresh mean reward - reused reward| of the scored audits",
                                    value=audits.reuse_mae)
            yield GaugeMetricFamily("strata_scheduler_skip_precision",
                                    "Share of scored audits whose fresh reward is within the tolerance",
                                    value=audits.precision)


def exporter_registry(settings: StrataSettings, groups: Sequence[str] = DEFAULT_GROUPS) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StackCollector(settings, groups))
    return registry
