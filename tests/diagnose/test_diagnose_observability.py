"""Observability wiring: Prometheus scrapes every service, the dashboard queries metrics that exist,
the gRPC interceptor counts and times RPCs, and the exporter reads lag and the cost ledger."""

from __future__ import annotations

import json
import re
import time
import uuid
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from kafka import KafkaConsumer
from prometheus_client import CollectorRegistry

from strata import ledger
from strata.bus import Publisher
from strata.config import StrataSettings
from strata.rpc_metrics import GRPC_REQUESTS, GRPC_SECONDS, GrpcMetricsInterceptor
from strata_tools.deploy import load
from strata_tools.diagnose.exporter import StackCollector

REPO = Path(__file__).resolve().parents[2]
_SUFFIX = re.compile(r"_(bucket|sum|count|total|created)$")


def base(name: str) -> str:
    return _SUFFIX.sub("", name)


def test_prometheus_scrapes_every_service_on_its_metrics_port() -> None:
    compose = load(REPO / "compose.yaml")
    config = yaml.safe_load((REPO / "deploy" / "prometheus.yml").read_text())
    targets = set()
    for job in config["scrape_configs"]:
        for static in job.get("static_configs", []):
            targets.update(static["targets"])
        for dns in job.get("dns_sd_configs", []):
            targets.update(f"{name}:{dns['port']}" for name in dns["names"])
    wanted = {f"{name}:{service['environment']['STRATA_METRICS_PORT']}"
              for name, service in compose["services"].items()
              if "STRATA_METRICS_PORT" in (service.get("environment") or {})}
    assert len(wanted) == 7
    assert wanted | {"strata-exporter:9157"} == targets
    prometheus = compose["services"]["prometheus"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "9157" in compose["services"]["strata-exporter"]["command"]


def test_every_metric_on_the_dashboard_is_exported_somewhere() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "strata-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"\b((?:strata|process)_[a-z0-9_]+)\b", expr)}
    packages = ("strata", "strata_tools", "svc_probe", "svc_generator", "svc_reward", "svc_scheduler", "svc_learner")
    sources = [p for d in packages for p in (REPO / d).rglob("*.py") if "/v1/" not in str(p)]
    defined = {base(n) for p in sources for n in re.findall(r"\"(strata_[a-z0-9_]+)\"", p.read_text())}
    missing = sorted(n for n in used if not n.startswith("process_") and base(n) not in defined)
    assert missing == []
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("grpc", "consumed", "latency", "batch size", "consumer lag", "tier mix", "skip rate",
                  "escalations", "cost per tier", "kl", "reward"):
        assert topic in titles, f"no panel about {topic}"


def test_grpc_interceptor_counts_and_times_requests_by_status() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[GrpcMetricsInterceptor()])
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    labels = ("grpc.health.v1.Health", "Check")
    ok_before = GRPC_REQUESTS.labels(*labels, "OK")._value.get()
    missing_before = GRPC_REQUESTS.labels(*labels, "NOT_FOUND")._value.get()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            with pytest.raises(grpc.RpcError) as error:
                stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
            assert error.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        server.stop(0)
    assert GRPC_REQUESTS.labels(*labels, "OK")._value.get() == ok_before + 1
    assert GRPC_REQUESTS.labels(*labels, "NOT_FOUND")._value.get() == missing_before + 1
    count = [s for m in GRPC_SECONDS.collect() for s in m.samples
             if s.name.endswith("_count") and s.labels == {"service": labels[0], "method": labels[1]}]
    assert count and count[0].value >= 2


def _values(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples}


@pytest.mark.integration
def test_exporter_reports_consumer_lag_and_the_cost_ledger(infra: StrataSettings, fresh_topic, redis_client) -> None:
    group = f"test-lag-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(infra.kafka_address, client_id="test-exporter")
    from strata.v1 import events_pb2

    try:
        for i in range(5):
            publisher.publish(fresh_topic, events_pb2.PromptRouted(prompt_hash=f"{i:064x}"))
        publisher.flush()
    finally:
        publisher.close()
    from kafka.structs import OffsetAndMetadata, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=infra.kafka_address, group_id=group, enable_auto_commit=False)
    partitions = [TopicPartition(fresh_topic.name, p) for p in consumer.partitions_for_topic(fresh_topic.name)]
    ends = consumer.end_offsets(partitions)
    consumer.commit({tp: OffsetAndMetadata(0, "", -1) for tp in partitions})  # nothing processed yet
    consumer.close()
    registry = CollectorRegistry()
    registry.register(StackCollector(infra, [group]))
    before = _values(registry)
    ledger.book(redis_client, "p" * 64, "r1", [ledger.charge_generation(2, 1000, 10, 40, 1.5)], ttl_s=60)
    ledger.count(redis_client, "escalations")
    after = _values(registry)
    assert sum(ends.values()) == 5
    assert after[("strata_consumer_lag", (("group", group), ("topic", fresh_topic.name)))] == 5
    assert after[("strata_exporter_up", (("source", "kafka"),))] == 1
    assert after[("strata_exporter_up", (("source", "redis"),))] == 1
    tier2 = (("tier", "2"),)
    assert after[("strata_ledger_rollouts_total", tier2)] == before.get(("strata_ledger_rollouts_total", tier2), 0) + 1
    assert after[("strata_ledger_tokens_total", tier2)] == before.get(("strata_ledger_tokens_total", tier2), 0) + 40
    escalations = ("strata_ledger_events_total", (("name", "escalations"),))
    assert after[escalations] == before.get(escalations, 0) + 1


def test_exporter_scrape_survives_a_dead_kafka_and_redis() -> None:
    registry = CollectorRegistry()
    registry.register(StackCollector(StrataSettings(kafka_bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0")))
    values = _values(registry)
    assert values[("strata_exporter_up", (("source", "kafka"),))] == 0
    assert values[("strata_exporter_up", (("source", "redis"),))] == 0


def test_exporter_and_report_show_the_skip_audit(infra: StrataSettings, redis_client) -> None:
    from strata_tools.cli.report_cmd import skip_lines
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.stats import RewardObservation
    from svc_scheduler.store import AuditRecord, SchedulerStore

    registry = CollectorRegistry()
    registry.register(StackCollector(infra, []))
    store = SchedulerStore(redis_client, SchedulerSettings())  # the prefix the services use
    before = _values(registry)
    prompt, request = uuid.uuid4().hex * 2, f"audit-{uuid.uuid4().hex[:8]}"
    store.record_audits([AuditRecord(prompt, request, 4.0)], time.time())
    store.count({"submitted": 1, "decision:level_1": 1, "audits": 1})
    store.apply_reward(prompt, "response-1", RewardObservation(3.8, 1, "rm", time.time()), time.time(), request)
    after = _values(registry)
    audited, scored = ("strata_scheduler_skip_audits", (("state", "audited"),)), \
        ("strata_scheduler_skip_audits", (("state", "scored"),))
    assert after[audited] == before.get(audited, 0) + 1 and after[scored] == before.get(scored, 0) + 1
    assert 0.0 <= after[("strata_scheduler_skip_reuse_error", ())] <= 5.0
    assert 0.0 <= after[("strata_scheduler_skip_precision", ())] <= 1.0
    lines = skip_lines(redis_client)
    assert lines[0].startswith("skipping: ") and "reuse error (MAE)" in lines[1]
