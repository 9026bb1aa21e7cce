"""The fine-tuning's history is the scheduler's own state in a real Redis."""

from __future__ import annotations

import time
import uuid

import numpy as np
import redis

from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata_tools.encoder.finetune import history_from_redis
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.stats import RewardObservation
from svc_scheduler.store import SchedulerStore


def test_history_holds_indexed_prompts_with_enough_safe_rewards_and_their_texts(
        infra: StrataSettings, redis_client: redis.Redis) -> None:
    settings = SchedulerSettings(**{**infra.model_dump(), "redis_prefix": f"test:enc:{uuid.uuid4().hex[:8]}"})
    store = SchedulerStore(redis_client, settings)
    content = ContentStore(redis_client, settings.content_ttl_s, settings.content_max_bytes)
    rewards = {"steady": [4.0, 4.5, 4.0], "varied": [1.0, 5.0, 3.0, 1.0], "unsafe": [4.0, 4.0, 4.0],
               "too few": [4.0, 4.0], "text expired": [3.0, 3.0, 3.0]}
    hashes = {name: content_hash(f"prompt {name}") for name in rewards}
    store.index_prompts(list(hashes.values()), np.eye(len(hashes), 384, dtype=np.float32))
    now = time.time()
    for name, values in rewards.items():
        if name != "text expired":
            content.put(f"prompt {name}")
        for i, value in enumerate(values):
            observation = RewardObservation(value, 1, "rm-test", now, unsafe=name == "unsafe" and i == 0)
            store.apply_reward(hashes[name], f"response-{name}-{i}", observation, now)

    history = {p.text: p for p in history_from_redis(settings, redis_client)}
    assert sorted(history) == ["prompt steady", "prompt varied"]
    steady, varied = history["prompt steady"], history["prompt varied"]
    assert (steady.prompt_hash, steady.count) == (hashes["steady"], 3)
    assert steady.mean == np.mean(rewards["steady"]) and varied.variance > 3.0
    assert steady.standard_error < varied.standard_error
