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
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata import redis_client
from strata.bus import Publisher, Topic
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.contract.directions import DIRECTION_NAMES
from strata.errors import CliError
from strata.sampling import Sampling
from strata.service import start_service, stop_service
from strata.v1 import common_pb2, events_pb2
from strata_tools.infra import kafka_broker, redis_server

if TYPE_CHECKING:  # torch and the services: imported by a run, not by `strata bench --help`
    import redis

    from strata.service import RunningService, ServiceParts
    from svc_generator.backends.hf import HfBackend
    from svc_generator.batcher import DynamicBatcher, SampleResult
    from svc_learner.service import Learner
    from svc_learner.worker import LearnerTopics

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
    settings = StrataSettings()
    if not kafka_broker.answers(settings):
        raise CliError(f"Kafka at {settings.kafka_address} does not answer: run `strata infra up` "
                       "(or set STRATA_KAFKA_BOOTSTRAP)")  # fmt: skip
    if not redis_server.answers(settings.redis_address):
        raise CliError(f"Redis at {settings.redis_address_masked} does not answer: run `strata infra up` "
                       "(or set STRATA_REDIS_URL)")  # fmt: skip
    return settings


def run(args: argparse.Namespace) -> int:
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


@dataclass
class _Rig:
    """The learner service and the generator engine one run drives, and the means to publish to them."""

    run_id: str
    model_dir: Path
    topics: LearnerTopics
    learner: Learner
    parts: ServiceParts
    running: RunningService
    backend: HfBackend
    batcher: DynamicBatcher
    stop: threading.Event
    threads: list[threading.Thread]
    client: redis.Redis
    store: ContentStore
    publisher: Publisher
    sampling: Sampling


@dataclass
class _Outcome:
    """The held-out mean toy reward before the first update and after the last, and each update's tokens/s."""

    before: float
    after: float
    throughput: list[float]


def _run(args: argparse.Namespace, infra: Any, workdir: Path) -> int:
    rig = _start(args, infra, workdir)
    eval_prompts = toy_prompts(args.eval_samples, offset=1_000_000)
    try:
        outcome = _train(rig, args, eval_prompts)
    finally:
        _stop(rig)
    _print_summary(rig, outcome)
    return 0


def _start(args: argparse.Namespace, infra: Any, workdir: Path) -> _Rig:
    """The learner service started on fresh topics, and a generator engine following its policy topic."""
    import torch
    from transformers.utils import logging as hf_logging

    from strata.models.tiny import build_char_policy

    hf_logging.disable_progress_bar()  # weights load and save at every version
    torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    model_dir = Path(args.model) if args.model else build_char_policy(workdir / "policy")
    run_id = uuid.uuid4().hex[:8]
    topics = _learner_topics(infra, run_id)
    learner = _build_learner(args, infra, workdir, model_dir, run_id, topics)
    parts = learner.parts()
    running = start_service(parts)
    backend, batcher, stop, threads = _start_generator(args, infra, model_dir, learner, topics)
    client = redis_client.connect(infra.redis_address)
    return _Rig(
        run_id=run_id, model_dir=model_dir, topics=topics, learner=learner, parts=parts, running=running,
        backend=backend, batcher=batcher, stop=stop, threads=threads, client=client,
        store=ContentStore(client, infra.content_ttl_s, infra.content_max_bytes),
        publisher=Publisher(infra, client_id=f"bench-learner-{run_id}"),
        sampling=Sampling(temperature=1.0, top_p=0.94, max_new_tokens=args.max_new_tokens),
    )  # fmt: skip


def _learner_topics(infra: Any, run_id: str) -> LearnerTopics:
    """The run's own rewards, policy and rollouts topics, created."""
    from svc_learner.worker import LearnerTopics

    topics = LearnerTopics(
        rewards=Topic(f"bench.learner.{run_id}.rewards", events_pb2.RewardScored),
        policy=Topic(f"bench.learner.{run_id}.policy", events_pb2.PolicyUpdated, key_field="policy_version"),
        rollouts=Topic(f"bench.learner.{run_id}.rollouts", events_pb2.RolloutGenerated),
    )
    ensure_topics(infra, infra.topic_partitions, topics=[topics.rewards, topics.rollouts])
    ensure_topics(infra, 1, topics=[topics.policy])  # ordered, like strata.policy.updated
    return topics


def _build_learner(
    args: argparse.Namespace, infra: Any, workdir: Path, model_dir: Path, run_id: str, topics: LearnerTopics
) -> Learner:
    """The learner service as ``python -m svc_learner`` wires it, on the bench's settings (not started)."""
    from svc_learner.config import LearnerSettings
    from svc_learner.service import build_learner

    settings = LearnerSettings(
        kafka_bootstrap=infra.kafka_address, redis_url=infra.redis_address, policy_model_path=model_dir,
        checkpoint_dir=workdir / "checkpoints", device=args.device, batch_size=args.batch_size,
        minibatch_size=min(args.minibatch_size, args.batch_size), update_epochs=args.epochs,
        learning_rate=args.learning_rate, group_id=f"bench-learner-{run_id}", grpc_port=0, log_level="WARNING",
    )  # fmt: skip
    return build_learner(settings, topics)


def _start_generator(
    args: argparse.Namespace, infra: Any, model_dir: Path, learner: Learner, topics: LearnerTopics
) -> tuple[HfBackend, DynamicBatcher, threading.Event, list[threading.Thread]]:
    """The generator's backend, its batcher and policy watcher running, their stop event and threads."""
    from svc_generator.backends.hf import HfBackend
    from svc_generator.batcher import DynamicBatcher
    from svc_generator.policy_watch import PolicyWatcher

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
    return backend, batcher, stop, threads


def _stop(rig: _Rig) -> None:
    """Stop the generator's threads and the learner service; close the publisher and Redis."""
    rig.stop.set()
    for thread in rig.threads:
        thread.join(timeout=10)
    stop_service(rig.parts, rig.running)
    rig.publisher.close()
    rig.client.close()


def _evaluate(rig: _Rig, prompts: list[str]) -> float:
    """The mean toy reward of one rollout per prompt on the generator's current weights."""
    from svc_generator.backends.base import GenerationRequest

    futures = rig.batcher.submit([GenerationRequest(p, (), rig.sampling) for p in prompts])
    return statistics.fmean(toy_reward(f.result().output.text) for f in futures)


def _train(rig: _Rig, args: argparse.Namespace, eval_prompts: list[str]) -> _Outcome:
    """The reward before, ``--updates`` rounds each waited on up to the generator's reload, the reward after."""
    before = _evaluate(rig, eval_prompts)
    print(f"model {rig.model_dir} ({sum(p.numel() for p in rig.backend.lm.model.parameters()) / 1e6:.2f}M params), "
          f"batch {args.batch_size}, {args.epochs} epochs, lr {args.learning_rate}")  # fmt: skip
    print(f"before: mean toy reward {before:.3f} on {len(eval_prompts)} held-out rollouts")
    throughput: list[float] = []
    for index in range(args.updates):
        mean_reward, generated_on = _play_round(rig, args, index)
        status = _await_version(rig, index)
        throughput.append(status.metrics["perf/tokens_per_second"])
        print(f"update {index + 1:3d}: batch reward {mean_reward:.3f} (generated on v{generated_on}), "
              f"kl {status.metrics['charts/kl']:.4f}, eps {status.metrics['charts/clip_epsilon']:.3f}, "
              f"{status.metrics['perf/update_seconds']:.2f} s, {throughput[-1]:.0f} tokens/s")  # fmt: skip
    after = _evaluate(rig, eval_prompts)
    # Versions 1..N-1 are timed by the next round's rollouts (the last one has no next round).
    _wait(lambda: len(rig.learner.engine.sync.history) >= args.updates - 1, 60, "the weight-sync measurements")
    return _Outcome(before, after, throughput)


def _await_version(rig: _Rig, index: int) -> Any:
    """The learner's status once update ``index + 1`` is done and the generator runs its version."""
    _wait(lambda: rig.learner.engine.version > index, 600, f"update {index + 1}")
    status = rig.learner.engine.status()
    version = status.policy_version
    _wait(lambda: rig.batcher.policy_version >= version, 120, f"the generator on v{version}")
    return status


def _play_round(rig: _Rig, args: argparse.Namespace, index: int) -> tuple[float, int]:
    """Generate a batch, store and publish it as the generator worker would, score it; the mean reward and
    the newest policy version it was generated on."""
    from svc_generator.backends.base import GenerationRequest

    prompts = toy_prompts(args.batch_size, offset=index * args.batch_size)
    directions = [(DIRECTION_NAMES[i % len(DIRECTION_NAMES)],) for i in range(len(prompts))]
    futures = rig.batcher.submit(
        [GenerationRequest(p, d, rig.sampling) for p, d in zip(prompts, directions, strict=True)]
    )
    sent, rewards, versions = [], [], set()
    for prompt, chosen, future in zip(prompts, directions, futures, strict=True):
        result = future.result()
        reward = toy_reward(result.output.text)
        sent += _publish_sample(rig, index, prompt, chosen[0], result, reward)
        rewards.append(reward)
        versions.add(result.policy_version)
    rig.publisher.wait(sent)
    return statistics.fmean(rewards), max(versions)


def _publish_sample(
    rig: _Rig, index: int, prompt: str, direction: str, result: SampleResult, reward: float
) -> list[Any]:
    """Store one sample, publish its rollout and its final Level-1 reward; the two publish futures."""
    prompt_hash = rig.store.put(prompt)
    response_hash = rig.store.put(result.output.text, result.output.token_ids, rig.backend.tokenizer_id)
    request_id = f"bench-{rig.run_id}-{index}-{prompt_hash[:8]}"
    rollout = events_pb2.RolloutGenerated(
        prompt_hash=prompt_hash, response_hash=response_hash, tier=common_pb2.TIER_LEVEL_1,
        policy_version=result.policy_version, model_id=result.model_id, sample_index=0,
        response_tokens=len(result.output.token_ids), request_id=request_id,
        directions=[common_pb2.Direction(name=direction, score=1.0)],
    )  # fmt: skip
    rollout.generated_at.GetCurrentTime()
    sent = [rig.publisher.publish(rig.topics.rollouts, rollout)]
    scored = events_pb2.RewardScored(
        prompt_hash=prompt_hash, response_hash=response_hash, tier=common_pb2.TIER_LEVEL_1,
        policy_version=result.policy_version, rm_version="toy-vowels", reward=reward,
        scorer=common_pb2.SCORER_LIGHT, final=True, sample_index=0,
        response_tokens=len(result.output.token_ids), request_id=request_id,
        directions=rollout.directions,
    )  # fmt: skip
    sent.append(rig.publisher.publish(rig.topics.rewards, scored))
    return sent


def _print_summary(rig: _Rig, outcome: _Outcome) -> None:
    """The reward after, the median update throughput and weight-sync time, the sample counts, the last line."""
    syncs = [seconds for _, seconds in rig.learner.engine.sync.history]
    status = rig.learner.engine.status()
    before, after = outcome.before, outcome.after
    gain = (after - before) / before if before > 0 else after
    print(f"after:  mean toy reward {after:.3f} on the same held-out prompts (policy v{status.policy_version})")
    print(
        f"PPO update: median {statistics.median(outcome.throughput):.0f} tokens/s (batch tokens x epochs / update time)"
    )
    print(f"weight sync (publish -> first rollout on the new version): median {statistics.median(syncs):.2f} s, "
          f"max {max(syncs):.2f} s over {len(syncs)} versions")  # fmt: skip
    print(f"samples: {dict((k, v) for k, v in status.counts.items() if v)}")
    print(f"learner reward_gain={gain:.3f} sync_s={statistics.median(syncs):.2f}")
