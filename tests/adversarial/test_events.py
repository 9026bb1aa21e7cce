"""Poison on the bus: an event a tier cannot use is dead-lettered once, and the partition moves on
(the prompts after it are served)."""

from __future__ import annotations

import uuid

import pytest

from adversarial.edgeutil import Edge, Outcomes
from strata.bus import Publisher, topics
from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2

pytestmark = pytest.mark.integration


def routed(edge: Edge, text: str | None, **fields: object) -> events_pb2.PromptRouted:
    """A Level-1 prompt event; ``text`` None: its hash names a text the content store does not hold."""
    if text is None:
        prompt_hash = content_hash(f"never stored {uuid.uuid4()}")
    else:
        store = ContentStore.from_url(edge.infra.redis_address, edge.infra.content_ttl_s, edge.infra.content_max_bytes)
        prompt_hash = store.put(text)
    fields = {"n_samples": 1, "request_id": f"event-{uuid.uuid4().hex}", **fields}
    event = events_pb2.PromptRouted(prompt_hash=prompt_hash, tier=common_pb2.TIER_LEVEL_1,
                                    decision=common_pb2.DECISION_LEVEL_1, **fields)  # type: ignore[arg-type]
    event.routed_at.GetCurrentTime()
    return event


@pytest.fixture
def publisher(edge: Edge):
    made = Publisher(edge.infra, client_id="test-edge-events")
    yield made
    made.close()


def test_poison_events_are_dead_lettered_and_the_next_prompt_is_served(edge: Edge, outcomes: Outcomes,
                                                                      publisher: Publisher) -> None:
    topic = topics.PROMPTS_LEVEL1
    missing_text = routed(edge, None)
    too_long_answer = routed(edge, "What is rain?")
    too_long_answer.sampling.max_new_tokens = 4096
    too_many = routed(edge, "What is snow?", n_samples=1_000_000)  # would queue a million generations
    good = routed(edge, "Why do leaves fall in autumn?")
    for key in (missing_text.prompt_hash, good.prompt_hash):  # the same partitions as the events after them
        publisher.publish_raw(topic.name, key.encode(), b"\xff\x00 not protobuf")
    for event in (missing_text, too_long_answer, too_many, good):
        publisher.publish_and_wait(topic, event)
    outcomes.wait_served([good.request_id])
    for _ in range(240):
        if {missing_text.request_id, too_long_answer.request_id, too_many.request_id} <= outcomes.dead:
            break
        outcomes.poll()
    poison = [missing_text, too_long_answer, too_many]
    assert {p.request_id for p in poison} <= outcomes.dead
    assert not {p.request_id for p in poison} & set(outcomes.finals)
