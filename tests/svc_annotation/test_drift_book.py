"""Drift wired into the desk (R18): closed items feed each annotator's tracker in Redis once, and the
gRPC Status and the lead's page read it."""

from __future__ import annotations

import math
import uuid

from test_service import Desk

from strata.content_store import ContentStore
from strata.v1 import annotation_pb2
from svc_annotation.core import GoldItem
from svc_annotation.drift import AnnotatorState, DriftSettings, Observation, observe
from svc_annotation.drift_book import DriftBook, state_from_json, state_to_json
from svc_annotation.servicer import AnnotationServicer
from svc_annotation.worker import DeskLoop


def test_a_state_survives_its_json() -> None:
    state = AnnotatorState("ann")
    for i in range(12):
        state = observe(state, Observation("ann", f"g{i}", 4.0, gold=2.5, model_reward=3.0, peer_scores=(3.5,)),
                        DriftSettings())
    assert state.alarm is not None
    assert state_from_json(state_to_json(state)) == state


def test_gold_scores_feed_the_tracker_once_and_a_biased_annotator_raises_the_alarm(infra, redis_client) -> None:
    content = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    gold = [GoldItem(f"Boiling point of water at sea level? {uuid.uuid4()}", "100 C", 2.0) for _ in range(12)]
    desk = Desk(redis_client, content, gold_share=1.0, gold=gold)
    book = DriftBook(redis_client, f"test:drift:{uuid.uuid4().hex[:8]}")
    desk.loop = DeskLoop(desk.store, desk.publisher, redis_client, "test", 0.05, 64, 30.0, gold, drift=book)
    try:
        desk.loop.step()  # loads the gold set
        for who, score in (("biased", 3.5), ("careful", 2.0)):
            for _ in gold:
                offer = desk.next(who)
                desk.score(who, offer.item_id, score)
        desk.loop.step()
        desk.loop.step()  # a second pass feeds nothing twice
        snapshots = {s.annotator: s for s in book.snapshots()}
        assert snapshots["biased"].status == "drift_up" and snapshots["biased"].alarm
        assert snapshots["biased"].gold.n == len(gold)
        assert snapshots["careful"].status == "ok" and not snapshots["careful"].alarm
        servicer = AnnotationServicer(desk.store, drift=book)
        status = servicer.Status(annotation_pb2.StatusRequest(), None)  # type: ignore[arg-type]
        assert status.annotators["biased"].drift_status == "drift_up"
        assert math.isclose(status.annotators["biased"].gold_bias, 1.5)
        assert book.acknowledge("biased").status == "not_judged"  # the lead's reset restarts the tracking
    finally:
        desk.close()
