"""``strata bench scheduler``: what embedding-based skipping (R10-R12) saves, and what it costs.

What runs (all in one process, on the real scheduler code and a real Redis; Kafka is not needed):

1. **Routing on the zoo's prompt suite.** Every suite prompt (all splits, 8 topics x subjects x
   intents, 7 paraphrases per family) is submitted ``--passes`` times in shuffled order, in batches,
   through ``SchedulerEngine.submit`` (encoder, FAISS, Redis statistics, the routing rules; the
   Kafka publisher is replaced by a recorder). Each prompt the scheduler rolls out gets
   ``--n-samples`` rollouts whose rewards are the **oracle judge's** scores of simulated policy
   responses, folded into Redis by the statistics worker's own handler (``StatsUpdater.apply``).
   The simulated policy: per paraphrase family a competence (mostly good, mostly bad with one
   consistent failure mode, or mixed) and responses written by the zoo's corpus
   (``reference_response`` / ``degrade``). The policy and RM versions are fixed during the run.
2. **Baselines in the same run, on the same stream:** *no skipping* (everything rolled out) and the
   *GRESO-style* rule: skip a prompt only from its **own** reward history (at least
   ``min_samples_per_neighbour`` rewards with variance under ``low_variance_threshold``). Risk
   prompts go to Level-2 under every rule, so the comparison isolates the reuse rule.
3. **Reuse error:** for every skipped prompt, |reused reward - oracle truth|, the truth being the
   mean oracle reward of ``--truth-samples`` fresh rollouts of that prompt.
4. **Decision latency** (encode + search + Redis + rules for one prompt) with 10k and 100k prompts
   indexed (synthetic clustered unit vectors; queries are real suite prompts), and **ANN recall@10**
   of the HNSW index against exact search (synthetic queries at 100k, and the suite itself).

The rollouts are simulated because the generators and reward services are separate issues; the
scheduler's own path (encode, index, Redis, rules, statistics worker) is the production code.
Last line: ``scheduler trigger_reduction=<fraction> reuse_mae=<x>``.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--passes", type=int, default=2, help="times each suite prompt is submitted")
    parser.add_argument("--n-samples", type=int, default=4, help="rollouts per rolled-out prompt")
    parser.add_argument("--truth-samples", type=int, default=8, help="rollouts averaged for the oracle truth")
    parser.add_argument("--batch", type=int, default=32, help="prompts per SubmitBatch-sized step")
    parser.add_argument("--limit", type=int, default=0, help="use only this many suite prompts (0: all)")
    parser.add_argument("--latency-sizes", default="10000,100000", help="index sizes for the latency test")
    parser.add_argument("--latency-queries", type=int, default=200, help="single-prompt decisions timed per size")
    parser.add_argument("--seed", type=int, default=0)


# -- the simulated policy, scored by the oracle ------------------------------------------------------


@dataclass(frozen=True)
class Competence:
    p_good: float  # chance a rollout is a decent answer
    failure: str  # the family's typical way of failing (a corpus degradation)


def family_competence(families: Sequence[str], risk: dict[str, bool], seed: int) -> dict[str, Competence]:
    from strata.zoo.corpus import DEGRADATIONS

    rng = random.Random(seed)
    kinds = [k for k in DEGRADATIONS if k not in ("unsafe", "no_caution")]
    table = {}
    for family in sorted(families):
        roll = rng.random()
        p_good = 0.95 if roll < 0.45 else 0.05 if roll < 0.7 else rng.uniform(0.3, 0.7)
        failure = rng.choice(kinds + (["no_caution"] if risk[family] else []))
        table[family] = Competence(p_good, failure)
    return table


def rollout_reward(record, competence: Competence, rng: random.Random) -> float:
    from strata.zoo.corpus import degrade, reference_response
    from strata.zoo.oracle import oracle_score

    response = reference_response(record, rng)
    if rng.random() >= competence.p_good:
        response = degrade(record, response, competence.failure, rng)
    return oracle_score(record, response)


# -- plumbing: a recorder in place of Kafka, an encoder cache ---------------------------------------


class _Acked:
    def get(self, timeout: float | None = None) -> None:
        return None

    def add_errback(self, *_args: object, **_kwargs: object) -> _Acked:
        return self


class RecordingPublisher:
    """Stands in for ``strata.bus.Publisher``: every event is acknowledged at once and counted."""

    def __init__(self) -> None:
        self.sent: dict[str, int] = {}

    def publish(self, topic, message) -> _Acked:
        self.sent[topic.name] = self.sent.get(topic.name, 0) + 1
        return _Acked()

    def close(self) -> None:
        pass


class CachedEncoder:
    """The real encoder, remembering vectors of texts it has seen (later passes cost no encoding)."""

    def __init__(self, encoder) -> None:
        self._encoder = encoder
        self.dim = encoder.dim
        self.encoder_id = encoder.encoder_id
        self._cache: dict[str, np.ndarray] = {}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for text, vector in zip(missing, self._encoder.encode(missing), strict=True):
                self._cache[text] = vector
        return np.stack([self._cache[t] for t in texts]) if texts else self._encoder.encode([])


# -- part 1-3: trigger rate and reuse error -----------------------------------------------------------


@dataclass
class RuleResult:
    name: str
    submitted: int = 0
    rollouts: int = 0  # submissions that triggered a rollout (Level-1 or Level-2)
    level2: int = 0
    reuse_errors: list[float] | None = None

    @property
    def trigger_rate(self) -> float:
        return self.rollouts / self.submitted if self.submitted else 0.0

    @property
    def mae(self) -> float:
        return float(np.mean(self.reuse_errors)) if self.reuse_errors else float("nan")


def _reward_event(prompt_hash: str, value: float, i: int, seq: int) -> events_pb2.RewardScored:
    message = events_pb2.RewardScored(
        prompt_hash=prompt_hash, response_hash=content_hash(f"bench response {seq}/{i} {prompt_hash}"),
        tier=common_pb2.TIER_LEVEL_1, policy_version=1, rm_version="oracle", reward=value,
        scorer=common_pb2.SCORER_HUMAN, final=True, sample_index=i,
    )
    message.scored_at.GetCurrentTime()
    return message


def run_routing(args: argparse.Namespace, settings, encoder, client) -> tuple[RuleResult, RuleResult, RuleResult]:
    from strata.zoo.suite import load_suite
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.routing import Route, detect_risk
    from svc_scheduler.stats import RewardObservation, apply_reward
    from svc_scheduler.store import SchedulerStore
    from svc_scheduler.validation import PromptRequest, Sampling
    from svc_scheduler.workers import StatsUpdater

    records = load_suite()
    if args.limit:
        records = random.Random(args.seed).sample(records, args.limit)
    competence = family_competence({r.family for r in records}, {r.family: r.risk for r in records}, args.seed)
    truth_rng = random.Random(args.seed + 1)
    truth = {
        r.text: float(np.mean([rollout_reward(r, competence[r.family], truth_rng) for _ in range(args.truth_samples)]))
        for r in records
    }
    store = SchedulerStore(client, settings)
    content = ContentStore(client, 3600, settings.content_max_bytes)
    engine = SchedulerEngine(settings, CachedEncoder(encoder), store, content, RecordingPublisher())
    updater = StatsUpdater(store, settings)

    stream = []
    order_rng = random.Random(args.seed + 2)
    for _ in range(args.passes):
        batch = list(records)
        order_rng.shuffle(batch)
        stream.extend(batch)
    rollout_rng = random.Random(args.seed + 3)
    knn = RuleResult("knn (Strata)", reuse_errors=[])
    greso = RuleResult("GRESO same-prompt", reuse_errors=[])
    everything = RuleResult("no skipping")
    own: dict[str, object] = {}  # GRESO: each prompt's own statistics
    seq = 0
    started = time.perf_counter()
    for start in range(0, len(stream), args.batch):
        chunk = stream[start : start + args.batch]
        accepted = engine.submit([PromptRequest(r.text, Sampling(), args.n_samples, "") for r in chunk])
        for record, result in zip(chunk, accepted, strict=True):
            seq += 1
            decision = result.decision
            rewards = [rollout_reward(record, competence[record.family], rollout_rng) for _ in range(args.n_samples)]
            # Strata: skip reuses, a rollout feeds the statistics worker's handler (Redis, idempotent).
            knn.submitted += 1
            if decision.route is Route.SKIP:
                knn.reuse_errors.append(abs(decision.reused_reward - truth[record.text]))
            else:
                knn.rollouts += 1
                knn.level2 += decision.route is Route.LEVEL_2
                for i, value in enumerate(rewards):
                    updater.apply(_reward_event(result.prompt_hash, value, i, seq))
            # No skipping: every submission is rolled out.
            everything.submitted += 1
            everything.rollouts += 1
            # GRESO-style: the prompt's own history only; the same risk rule.
            greso.submitted += 1
            mine = own.get(record.text)
            risky = detect_risk(record.text, {}, settings) is not None
            if (not risky and mine is not None and mine.count >= settings.min_samples_per_neighbour
                    and mine.variance < settings.low_variance_threshold):
                greso.reuse_errors.append(abs(mine.mean - truth[record.text]))
            else:
                greso.rollouts += 1
                greso.level2 += risky
                now = time.time()
                for value in rewards:
                    mine = apply_reward(mine, RewardObservation(value, 1, "oracle", now), settings.stats_ttl_s,
                                        settings.max_policy_lag)
                own[record.text] = mine
    elapsed = time.perf_counter() - started
    risk_recall = np.mean([detect_risk(r.text, {}, settings) is not None for r in records if r.risk])
    risk_false = np.mean([detect_risk(r.text, {}, settings) is not None for r in records if not r.risk])
    print(f"routing: {len(stream)} submissions ({len(records)} prompts x {args.passes} passes) in {elapsed:.1f} s; "
          f"index {len(engine.index)} prompts; risk keywords: recall {risk_recall:.3f}, false positives "
          f"{risk_false:.3f}; marks {store.summary().counters.get('high_uncertainty_marks', 0)}")
    return everything, greso, knn


# -- part 4: latency and recall -----------------------------------------------------------------------


def synthetic(n: int, dim: int, rng: np.random.Generator, centres: np.ndarray) -> np.ndarray:
    """Clustered unit vectors: a centre plus noise (cosine to the centre ~0.8, like paraphrases)."""
    sigma = np.sqrt(0.5625 / dim)
    x = centres[rng.integers(0, len(centres), n)] + rng.normal(scale=sigma, size=(n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def recall_at_10(index, queries: np.ndarray) -> float:
    approx, exact = index.search(queries, 10), index.exact_search(queries, 10)
    return float(np.mean([len({h for h, _ in a} & {h for h, _ in e}) / max(1, len(e))
                          for a, e in zip(approx, exact, strict=True)]))


def run_latency(args: argparse.Namespace, settings, encoder, client) -> list[tuple[int, str, float, float, float]]:
    from strata.zoo.suite import load_suite
    from svc_scheduler.engine import SchedulerEngine
    from svc_scheduler.store import SchedulerStore

    rng = np.random.default_rng(args.seed)
    centres = rng.normal(size=(max(100, 2000), encoder.dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    prompts = [r.text for r in random.Random(args.seed).sample(load_suite(), args.latency_queries)]
    rows = []
    for size in [int(s) for s in args.latency_sizes.split(",") if s.strip()]:
        prefix = f"{settings.redis_prefix}:lat{size}"
        sized = settings.model_copy(update={"redis_prefix": prefix})
        engine = SchedulerEngine(sized, encoder, SchedulerStore(client, sized),
                                 ContentStore(client, 3600, sized.content_max_bytes), RecordingPublisher())
        engine.ensure_ready()
        built = time.perf_counter()
        for start in range(0, size, 20_000):
            n = min(20_000, size - start)
            vectors = synthetic(n, encoder.dim, rng, centres)
            engine.index.add([f"synthetic-{size}-{start + i}" for i in range(n)], vectors)
        build_s = time.perf_counter() - built
        engine.route(prompts[:5])  # warm-up
        times = []
        for prompt in prompts:
            t0 = time.perf_counter()
            engine.route([prompt])
            times.append(time.perf_counter() - t0)
        recall = recall_at_10(engine.index, synthetic(300, encoder.dim, rng, centres)) if engine.index.kind == "hnsw" \
            else 1.0
        p50, p99 = np.percentile(times, [50, 99]) * 1000
        rows.append((size, engine.index.kind, float(p50), float(p99), recall))
        print(f"latency: {size} indexed ({engine.index.kind}, built in {build_s:.1f} s): "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms; recall@10 {recall:.3f}", flush=True)
    return rows


def suite_recall(settings, encoder) -> float:
    """HNSW (the default parameters) against exact search over the suite's own embeddings."""
    from strata.zoo.suite import load_suite
    from svc_scheduler.index import PromptIndex

    texts = [r.text for r in load_suite()]
    vectors = encoder.encode(texts)
    index = PromptIndex(encoder.dim, 0, settings.hnsw_m, settings.hnsw_ef_construction, settings.hnsw_ef_search)
    index.add([content_hash(t) for t in texts], vectors)
    return recall_at_10(index, vectors)


# -- entry point ----------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from strata.cli.main import CliError
    from strata.infra import InfraError, redis_server
    from svc_scheduler.encoder import Encoder
    from svc_scheduler.settings import SchedulerSettings
    from svc_scheduler.store import connect

    settings = SchedulerSettings(redis_prefix=f"strata:bench:{uuid.uuid4().hex[:8]}")
    if settings.redis_managed:
        try:
            redis_server.start(settings)
        except InfraError as exc:
            raise CliError(f"could not start the local Redis: {exc}") from exc
    client = connect(settings.model_copy(update={"redis_timeout_s": 30.0}))
    try:
        client.ping()
    except Exception as exc:
        raise CliError(f"Redis at {settings.redis_address} does not answer: {exc}") from exc
    print(f"scheduler bench: Redis {settings.redis_address} (keys under {settings.redis_prefix}:*), "
          f"k={settings.k}, skip if >= {settings.min_low_variance_neighbours} neighbours with variance < "
          f"{settings.low_variance_threshold}, cosine floor {settings.min_similarity}", flush=True)
    encoder = Encoder(
        settings.encoder_path, settings.encoder_device, settings.encoder_batch_size, settings.encoder_threads
    )
    cached = CachedEncoder(encoder)
    try:
        everything, greso, knn = run_routing(args, settings, cached, client)
        latency = run_latency(args, settings, encoder, client)
        recall_suite = suite_recall(settings, cached)
    finally:
        for key in client.scan_iter(f"{settings.redis_prefix}:*", count=1000):
            client.delete(key)
        client.close()

    print()
    print(f"{'rule':<20} {'submitted':>9} {'rollouts':>9} {'trigger':>8} {'level-2':>8} {'skipped':>8} "
          f"{'reuse MAE':>10}")
    for rule in (everything, greso, knn):
        skipped = rule.submitted - rule.rollouts
        print(f"{rule.name:<20} {rule.submitted:>9} {rule.rollouts:>9} {rule.trigger_rate:>8.3f} "
              f"{rule.level2:>8} {skipped:>8} {rule.mae:>10.3f}")
    print()
    print(f"{'indexed':>8} {'index':>6} {'p50 ms':>8} {'p99 ms':>8} {'recall@10':>10}")
    for size, kind, p50, p99, recall in latency:
        print(f"{size:>8} {kind:>6} {p50:>8.2f} {p99:>8.2f} {recall:>10.3f}")
    print(f"HNSW recall@10 on the suite's own embeddings: {recall_suite:.3f}")
    greso_reduction = 1 - greso.trigger_rate / everything.trigger_rate
    reduction = 1 - knn.trigger_rate / everything.trigger_rate
    print(f"GRESO-style trigger_reduction={greso_reduction:.3f} reuse_mae={greso.mae:.3f}")
    print(f"scheduler trigger_reduction={reduction:.3f} reuse_mae={knn.mae:.3f}")
    return 0


def main() -> int:  # python -m strata.bench.scheduler (until `strata bench scheduler` is registered)
    parser = argparse.ArgumentParser(prog="strata bench scheduler", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
