"""Tiny reward models built in tmp_path (no zoo needed) and per-test RM-update topics."""

from __future__ import annotations

import uuid

import pytest
from rmutil import make_rm, tiny_tokenizer
from torchutil import one_torch_thread

from strata.bus import Topic
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.v1 import events_pb2


@pytest.fixture
def rm_topic(infra: StrataSettings) -> Topic[events_pb2.RewardModelUpdated]:
    """A single-partition RM-update topic used by one test only (like strata.rm.updated)."""
    topic = Topic(f"test.rm.{uuid.uuid4().hex[:10]}", events_pb2.RewardModelUpdated, key_field="rm_version")
    ensure_topics(infra, 1, topics=[topic])
    return topic


__all__ = ["make_rm", "one_torch_thread", "tiny_tokenizer"]
