"""Tiny reward models built in tmp_path (no zoo needed) and per-test RM-update topics."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from rmutil import TEXTS, constant_rm
from transformers import PreTrainedTokenizerFast

from strata.bus import Topic
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.v1 import events_pb2
from strata.zoo.train import train_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer() -> PreTrainedTokenizerFast:
    return train_tokenizer(TEXTS * 4, vocab_size=300)


@pytest.fixture
def make_rm(tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast) -> Callable[[str, float], Path]:
    """``make_rm(name, score)`` saves a constant tiny RM under tmp_path and returns its directory."""

    def make(name: str, score: float, seed: int = 0) -> Path:
        out = tmp_path / name
        constant_rm(tiny_tokenizer, score, seed).save_pretrained(out)
        tiny_tokenizer.save_pretrained(out)
        return out

    return make


@pytest.fixture
def rm_topic(infra: StrataSettings) -> Topic[events_pb2.RewardModelUpdated]:
    """A single-partition RM-update topic used by one test only (like strata.rm.updated)."""
    topic = Topic(f"test.rm.{uuid.uuid4().hex[:10]}", events_pb2.RewardModelUpdated, key_field="rm_version")
    ensure_topics(infra.kafka_address, 1, topics=[topic])
    return topic


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    # Tiny models on a shared 2-core machine: one thread beats two that fight other processes.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
