"""``strata bench learner``: PPO update throughput, weight-sync time and reward gain, in one run.

Needs a running Kafka and Redis (``strata infra up``); all traffic goes to fresh topics of its own.
On this machine, in-process:

* the learner service as ``python -m svc_learner`` wires it (consumer group on the rewards topic,
  update loop, checkpoints, policy-updated events, rollout tail, gRPC), started with
  ``strata.service.start_service``;
* a real Level-1 generator engine: the HF backend, the dynamic batcher and the policy watcher of
  ``svc_generator`` (over real Kafka, following the learner's policy topic), with the bench playing
  the generator worker (store content, claim, publish the rollout) and the reward service (a toy
  reward, published as final Level-1 rewards).

Each round generates ``--batch-size`` rollouts on the generator's current weights, scores them,
waits for the learner's update and for the generator to load the new version. Reported:

* ``tokens/s``: batch tokens (prompt + response, no padding) x PPO epochs per second of update wall
  time (median over updates; ``perf/tokens_per_second``), i.e. how fast the learner digests rollouts;
* ``sync_s``: the learner's own measure (median over versions): ``PolicyUpdated`` published -> the
  first rollout stamped with the new version read back from the rollouts topic. It includes the
  watcher's poll, loading the weights and one generation batch;
* ``reward_gain``: (mean toy reward after - before) / before, each on ``--eval-samples`` fresh
  rollouts of held-out prompts, before the first update and after the last.

The toy reward is ``5 x`` the share of lowercase vowels in the response text: learnable in a few
updates by a tiny random policy, which the default model is (a 2-layer GPT-2 on a character
tokenizer, built in a temp dir; ``--model`` runs the same loop on any local causal LM, e.g. the
zoo's Level-1). Last line: ``learner reward_gain=<fraction> sync_s=<seconds>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

VOWELS = frozenset("aeiou")
WORDS = ("river", "stone", "cloud", "garden", "engine", "letter", "market", "signal", "window", "forest",
         "bridge", "candle", "planet", "mirror", "harbor", "ladder")  # fmt: skip


def toy_reward(response: str) -> float:
    """5 x the share of lowercase vowels among the response's characters (0 for an empty response)."""
    return 5.0 * sum(ch in VOWELS for ch in response) / len(response) if response else 0.0


def toy_prompts(count: int, offset: int = 0) -> list[str]:
    """Short lowercase prompts; ``offset`` gives disjoint sets (held-out evaluation prompts)."""
    return [f"tell me about the {WORDS[i % len(WORDS)]} number {i}" for i in range(offset, offset + count)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--updates", type=int, default=16, help="PPO updates (rounds) to run")
    parser.add_argument("--batch-size", type=int, default=16, help="rollouts per update")
    parser.add_argument("--minibatch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=4, help="PPO epochs per update")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--eval-samples", type=int, default=64, help="rollouts to measure the reward before/after")
    parser.add_argument("--model", default=None, help="causal LM directory (default: a tiny GPT-2 built here)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (checkpoints) afterwards")


def _require_infra() -> Any:
    from strata.config import StrataSettings
    from strata.errors import CliError
    from strata_tools.infra import kafka_broker, redis_server

    settings = StrataSettings()
    if not kafka_broker.answers(settings):
        raise CliError(f"Kafka at {settings.kafka_address} does not answer: run `strata infra up` "
                       "(or set STRATA_KAFKA_BOOTSTRAP)")  # fmt: skip
    if not redis_server.answers(settings.redis_address):
        raise CliError(f"Redis at {settings.redis_address_masked} does not answer: run `strata infra up` "
                       "(or set STRATA_REDIS_URL)")  # fmt: skip
    return settings


def run(args: argparse.Namespace) -> int:
    import shutil

    from strata.errors import CliError

    if args.updates < 2:
        raise CliError("--updates must be >= 2 (a version's sync is timed by the next round's rollouts)")
    infra = _require_infra()
    workdir = Path(tempfile.mkdtemp(prefix="strata-bench-learner-"))
    try:
        return _run(args, infra, workdir)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _wait(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"bench: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(0.02)


def _run(args: argparse.Namespace, infra: Any, workdir: Path) -> int:
    import redis
    import torch
    from transformers.utils import logging as hf_logging

    from strata.bus import Publisher, Topic
    from strata.bus.admin import ensure_topics
    from strata.content_store import ContentStore
    from strata.contract.directions import DIRECTION_NAMES
    from strata.models.tiny import build_char_policy
    from strata.sampling import Sampling
    from strata.service import start_service, stop_service
    from strata.v1 import common_pb2, events_pb2
    from svc_generator.backends.base import GenerationRequest
    from svc_generator.backends.hf import HfBackend
    from svc_generator.batcher import DynamicBatcher
    from svc_generator.policy_watch import PolicyWatcher
    from svc_learner.config import LearnerSettings
    from svc_learner.service import build_learner
    from svc_learner.worker import LearnerTopics

    hf_logging.disable_progress_bar()  # weights load and save at every version
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    model_dir = Path(args.model) if args.model else build_char_policy(workdir / "policy")
    run_id = uuid.uuid4().hex[:8]
    topics = LearnerTopics(
        rewards=Topic(f"bench.learner.{run_id}.rewards", events_pb2.RewardScored),
        policy=Topic(f"bench.learner.{run_id}.policy", events_pb2.PolicyUpdated, key_field="policy_version"),
        rollouts=Topic(f"bench.learner.{run_id}.rollouts", events_pb2.RolloutGenerated),
    )
    ensure_topics(infra, infra.topic_partitions, topics=[topics.rewards, topics.rollouts])
    ensure_topics(infra, 1, topics=[topics.policy])  # ordered, like strata.policy.updated

    settings = LearnerSettings(
        kafka_bootstrap=infra.kafka_address, redis_url=infra.redis_address, policy_model_path=model_dir,
        checkpoint_dir=workdir / "checkpoints", device=args.device, batch_size=args.batch_size,
        minibatch_size=min(args.minibatch_size, args.batch_size), update_epochs=args.epochs,
        learning_rate=args.learning_rate, group_id=f"bench-learner-{run_id}", grpc_port=0, log_level="WARNING",
    )  # fmt: skip
    learner = build_learner(settings, topics)
    parts = learner.parts()
    running = start_service(parts)

    backend = HfBackend(str(model_dir), device=args.device)
    if backend.tokenizer_id != learner.tokenizer_id:
        raise RuntimeError(f"generator tokenizer id {backend.tokenizer_id} != learner's {learner.tokenizer_id}")
    batcher = DynamicBatcher(backend, max_batch_size=max(args.batch_size, args.eval_samples), max_wait_s=0.01)
    stop = threading.Event()
    # Its own policy topic: a real generator's watcher reads strata.policy.updated.
    watcher = PolicyWatcher(infra, batcher, topic=topics.policy)
    threads = [threading.Thread(target=target, args=(stop,), daemon=True) for target in (batcher.run, watcher.run)]
    for thread in threads:
        thread.start()
    client = redis.Redis.from_url(infra.redis_address)
    store = ContentStore(client, infra.content_ttl_s, infra.content_max_bytes)
    publisher = Publisher(infra, client_id=f"bench-learner-{run_id}")
    sampling = Sampling(temperature=1.0, top_p=0.94, max_new_tokens=args.max_new_tokens)

    def evaluate(prompts: list[str]) -> float:
        futures = batcher.submit([GenerationRequest(p, (), sampling) for p in prompts])
        return statistics.fmean(toy_reward(f.result().output.text) for f in futures)

    def play_round(index: int) -> tuple[float, int]:
        """Generate a batch, store and publish it as the generator worker would, score it."""
        prompts = toy_prompts(args.batch_size, offset=index * args.batch_size)
        directions = [(DIRECTION_NAMES[i % len(DIRECTION_NAMES)],) for i in range(len(prompts))]
        futures = batcher.submit([GenerationRequest(p, d, sampling) for p, d in zip(prompts, directions, strict=True)])
        sent, rewards, versions = [], [], set()
        for prompt, chosen, future in zip(prompts, directions, futures, strict=True):
            result = future.result()
            prompt_hash = store.put(prompt)
            response_hash = store.put(result.output.text, result.output.token_ids, backend.tokenizer_id)
            request_id = f"bench-{run_id}-{index}-{prompt_hash[:8]}"
            rollout = events_pb2.RolloutGenerated(
                prompt_hash=prompt_hash, response_hash=response_hash, tier=common_pb2.TIER_LEVEL_1,
                policy_version=result.policy_version, model_id=result.model_id, sample_index=0,
                response_tokens=len(result.output.token_ids), request_id=request_id,
                directions=[common_pb2.Direction(name=chosen[0], score=1.0)],
            )  # fmt: skip
            rollout.generated_at.GetCurrentTime()
            sent.append(publisher.publish(topics.rollouts, rollout))
            reward = toy_reward(result.output.text)
            scored = events_pb2.RewardScored(
                prompt_hash=prompt_hash, response_hash=response_hash, tier=common_pb2.TIER_LEVEL_1,
                policy_version=result.policy_version, rm_version="toy-vowels", reward=reward,
                scorer=common_pb2.SCORER_LIGHT, final=True, sample_index=0,
                response_tokens=len(result.output.token_ids), request_id=request_id,
                directions=rollout.directions,
            )  # fmt: skip
            sent.append(publisher.publish(topics.rewards, scored))
            rewards.append(reward)
            versions.add(result.policy_version)
        publisher.wait(sent)
        return statistics.fmean(rewards), max(versions)

    eval_prompts = toy_prompts(args.eval_samples, offset=1_000_000)
    throughput: list[float] = []
    try:
        before = evaluate(eval_prompts)
        print(f"model {model_dir} ({sum(p.numel() for p in backend.lm.model.parameters()) / 1e6:.2f}M params), "
              f"batch {args.batch_size}, {args.epochs} epochs, lr {args.learning_rate}")  # fmt: skip
        print(f"before: mean toy reward {before:.3f} on {len(eval_prompts)} held-out rollouts")
        for index in range(args.updates):
            mean_reward, generated_on = play_round(index)
            _wait(lambda i=index: learner.engine.version > i, 600, f"update {index + 1}")
            status = learner.engine.status()
            version = status.policy_version
            _wait(lambda v=version: batcher.policy_version >= v, 120, f"the generator on v{version}")
            throughput.append(status.metrics["perf/tokens_per_second"])
            print(f"update {index + 1:3d}: batch reward {mean_reward:.3f} (generated on v{generated_on}), "
                  f"kl {status.metrics['charts/kl']:.4f}, eps {status.metrics['charts/clip_epsilon']:.3f}, "
                  f"{status.metrics['perf/update_seconds']:.2f} s, {throughput[-1]:.0f} tokens/s")  # fmt: skip
        after = evaluate(eval_prompts)
        # Versions 1..N-1 are timed by the next round's rollouts (the last one has no next round).
        _wait(lambda: len(learner.engine.sync.history) >= args.updates - 1, 60, "the weight-sync measurements")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
        stop_service(parts, running)
        publisher.close()
        client.close()
    syncs = [seconds for _, seconds in learner.engine.sync.history]
    status = learner.engine.status()
    gain = (after - before) / before if before > 0 else after
    print(f"after:  mean toy reward {after:.3f} on the same held-out prompts (policy v{status.policy_version})")
    print(f"PPO update: median {statistics.median(throughput):.0f} tokens/s (batch tokens x epochs / update time)")
    print(f"weight sync (publish -> first rollout on the new version): median {statistics.median(syncs):.2f} s, "
          f"max {max(syncs):.2f} s over {len(syncs)} versions")  # fmt: skip
    print(f"samples: {dict((k, v) for k, v in status.counts.items() if v)}")
    print(f"learner reward_gain={gain:.3f} sync_s={statistics.median(syncs):.2f}")
    return 0
