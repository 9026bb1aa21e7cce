"""strata diagnose annotators: ALARM when svc_annotation's drift tracker flags an annotator (R18)."""

from __future__ import annotations

import math
import uuid

import pytest

from strata.content_store import ContentStore
from strata.rpc import ServiceBinding, start_server
from strata.v1 import annotation_pb2, annotation_pb2_grpc
from strata_tools.diagnose.annotators import evaluate
from strata_tools.diagnose.verdict import Verdict
from svc_annotation.core import Rules
from svc_annotation.drift import Observation
from svc_annotation.drift_book import DriftBook
from svc_annotation.servicer import SERVICE_NAME, AnnotationServicer
from svc_annotation.store import AnnotationStore


def row(status: str, bias: float = math.nan, scored: int = 0) -> annotation_pb2.AnnotatorStatus:
    return annotation_pb2.AnnotatorStatus(drift_status=status, gold_bias=bias, scored=scored, gold_window=12)


@pytest.mark.parametrize(("rows", "verdict", "words"), [
    ({"ann": row("ok", 0.02), "bob": row("drift_up", 0.45)}, Verdict.ALARM, "bob (drift_up, gold bias +0.45)"),
    ({"ann": row("ok", 0.02), "bob": row("ok", -0.1)}, Verdict.PASS, "2 annotator(s) judged"),
    ({"ann": row("not_judged")}, Verdict.PASS, "enough gold items"),
    ({}, Verdict.PASS, "enough gold items"),
])
def test_the_rule(rows: dict, verdict: Verdict, words: str) -> None:
    result = evaluate(rows)
    assert result.verdict is verdict
    assert words in result.summary


@pytest.mark.integration
def test_the_command_reads_the_desk_and_exits_1_on_a_drifting_annotator(infra, redis_client, capsys) -> None:
    from strata_tools.cli.main import main

    prefix = f"test:diag:{uuid.uuid4().hex[:8]}"
    content = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    store = AnnotationStore(redis_client, content, prefix, Rules(0.0, 0.0, 600.0, 3600.0), 3600)
    book = DriftBook(redis_client, prefix)
    for i in range(15):
        book.feed_one(Observation("sim-drift", f"gold-{i}", 4.5, gold=3.5))
        book.feed_one(Observation("sim-ann", f"gold-{i}", 3.5, gold=3.5))
    server = start_server([ServiceBinding(annotation_pb2_grpc.add_AnnotationServicer_to_server,
                                          AnnotationServicer(store, drift=book), SERVICE_NAME)], 0, None)
    try:
        code = main(["diagnose", "annotators", "--annotation-address", f"127.0.0.1:{server.port}"])
    finally:
        server.stop(0.5)
    out = capsys.readouterr().out
    assert code == 1
    assert "ALARM" in out and "sim-drift (drift_up" in out
