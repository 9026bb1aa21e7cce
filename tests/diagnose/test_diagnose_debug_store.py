"""The debug-rollout store: full samples under their own keys, bounded, never read by training."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from strata.config import StrataSettings
from strata.debug_store import INDEX_KEY, PREFIX, DebugSample, DebugStore, debug_store_for

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_samples_round_trip_newest_first_and_stay_bounded(redis_client: redis.Redis) -> None:
    store = DebugStore(redis_client, ttl_s=60, max_samples=3)
    store.clear()
    for i in range(5):
        store.record(DebugSample(f"prompt {i}", f"response {i}", tier=1, policy_version=i, recorded_at=1000.0 + i,
                                 sampling={"temperature": 0.8}))
    recent = store.recent(10)
    assert [s.policy_version for s in recent] == [4, 3, 2]
    assert recent[0].prompt == "prompt 4" and recent[0].sampling == {"temperature": 0.8}
    assert redis_client.zcard(INDEX_KEY) == 3
    keys = {k.decode() for k in redis_client.scan_iter(match="strata:*debug*")}
    assert keys and all(k.startswith(PREFIX) for k in keys)
    assert 0 < redis_client.ttl(next(iter(keys))) <= 60
    store.clear()
    assert store.recent() == []


def test_only_debug_rollout_mode_gets_a_store() -> None:
    client = redis.Redis()  # never contacted: constructing a store does no I/O
    assert debug_store_for(StrataSettings(), client) is None
    assert isinstance(debug_store_for(StrataSettings(debug_rollout=True), client), DebugStore)


def test_no_training_code_reads_the_debug_store() -> None:
    training = [*sorted((REPO / "svc_learner").rglob("*.py")), *sorted((REPO / "strata_tools" / "rm").rglob("*.py")),
                REPO / "strata_tools" / "zoo" / "train.py", REPO / "strata" / "models" / "training.py"]
    assert all(p.is_file() for p in training), "a training module moved: update this list"
    pattern = re.compile(r"\bdebug_store\b|strata:debug:")
    offenders = [str(p.relative_to(REPO)) for p in training if pattern.search(p.read_text())]
    assert offenders == []
