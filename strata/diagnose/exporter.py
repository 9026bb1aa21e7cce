"""Stack-wide metrics no single service owns: consumer lag, tier mix, cost per tier, escalations.

Each service exports its own process metrics; these numbers live in Kafka (committed offsets vs end
offsets of every consumer group) and in the cost ledger in Redis (``strata.ledger``, written by the
generators and the reward service), so one small exporter reads them at scrape time:

- ``strata_consumer_lag{group,topic}``: events not yet committed by a group;
- ``strata_ledger_rollouts_total{tier}``, ``strata_ledger_tokens_total{tier}``,
  ``strata_ledger_device_seconds_total{tier}``: the tier mix and cost per tier (R4);
- ``strata_ledger_events_total{name}``: ledger counters (``escalations``, ...);
- ``strata_ledger_saving_ratio``: 1 - actual / all-at-Level-2 device seconds;
- ``strata_exporter_up{source}``: 1 when Kafka / Redis answered this scrape.

``strata diagnose exporter`` serves them (compose: the ``strata-exporter`` service).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from strata.config import StrataSettings

log = logging.getLogger(__name__)

DEFAULT_GROUPS = ("svc-scheduler-stats", "svc-probe", "svc-generator-l1", "svc-generator-l2", "svc-reward",
                  "svc-learner")


def consumer_lags(settings: StrataSettings, groups: Sequence[str]) -> dict[tuple[str, str], int]:
    """(group, topic) -> events published but not yet committed by the group."""
    from kafka import KafkaAdminClient, KafkaConsumer

    # Short timeouts: a scrape (Prometheus' default timeout is 10 s) must answer even with Kafka down.
    admin = KafkaAdminClient(bootstrap_servers=settings.kafka_address, request_timeout_ms=4000,
                             bootstrap_timeout_ms=3000, client_id="strata-exporter")
    consumer = KafkaConsumer(bootstrap_servers=settings.kafka_address, group_id=None, enable_auto_commit=False,
                             client_id="strata-exporter")
    lags: dict[tuple[str, str], int] = {}
    try:
        # kafka-python 3: {group: {TopicPartition: OffsetAndMetadata}} (older: list_consumer_group_offsets)
        offsets = admin.list_group_offsets(dict.fromkeys(groups)) if groups else {}
        for group in groups:
            committed = {tp: meta for tp, meta in (offsets.get(group) or {}).items() if meta.offset >= 0}
            if not committed:
                continue
            ends = consumer.end_offsets(list(committed))
            for tp, meta in committed.items():
                key = (group, tp.topic)
                lags[key] = lags.get(key, 0) + max(0, ends[tp] - meta.offset)
    finally:
        admin.close()
        consumer.close()
    return lags


class StackCollector(Collector):
    def __init__(self, settings: StrataSettings, groups: Sequence[str] = DEFAULT_GROUPS) -> None:
        self._settings = settings
        self._groups = tuple(groups)

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("strata_exporter_up", "1 when the source answered this scrape", labels=["source"])
        try:
            lags = consumer_lags(self._settings, self._groups)
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
            up.add_metric(["redis"], 1)
        except Exception as exc:
            log.warning("cost ledger unavailable: %s", exc)
            up.add_metric(["redis"], 0)
        yield up

    def _ledger(self) -> Iterator[Metric]:
        import redis

        from strata import ledger

        client = redis.Redis.from_url(self._settings.redis_address, socket_timeout=5)
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
        events = CounterMetricFamily("strata_ledger_events", "Ledger counters (escalations, ...)", labels=["name"])
        for name, value in sorted(summary.counts.items()):
            events.add_metric([name], value)
        yield from (rollouts, tokens, seconds, events)
        if summary.saving is not None:
            yield GaugeMetricFamily("strata_ledger_saving_ratio", "1 - device seconds / all-at-Level-2 (R4)",
                                    value=summary.saving)


def exporter_registry(settings: StrataSettings, groups: Sequence[str] = DEFAULT_GROUPS) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StackCollector(settings, groups))
    return registry
