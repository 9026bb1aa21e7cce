"""``strata bench stages``: where one request's time goes on each hot path, stage by stage (issue 26).

Each stage is timed alone with ``time.perf_counter`` on the same inputs, in turns with the whole call
(so a change of machine load hits both), on real Kafka and Redis (the bench's own, as every bench):

- **probe**, one prompt: tokenize (the rows the method builds), the model forward, scores and rules
  (``probe`` minus those two), gRPC and serialisation (the ``Directions`` call minus ``probe``);
- **scheduler**, one prompt's decision (``engine.route``): the encoder's tokenizer, its forward, FAISS
  search, the Redis round trip of the neighbours' state, the rules (the rest); and, outside the
  decision, storing the text and publishing the event with Kafka's acknowledgement;
- **generator**, one batch of ``--batch`` prompts: the Redis reads (texts, claims), tokenize,
  ``model.generate``, decode, the content-store writes, Kafka publish and acknowledgement;
- **reward**, one batch of ``--batch`` pairs: the Redis reads (done flags, texts), tokenize, the RM
  forward, Kafka publish and acknowledgement.

Prints a table per path: stage, p50 and p99 in ms, share of the summed p50s. Models: the zoo's
(``STRATA_ZOO_PRESET``). docs/performance.md says what was done about them; the tables are in
docs/results.md.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from strata import redis_client, rpc
from strata.bus import Publisher, topics
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.errors import CliError
from strata.hashing import content_hash
from strata.rpc import ServiceBinding, start_server
from strata.v1 import common_pb2, events_pb2, probe_pb2, probe_pb2_grpc
from strata_tools.bench.infra import bench_infra
from strata_tools.bench.scheduler.latency import RecordingPublisher
from strata_tools.task.suite import load_suite


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=60, help="timed requests (or batches) per path")
    parser.add_argument("--batch", type=int, default=16, help="prompts per generator and reward batch")
    parser.add_argument("--paths", default="probe,scheduler,generator,reward", help="which paths to profile")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="generator batch: tokens per response")


class Stages:
    """Milliseconds per stage over the rounds."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)

    @contextmanager
    def time(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self.ms[stage].append(1000 * (time.perf_counter() - started))

    def add(self, stage: str, ms: float) -> None:
        self.ms[stage].append(ms)

    def print(self, title: str) -> None:
        p50s = {stage: float(np.percentile(v, 50)) for stage, v in self.ms.items()}
        total = sum(p50 for stage, p50 in p50s.items() if not stage.startswith("("))
        print(f"\n{title}")
        print(f"  {'stage':<44} {'p50 ms':>8} {'p99 ms':>8} {'share':>6}")
        for stage, values in self.ms.items():
            share = "" if stage.startswith("(") else f"{p50s[stage] / total:6.1%}"
            print(f"  {stage:<44} {p50s[stage]:>8.2f} {float(np.percentile(values, 99)):>8.2f} {share:>6}")


def run(args: argparse.Namespace) -> int:
    from strata_tools.zoo.build import ensure_zoo, zoo_paths

    settings = StrataSettings()
    if not (settings.kafka_managed and settings.redis_managed):
        raise CliError("bench stages publishes made-up events: it runs on its own Kafka and Redis only; unset "
                       "STRATA_KAFKA_BOOTSTRAP and STRATA_REDIS_URL")
    ensure_zoo(settings)
    zoo = zoo_paths(settings)
    print(f"stages: zoo {zoo.config.preset} {zoo.config.config_hash()}, {args.rounds} rounds, batch {args.batch}")
    run_id = uuid.uuid4().hex[:8]
    paths = {p.strip() for p in args.paths.split(",") if p.strip()}
    with bench_infra(settings, run_id, "stages") as settings:
        if "probe" in paths:
            profile_probe(args, settings).print("probe: one prompt through Directions (gRPC)")
        if "scheduler" in paths:
            profile_scheduler(args, settings).print("scheduler: one prompt's decision, then its acceptance")
        if "generator" in paths:
            profile_generator(args, settings, str(zoo.level1)).print(
                f"generator: one batch of {args.batch} prompts (Level-1)")
        if "reward" in paths:
            profile_reward(args, settings, str(zoo.rm_light)).print(
                f"reward: one batch of {args.batch} pairs (light RM)")
    return 0


def _prompts(n: int) -> list[str]:
    everything = load_suite("eval")
    return [r.text for r in everything[:: max(1, len(everything) // n)][:n]]


def profile_probe(args: argparse.Namespace, settings: Any) -> Stages:
    from svc_probe.__main__ import make_probe_fn, set_torch_threads
    from svc_probe.config import ProbeSettings
    from svc_probe.core import (
        ProbeRules,
        _likelihood_contexts,
        _likelihood_scores,
        _likelihood_scores_two_forwards,
        forward_alone,
        probe,
    )
    from svc_probe.servicer import ProbeServicer

    probe_settings = ProbeSettings(**settings.model_dump(exclude={"grpc_port"}), device="cpu")
    set_torch_threads(probe_settings)
    probe_fn, lm = make_probe_fn(probe_settings)
    rules = ProbeRules.of(probe_settings)
    server = start_server([ServiceBinding(probe_pb2_grpc.add_ProbeServicer_to_server,
                                          ProbeServicer(probe_fn, probe_settings.max_prompt_chars, 3),
                                          probe_pb2.DESCRIPTOR.services_by_name["Probe"].full_name)],
                          port=0, host="127.0.0.1")
    stages = Stages()
    prompts = _prompts(args.rounds)
    limit = probe_settings.max_prompt_tokens
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as channel:
            stub = probe_pb2_grpc.ProbeStub(channel)
            for prompt in prompts[:5]:
                stub.Directions(probe_pb2.DirectionsRequest(prompt=prompt), timeout=30)
            for prompt in prompts:
                with stages.time("tokenize (probe query)"):
                    _likelihood_contexts(lm, [prompt], limit)
                forward = forward_alone(lm, [prompt], limit)
                with stages.time("model forward"):
                    forward()
                started = time.perf_counter()
                probe(lm, [prompt], rules, limit)
                whole = 1000 * (time.perf_counter() - started)
                started = time.perf_counter()
                stub.Directions(probe_pb2.DirectionsRequest(prompt=prompt), timeout=30)
                call = 1000 * (time.perf_counter() - started)
                tokenize, model = stages.ms["tokenize (probe query)"][-1], stages.ms["model forward"][-1]
                stages.add("scores, rules (probe() minus the above)", max(0.0, whole - tokenize - model))
                stages.add("gRPC, serialisation, lock (call minus probe())", max(0.0, call - whole))
                stages.add("(whole Directions call)", call)
                started = time.perf_counter()
                _likelihood_scores(lm, [prompt], limit, share_prefix=False)
                stages.add("(before: six full rows, one transformers forward)", 1000 * (time.perf_counter() - started))
                started = time.perf_counter()
                _likelihood_scores_two_forwards(lm, [prompt], limit)
                stages.add("(before that: the two-forward likelihood)", 1000 * (time.perf_counter() - started))
    finally:
        server.stop(0)
    return stages


def profile_scheduler(args: argparse.Namespace, settings: Any) -> Stages:
    import torch

    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.encoder import Encoder
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.store import SchedulerStore, connect

    sched = SchedulerSettings(**settings.model_dump(exclude={"grpc_port"}),
                              redis_prefix=f"strata:bench:stages:{uuid.uuid4().hex[:6]}")
    client = connect(sched)
    encoder = Encoder.from_settings(sched)
    content = ContentStore(client, 3600, sched.content_max_bytes)
    engine = SchedulerEngine(sched, encoder, SchedulerStore(client, sched), content, RecordingPublisher())
    engine.ensure_ready()
    prompts = _prompts(args.rounds)
    vectors = encoder.encode(_prompts(400))
    engine.index.add([f"history-{i}" for i in range(len(vectors))], vectors)  # neighbours to find
    publisher = Publisher(settings, client_id="bench-stages")
    stages = Stages()
    model = encoder._model  # the stages of encode_counted, one by one
    try:
        engine.route(prompts[:5])
        for prompt in prompts:
            with stages.time("encoder: tokenize"):
                features = model.preprocess([prompt])
            with stages.time("encoder: forward"), torch.inference_mode():
                model(features)
            vector, _ = encoder.encode_counted([prompt])
            with stages.time("FAISS search (k nearest)"):
                found = engine.index.search(vector, sched.k)
            with stages.time("Redis: neighbours' state (one round trip)"):
                engine.store.neighbour_state(sorted({h for row in found for h, _ in row}))
            started = time.perf_counter()
            engine.route([prompt])
            whole = 1000 * (time.perf_counter() - started)
            parts = sum(stages.ms[s][-1] for s in ("encoder: tokenize", "encoder: forward", "FAISS search (k nearest)",
                                                   "Redis: neighbours' state (one round trip)"))
            stages.add("rules, hashing, ledger (route minus the above)", max(0.0, whole - parts))
            stages.add("(whole decision: engine.route)", whole)
            started = time.perf_counter()
            model.encode([prompt], normalize_embeddings=True, show_progress_bar=False)
            stages.add("(before: SentenceTransformer.encode + count)", 1000 * (time.perf_counter() - started)
                       + _timed(lambda p=prompt: encoder.count_tokens([p])))
            with stages.time("(accept: content store put)"):
                content.put(prompt)
            event = events_pb2.PromptRouted(prompt_hash=content_hash(prompt), tier=common_pb2.TIER_LEVEL_0)
            with stages.time("(accept: Kafka publish + acknowledgement)"):
                publisher.publish(topics.PROMPTS_LEVEL0, event).get(timeout=30)
    finally:
        publisher.close()
        for key in client.scan_iter(f"{sched.redis_prefix}:*", count=1000):
            client.delete(key)
    return stages


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return 1000 * (time.perf_counter() - started)


def profile_generator(args: argparse.Namespace, settings: Any, model_dir: str) -> Stages:
    import torch

    from svc_generator.backends.hf import HfBackend

    backend = HfBackend(model_dir, device="cpu")
    lm, fmt = backend.lm, backend.prompt_format
    client = redis_client.connect(settings.redis_address)
    content = ContentStore(client, 3600, settings.content_max_bytes)
    publisher = Publisher(settings, client_id="bench-stages")
    stages = Stages()
    prompts = _prompts(args.batch * 4)
    digests = [content.put(p) for p in prompts]
    try:
        for round_index in range(max(2, args.rounds // 6)):
            start = (round_index * args.batch) % len(prompts)
            batch, keys = prompts[start: start + args.batch], digests[start: start + args.batch]
            with stages.time("Redis: texts and claims (two round trips)"):
                content.find_texts(keys)
                client.mget([f"strata:bench:claim:{k}" for k in keys])
            with stages.time("tokenize"):
                encoded = fmt.encode([fmt.generator_text(p) for p in batch], return_tensors="pt", padding=True)
            with stages.time(f"model.generate ({args.max_new_tokens} new tokens)"), torch.no_grad():
                output = lm.model.generate(**encoded, max_new_tokens=args.max_new_tokens, do_sample=True,
                                           temperature=0.8, top_p=0.9, top_k=0,
                                           pad_token_id=lm.tokenizer.pad_token_id, eos_token_id=list(backend.stop_ids))
            rows = output[:, encoded["input_ids"].shape[1]:].tolist()
            with stages.time("decode"):
                texts = [lm.tokenizer.decode(row, skip_special_tokens=True) for row in rows]
            with stages.time("content store: put each response"):
                hashes = [content.put(t, r, backend.tokenizer_id) for t, r in zip(texts, rows, strict=True)]
            with stages.time("Kafka: publish the batch + acknowledgements"):
                events = [events_pb2.RolloutGenerated(prompt_hash=k, response_hash=h) for k, h in
                          zip(keys, hashes, strict=True)]
                publisher.wait([publisher.publish(topics.ROLLOUTS_GENERATED, e) for e in events])
    finally:
        publisher.close()
    return stages


def profile_reward(args: argparse.Namespace, settings: Any, rm_dir: str) -> Stages:
    import torch

    from strata.models.loading import load_reward_model
    from strata.models.prompts import PromptFormat

    rm = load_reward_model(rm_dir, device="cpu")
    fmt = PromptFormat.of(rm.tokenizer)
    client = redis_client.connect(settings.redis_address)
    content = ContentStore(client, 3600, settings.content_max_bytes)
    publisher = Publisher(settings, client_id="bench-stages")
    stages = Stages()
    prompts = _prompts(args.batch * 4)
    responses = [f"Here is a short answer about {p[:40]}, with a few steps to follow." for p in prompts]
    prompt_keys = [content.put(p) for p in prompts]
    response_keys = [content.put(r) for r in responses]
    try:
        for round_index in range(args.rounds):
            start = (round_index * args.batch) % len(prompts)
            keys = prompt_keys[start: start + args.batch] + response_keys[start: start + args.batch]
            with stages.time("Redis: done flags, escalations, texts (2 trips)"):
                with client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.exists(f"strata:bench:done:{key}")
                    pipe.execute()
                texts = content.get_texts(keys)
            half = len(keys) // 2
            with stages.time("tokenize"):
                batch = fmt.encode([fmt.rm_text(p, r) for p, r in zip(texts[:half], texts[half:], strict=True)],
                                   return_tensors="pt", padding=True, truncation=True, max_length=256)
            with stages.time("RM forward"), torch.no_grad():
                rm.model(**batch)
            with stages.time("Kafka: publish the batch + acknowledgements"):
                events = [events_pb2.RewardScored(prompt_hash=k, response_hash=k, reward=1.0) for k in keys[:half]]
                publisher.wait([publisher.publish(topics.REWARDS_SCORED, e) for e in events])
    finally:
        publisher.close()
    return stages
