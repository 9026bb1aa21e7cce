"""Human labels for the reward models (R3, R5): annotators' scores as {prompt, response, score} pairs.

svc_annotation publishes one ``AnnotationCompleted`` per annotator score (hashes only); the texts
are in the content store. ``strata rm human-labels`` turns them into the JSONL that
``strata rm train-strong --data`` and ``strata rm distill --data`` read. Gold items (known scores
mixed in to watch annotators, R18) are left out: they measure the annotators, not the responses.
So are the scores of annotators the desk's drift alarm holds (``drifting_annotators``), as the desk's
human audit leaves them out: a drifting scale would teach the RM its drift. A response scored by
several annotators gets the mean of their scores.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from strata.bus import topics
from strata.bus.tail import TailReader
from strata.content_store import ContentNotFoundError


@dataclass(frozen=True)
class HumanLabel:
    prompt_hash: str
    response_hash: str
    score: float                   # mean of the annotators' scores, 0-5
    annotators: tuple[str, ...]
    unsafe: bool                   # any annotator flagged it
    off_topic: bool


def human_labels(events: Iterable[Any], left_out: frozenset[str] = frozenset()) -> list[HumanLabel]:
    """One label per (prompt, response) from ``AnnotationCompleted`` events; an annotator's score
    read twice (at-least-once delivery) counts once, gold items and the scores of the annotators
    ``left_out`` are left out."""
    scores: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for event in events:
        if event.gold or not event.response_hash or event.annotator_id in left_out:
            continue
        scores[(event.prompt_hash, event.response_hash)][event.annotator_id] = event
    labels = []
    for (prompt_hash, response_hash), by_annotator in sorted(scores.items()):
        done = list(by_annotator.values())
        labels.append(HumanLabel(prompt_hash, response_hash, sum(e.score for e in done) / len(done),
                                 tuple(sorted(by_annotator)), any(e.unsafe for e in done),
                                 any(e.off_topic for e in done)))
    return labels


def label_rows(labels: Sequence[HumanLabel], text_of: Any) -> tuple[list[dict[str, Any]], int]:
    """The JSONL rows of ``labels`` whose texts are still in the content store, and how many were not."""
    rows, missing = [], 0
    for label in labels:
        try:
            prompt, response = text_of(label.prompt_hash), text_of(label.response_hash)
        except ContentNotFoundError:
            missing += 1
            continue
        rows.append({"prompt": prompt, "response": response, "score": round(label.score, 4), "source": "human",
                     "annotators": list(label.annotators), "unsafe": label.unsafe, "off_topic": label.off_topic})
    return rows, missing


def drifting_annotators(client: redis.Redis) -> frozenset[str]:
    """The annotators the desk's drift alarm holds now (its Redis drift book; none when the desk keeps none)."""
    from svc_annotation.config import AnnotationSettings
    from svc_annotation.drift_book import DriftBook

    return DriftBook(client, AnnotationSettings().redis_prefix).drifting()


def read_completed(settings: Any, timeout_s: float = 60.0) -> list[Any]:
    """Every ``AnnotationCompleted`` Kafka still holds."""
    reader = TailReader(settings, [topics.ANNOTATIONS_COMPLETED], client_id="strata-rm-human-labels")
    events: list[Any] = []
    try:
        reader.seek_to_time(0)
        ends = reader.end_offsets()
        deadline = time.monotonic() + timeout_s
        while not reader.reached(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topics.ANNOTATIONS_COMPLETED.name} to its end "
                                   f"in {timeout_s:.0f} s")
            events.extend(event for _, event in reader.poll(1.0))
    finally:
        reader.close()
    return events
