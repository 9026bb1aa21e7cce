"""Annotators' scores become {prompt, response, score} pairs for the RMs (strata rm human-labels)."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from strata.bus import Publisher, topics
from strata.content_store import ContentNotFoundError, ContentStore
from strata.v1 import events_pb2
from strata_tools.rm.human import HumanLabel, human_labels, label_rows


def completed(prompt: str, response: str, annotator: str, score: float,
              **flags: bool) -> events_pb2.AnnotationCompleted:
    return events_pb2.AnnotationCompleted(prompt_hash=prompt, response_hash=response, annotator_id=annotator,
                                          score=score, **flags)


def test_labels_average_annotators_count_each_once_and_leave_gold_out() -> None:
    events = [completed("p1", "r1", "ann", 4.0), completed("p1", "r1", "bob", 3.0, unsafe=True),
              completed("p1", "r1", "ann", 4.0),  # redelivered
              completed("p2", "r2", "ann", 1.0, gold=True), completed("p3", "r3", "bob", 2.5, off_topic=True)]
    assert human_labels(events) == [
        HumanLabel("p1", "r1", 3.5, ("ann", "bob"), unsafe=True, off_topic=False),
        HumanLabel("p3", "r3", 2.5, ("bob",), unsafe=False, off_topic=True),
    ]


def test_the_scores_of_annotators_in_drift_alarm_are_left_out() -> None:
    events = [completed("p1", "r1", "ann", 2.0), completed("p1", "r1", "drifty", 4.0),
              completed("p2", "r2", "drifty", 5.0)]
    assert human_labels(events, left_out=frozenset({"drifty"})) == [
        HumanLabel("p1", "r1", 2.0, ("ann",), unsafe=False, off_topic=False)]


def test_rows_leave_out_labels_whose_texts_expired() -> None:
    texts = {"p1": "How do I bleed a radiator?", "r1": "Open the valve a quarter turn."}

    def text_of(digest: str) -> str:
        if digest not in texts:
            raise ContentNotFoundError(digest)
        return texts[digest]

    rows, missing = label_rows([HumanLabel("p1", "r1", 3.5, ("ann",), False, False),
                                HumanLabel("p9", "r9", 1.0, ("ann",), False, False)], text_of)
    assert missing == 1
    assert rows == [{"prompt": texts["p1"], "response": texts["r1"], "score": 3.5, "source": "human",
                     "annotators": ["ann"], "unsafe": False, "off_topic": False}]


@pytest.mark.integration
def test_the_command_writes_what_train_strong_reads(infra, redis_client, tmp_path, monkeypatch) -> None:
    from strata_tools.cli.main import main
    from strata_tools.rm.lifecycle import read_pairs

    store = ContentStore(redis_client, infra.content_ttl_s, infra.content_max_bytes)
    prompt, response = store.put(f"Why do onions sting? {uuid.uuid4()}"), store.put(f"Sulfur gas. {uuid.uuid4()}")
    publisher = Publisher(infra)
    try:
        publisher.publish_and_wait(topics.ANNOTATIONS_COMPLETED, completed(prompt, response, "ann", 4.5))
    finally:
        publisher.close()
    for key, value in {"STRATA_KAFKA_BOOTSTRAP": infra.kafka_address, "STRATA_REDIS_URL": infra.redis_address}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "human.jsonl"
    assert main(["rm", "human-labels", "--out", str(out)]) == 0
    pairs = read_pairs(out, need_score=True)
    assert [p["score"] for p in pairs if p["prompt"] == store.get_text(prompt)] == [4.5]
    assert all(json.loads(line)["source"] == "human" for line in out.read_text().splitlines())
    assert not os.path.exists(str(out) + ".partial")


@pytest.mark.integration
def test_the_drifting_annotators_are_read_from_the_desks_drift_book(redis_client) -> None:
    from strata_tools.rm.human import drifting_annotators
    from svc_annotation.config import AnnotationSettings
    from svc_annotation.drift import Alarm, AnnotatorState
    from svc_annotation.drift_book import state_to_json

    prefix = f"{AnnotationSettings().redis_prefix}:drift:"
    names = {f"steady-{uuid.uuid4().hex[:6]}": None, f"drifty-{uuid.uuid4().hex[:6]}": Alarm("drift_up", 41, 5.2)}
    for name, alarm in names.items():
        redis_client.set(prefix + name, state_to_json(AnnotatorState(name, items=60, alarm=alarm)))
    try:
        found = drifting_annotators(redis_client)
    finally:
        redis_client.delete(*(prefix + name for name in names))
    steady, drifty = names
    assert drifty in found and steady not in found
