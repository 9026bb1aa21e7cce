"""Decision latency and recall (part 7 of ``strata bench scheduler``, and ``--latency-only``): the engine in
process over indexes of ``--latency-sizes`` synthetic clustered prompts, a single prompt's decision timed
beside the stages it cannot avoid (encoder, FAISS search, a Redis round trip), the index's memory and its
recall@10 against exact search (``LatencyRow``), their table and last-line fields, and ``RecordingPublisher``,
which stands in for Kafka here.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata_tools.bench.scheduler.common import CachedEncoder, checked_redis, quiet_logger
from strata_tools.infra.process import rss_bytes
from strata_tools.task.suite import load_suite

if TYPE_CHECKING:
    import redis

    from strata.bus import Topic
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.encoder import Encoder
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.index import PromptIndex


class _Acked:
    def get(self, timeout: float | None = None) -> None:
        return None

    def add_errback(self, *_args: object, **_kwargs: object) -> _Acked:
        return self


class RecordingPublisher:
    """Stands in for ``strata.bus.Publisher`` in the latency part: every event is acknowledged and counted."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def publish(self, topic: Topic[Any], message: object) -> _Acked:
        self.sent[topic.name] = self.sent.get(topic.name, 0) + 1
        return _Acked()

    def close(self) -> None:
        pass


def synthetic(n: int, dim: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    """Clustered unit vectors: a centre plus noise (cosine to the centre ~0.8, like paraphrases)."""
    sigma = np.sqrt(0.5625 / dim)
    x = centres[rng.integers(0, len(centres), n)] + rng.normal(scale=sigma, size=(n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall_at_10(index: PromptIndex, queries: np.ndarray) -> float:
    approx, exact = index.search(queries, 10), index.exact_search(queries, 10)
    return float(np.mean([len({h for h, _ in a} & {h for h, _ in e}) / max(1, len(e))
                          for a, e in zip(approx, exact, strict=True)]))


@dataclass(frozen=True)
class LatencyRow:
    """One index size: a single prompt's decision against the stages it cannot avoid, timed in turns."""

    size: int
    kind: str  # the index stage: exact, hnsw, ivf
    build_s: float
    memory_mb: float  # the index's own bytes
    rss_mb: float  # growth of the process while the index was built
    p50: float  # decision (engine.route of one prompt: encode, search, Redis, rules), ms
    p99: float
    encoder_p99: float  # the encoder alone on the same prompt, ms
    search_p99: float  # FAISS search alone for its vector, ms
    redis_p99: float  # one Redis round trip (PING), ms
    limit_p99: float  # p99 of encoder + search + round trip, per prompt
    recall: float  # recall@10 against exact search
    repeat_p99: float = float("nan")  # the decision of the same prompts once indexed (their stored vectors), ms

    @property
    def over_limit(self) -> float:
        return self.p99 / self.limit_p99


def run_latency(args: argparse.Namespace, settings: SchedulerSettings, encoder: Encoder,
                client: redis.Redis) -> list[LatencyRow]:
    """One row per ``--latency-sizes`` size, each printed as it is measured."""
    rng = np.random.default_rng(args.seed)
    centres = rng.normal(size=(max(100, 2000), encoder.dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    prompts = [r.text for r in random.Random(args.seed).sample(load_suite(), args.latency_queries)]
    rows = []
    for size in [int(s) for s in args.latency_sizes.split(",") if s.strip()]:
        # The engine lives in _latency_at alone: one index in memory at a time.
        rows.append(_latency_at(size, settings, encoder, client, prompts, rng, centres))
    return rows


def _latency_at(size: int, settings: SchedulerSettings, encoder: Encoder, client: redis.Redis,
                prompts: Sequence[str], rng: np.random.Generator, centres: np.ndarray) -> LatencyRow:
    """The latency row of an index of ``size`` synthetic prompts (printed; its Redis keys deleted after)."""
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.store import SchedulerStore

    prefix = f"{settings.redis_prefix}:lat{size}"
    sized = settings.model_copy(update={"redis_prefix": prefix})
    engine = SchedulerEngine(sized, encoder, SchedulerStore(client, sized),
                             ContentStore(client, 3600, sized.content_max_bytes), RecordingPublisher())
    engine.ensure_ready()
    rss_before = rss_bytes(os.getpid()) / 2**20
    built = time.perf_counter()
    for start in range(0, size, 20_000):
        n = min(20_000, size - start)
        vectors = synthetic(n, encoder.dim, rng, centres)
        engine.index.add([f"synthetic-{size}-{start + i}" for i in range(n)], vectors)
    build_s = time.perf_counter() - built
    rss_mb = rss_bytes(os.getpid()) / 2**20 - rss_before
    engine.route(prompts[:5])  # warm-up
    stages = _time_stages(engine, encoder, client, sized.k, prompts)
    repeat_ms = _time_repeats(engine, prompts)
    recall = recall_at_10(engine.index, synthetic(300, encoder.dim, rng, centres)) if engine.index.kind != "exact" \
        else 1.0
    memory = getattr(engine.index, "memory_bytes", lambda: 0)() / 2**20
    p50, p99, enc99, search99, redis99, limit99 = (
        float(np.percentile(values, q)) for values, q in ((stages.decision, 50), (stages.decision, 99),
                                                            (stages.encoder, 99), (stages.search, 99),
                                                            (stages.round_trip, 99), (stages.limit, 99)))
    row = LatencyRow(size, engine.index.kind, build_s, memory, rss_mb, p50, p99, enc99, search99, redis99, limit99,
                     recall, float(np.percentile(repeat_ms, 99)))
    print(f"latency: {size} indexed ({row.kind}, built in {build_s:.1f} s, index {memory:.0f} MB, process "
          f"+{rss_mb:.0f} MB): decision p50 {p50:.1f} ms, p99 {p99:.1f} ms; alone p99: encoder {enc99:.1f} ms, "
          f"search {search99:.2f} ms, Redis round trip {redis99:.2f} ms; recall@10 {recall:.3f}; the same "
          f"prompts once indexed: decision p99 {row.repeat_p99:.1f} ms", flush=True)
    for key in client.scan_iter(f"{prefix}:*", count=1000):
        client.delete(key)
    return row


@dataclass
class _StageTimes:
    """Per prompt, in ms: the whole decision and, timed alone just before it, each stage it cannot avoid."""

    decision: list[float] = field(default_factory=list)
    encoder: list[float] = field(default_factory=list)
    search: list[float] = field(default_factory=list)
    round_trip: list[float] = field(default_factory=list)  # one Redis round trip (PING)
    limit: list[float] = field(default_factory=list)  # encoder + search + round trip


def _time_stages(engine: SchedulerEngine, encoder: Encoder, client: redis.Redis, k: int,
                 prompts: Sequence[str]) -> _StageTimes:
    """Each stage alone, then the whole decision, on the same prompt, prompt by prompt."""
    times = _StageTimes()
    for prompt in prompts:
        t0 = time.perf_counter()
        vector, _ = encoder.encode_counted([prompt])
        t1 = time.perf_counter()
        engine.index.search(vector, k)
        t2 = time.perf_counter()
        client.ping()
        t3 = time.perf_counter()
        engine.route([prompt])
        t4 = time.perf_counter()
        times.encoder.append(1000 * (t1 - t0))
        times.search.append(1000 * (t2 - t1))
        times.round_trip.append(1000 * (t3 - t2))
        times.limit.append(1000 * (t3 - t0))
        times.decision.append(1000 * (t4 - t3))
    return times


def _time_repeats(engine: SchedulerEngine, prompts: Sequence[str]) -> list[float]:
    """The decision times (ms) of ``prompts`` once they are indexed."""
    # RLHF submits its prompts every epoch: decided on their stored vectors, with no encoder.
    routed = engine.route(prompts)
    engine.store.index_prompts([r.prompt_hash for r in routed], np.stack([r.vector for r in routed]))
    engine.index.add([r.prompt_hash for r in routed], np.stack([r.vector for r in routed]))
    repeat_ms = []
    for prompt in prompts:
        started = time.perf_counter()
        engine.route([prompt])
        repeat_ms.append(1000 * (time.perf_counter() - started))
    return repeat_ms


def suite_recall(settings: SchedulerSettings, encoder: CachedEncoder) -> float:
    """HNSW (the default parameters) against exact search over the suite's own embeddings."""
    from svc_scheduler.index import PromptIndex

    texts = [r.text for r in load_suite()]
    vectors = encoder.encode(texts)
    index = PromptIndex(encoder.dim, 0, settings.hnsw_m, settings.hnsw_ef_construction, settings.hnsw_ef_search)
    index.add([content_hash(t) for t in texts], vectors)
    return recall_at_10(index, vectors)


def print_latency(latency: Sequence[LatencyRow]) -> None:
    print(f"{'indexed':>8} {'index':>6} {'build s':>8} {'index MB':>9} {'p50 ms':>7} {'p99 ms':>7} {'enc p99':>8} "
          f"{'search':>7} {'redis':>6} {'limit':>6} {'over':>5} {'recall@10':>10} {'repeat p99':>11}")
    for r in latency:
        print(f"{r.size:>8} {r.kind:>6} {r.build_s:>8.1f} {r.memory_mb:>9.0f} {r.p50:>7.2f} {r.p99:>7.2f} "
              f"{r.encoder_p99:>8.2f} {r.search_p99:>7.2f} {r.redis_p99:>6.2f} {r.limit_p99:>6.2f} "
              f"{r.over_limit:>5.2f} {r.recall:>10.3f} {r.repeat_p99:>11.2f}")


def latency_fields(latency: Sequence[LatencyRow]) -> str:
    """``decision_p99_ms`` and ``decision_over_limit`` at 100k (else the largest size), recall there, 1M."""
    if not latency:
        return ""
    main = next((r for r in latency if r.size == 100_000), max(latency, key=lambda r: r.size))
    fields = (f"decision_p99_ms={main.p99:.2f} decision_over_limit={main.over_limit:.2f} "
              f"recall_at_10={main.recall:.3f} repeat_p99_ms={main.repeat_p99:.2f}")
    million = next((r for r in latency if r.size == 1_000_000), None)
    if million is not None:
        fields += f" p99_ms_1m={million.p99:.2f} recall_at_10_1m={million.recall:.3f}"
    return fields


def run_latency_only(args: argparse.Namespace, settings: SchedulerSettings) -> int:
    """``--latency-only``: the decision against its limits at each size (Redis only, no Kafka)."""
    from svc_scheduler.encoder import Encoder

    client = checked_redis(settings)
    encoder = Encoder.from_settings(settings)
    try:
        with quiet_logger("svc_scheduler.engine"):
            latency = run_latency(args, settings, encoder, client)
    finally:
        client.close()
    print()
    print_latency(latency)
    print(f"scheduler {latency_fields(latency)}")
    return 0
