"""Simulated annotators score through svc_annotation's gRPC desk as a person's client would."""

from __future__ import annotations

import time
import uuid

import pytest

from strata.content_store import ContentStore
from strata.rpc import ServiceBinding, start_server
from strata.rpc_auth import CallerIdentity
from strata.v1 import annotation_pb2_grpc, common_pb2, events_pb2
from strata_tools.task.desk import SimulatedDesk, demo_pool
from strata_tools.task.oracle import SimulatedAnnotator
from svc_annotation.core import Rules
from svc_annotation.servicer import SERVICE_NAME, AnnotationServicer
from svc_annotation.store import AnnotationStore
from svc_annotation.worker import item_of

pytestmark = pytest.mark.integration


def requested(content: ContentStore, i: int) -> events_pb2.AnnotationRequested:
    tag = uuid.uuid4().hex[:8]
    prompt = content.put(f"How do I descale a kettle? {tag}")
    response = content.put(f"Boil a mix of water and vinegar, then rinse twice. {tag}")
    provisional = events_pb2.RewardScored(prompt_hash=prompt, response_hash=response, tier=common_pb2.TIER_LEVEL_2,
                                          reward=3.0, scorer=common_pb2.SCORER_STRONG, request_id=f"r-{tag}",
                                          sample_index=i, awaiting_annotation=True)
    return events_pb2.AnnotationRequested(prompt_hash=prompt, response_hash=response, tier=common_pb2.TIER_LEVEL_2,
                                          model_reward=3.0, provisional=provisional)


def test_each_item_is_scored_once_by_the_pool(infra, redis_client) -> None:
    content = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    rules = Rules(0.0, 0.0, 600.0, 3600.0)
    store = AnnotationStore(redis_client, content, f"test:sim:{uuid.uuid4().hex[:8]}", rules, 3600)
    for i in range(6):
        assert store.enqueue(item_of(requested(content, i), time.time(), rules))
    server = start_server([ServiceBinding(annotation_pb2_grpc.add_AnnotationServicer_to_server,
                                          AnnotationServicer(store, CallerIdentity(None)), SERVICE_NAME)], 0, None)
    try:
        pool = [SimulatedAnnotator("sim-a", seed=1), SimulatedAnnotator("sim-b", seed=2)]
        with SimulatedDesk(f"127.0.0.1:{server.port}", pool, idle_s=0.05) as desk:
            deadline = time.monotonic() + 30
            while sum(desk.counts.scored.values()) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert sum(desk.counts.scored.values()) == 6
        status = store.status()
        assert status.completed == 6 and status.queue_depth == 0
    finally:
        server.stop(0.5)


def test_the_demo_pool_has_one_drifting_annotator() -> None:
    pool = demo_pool()
    assert [a.name for a in pool if a.drift] == ["sim-drift"]
    assert len({a.name for a in pool}) == 3
