"""``python -m strata_tools.bench.index_scale``: FAISS index candidates for the scheduler at 10k-1M prompts.

Builds each candidate over ``--size`` clustered unit vectors (strata_tools.bench.scheduler.latency's synthetic
distribution: ``--centres`` centres plus noise, cosine to the centre ``--centre-cosine``; 384-d like
MiniLM) and reports, per candidate: build time (training included), the index's serialized size and
the process's resident-memory growth, single-query search latency p50/p99 with FAISS on 1 and 2
OpenMP threads, and recall@10 against float32 brute force on ``--queries`` fresh queries from the
same distribution. ``prompt-index`` is the scheduler's own ``PromptIndex`` with the settings' stage
limits, grown in 20k batches as the engine does at start (exact, HNSW, then the IVF rebuild).

    python -m strata_tools.bench.index_scale --size 1000000
    python -m strata_tools.bench.index_scale --size 1000000 --centres 200 --centre-cosine 0.7  # harder for IVF

The RSS growth is clean only for the first kind of a run (the allocator reuses what an earlier index
freed): for memory, run one kind per process, or read the serialized size.

The synthetic clusters are easy for IVF (each cluster falls in one or two lists); the harder setting
spreads a cluster over many lists, and is the one that sets ``ivf_nprobe``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import faiss
import numpy as np

from strata_tools.infra.process import rss_bytes

if TYPE_CHECKING:
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.index import PromptIndex

ALL = "ivf-fp16,ivf-flat,ivf-sq8,ivf-pq,ivf-pq-refine,hnsw,prompt-index"
CHUNK = 20_000  # rows per add, as strata_tools.bench.scheduler.latency grows the engine's index


def synthetic(n: int, rng: np.random.Generator, centres: np.ndarray, cosine: float) -> np.ndarray:
    """(n, D) unit vectors: a random centre plus Gaussian noise, cosine to the centre ~``cosine``."""
    dim = centres.shape[1]
    sigma = np.sqrt((1 / cosine**2 - 1) / dim)  # |noise|^2 = 1/cos^2 - 1 against a unit centre
    x = centres[rng.integers(0, len(centres), n)] + rng.normal(scale=sigma, size=(n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def latency_ms(search: Callable[[np.ndarray], object], queries: np.ndarray, threads: int) -> tuple[float, float]:
    """p50 and p99 of one-query searches with FAISS on ``threads`` OpenMP threads."""
    faiss.omp_set_num_threads(threads)
    for q in queries[:20]:  # warm-up
        search(q[None])
    times = []
    for q in queries:
        started = time.perf_counter()
        search(q[None])
        times.append(time.perf_counter() - started)
    p50, p99 = np.percentile(times, [50, 99]) * 1000
    return float(p50), float(p99)


def faiss_candidate(name: str, args: argparse.Namespace, data: np.ndarray) -> tuple[faiss.Index, str]:
    """Build one raw FAISS candidate over ``data``; returns it and its parameters in words."""
    nlist, dim = args.nlist, data.shape[1]
    factory = {
        "ivf-fp16": f"IVF{nlist},SQfp16", "ivf-flat": f"IVF{nlist},Flat", "ivf-sq8": f"IVF{nlist},SQ8",
        "ivf-pq": f"IVF{nlist},PQ{args.pq_m}", "ivf-pq-refine": f"IVF{nlist},PQ{args.pq_m},RFlat",
        "hnsw": f"HNSW{args.hnsw_m},Flat",
    }[name]
    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    if name == "hnsw":
        index.hnsw.efConstruction, index.hnsw.efSearch = args.hnsw_ef_construction, args.hnsw_ef_search
        params = f"M {args.hnsw_m}, efC {args.hnsw_ef_construction}, efS {args.hnsw_ef_search}"
    else:
        rows = np.random.default_rng(0).choice(len(data), min(args.train_size, len(data)), replace=False)
        index.train(data[np.sort(rows)])
        faiss.extract_index_ivf(index).nprobe = args.nprobe
        params = f"{factory}, nprobe {args.nprobe}, train {len(rows)}"
        if name == "ivf-pq-refine":
            index.k_factor = args.k_factor
            params += f", k_factor {args.k_factor}"
    for start in range(0, len(data), CHUNK):
        index.add(data[start:start + CHUNK])
    return index, params


# One search over a candidate: queries (Q, D) -> the row ids of each query's 10 nearest.
_Search = Callable[[np.ndarray], list[list[int]]]


@dataclass
class _Dataset:
    """The indexed vectors, the recall and latency queries, and the recall queries' true top 10."""

    data: np.ndarray       # (N, D) unit vectors
    queries: np.ndarray    # (Q, D), for recall@10
    timed: np.ndarray      # (L, D), for latency
    truth: np.ndarray      # (Q, 10) row ids, float32 brute force


@dataclass
class _Built:
    """One candidate built over the data: its search, parameters in words, build time and size."""

    search: _Search
    params: str
    build_s: float
    nbytes: int


@dataclass
class _Row:
    """One candidate's figures, as the final table prints them."""

    kind: str
    params: str
    build_s: float
    mb: float                      # serialized size
    grown: float                   # resident-memory growth, MB
    one: tuple[float, float]       # p50, p99 ms on 1 thread
    two: tuple[float, float]       # p50, p99 ms on 2 threads
    recall: float


def main() -> int:
    from svc_scheduler.config import SchedulerSettings

    defaults = SchedulerSettings()
    parser = _parser(defaults)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # PromptIndex's rebuilds
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if unknown := set(kinds) - set(ALL.split(",")):
        parser.error(f"unknown --kinds {sorted(unknown)}")

    dataset = _make_dataset(args)
    print(f"index_scale: {args.size} x {args.dim}-d vectors, {args.centres} centres at cosine "
          f"{args.centre_cosine}; recall@10 on {args.queries} queries, latency on {args.latency_queries}", flush=True)
    rows = [_measure(kind, args, defaults, dataset) for kind in kinds]

    print()
    print("| index | parameters | build s | index MB | RSS +MB | 1 thread p50/p99 ms | 2 threads p50/p99 ms "
          "| recall@10 |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.kind} | {r.params} | {r.build_s:.1f} | {r.mb:.0f} | {r.grown:.0f} | {r.one[0]:.2f} / "
              f"{r.one[1]:.2f} | {r.two[0]:.2f} / {r.two[1]:.2f} | {r.recall:.3f} |")
    return 0


def _parser(defaults: SchedulerSettings) -> argparse.ArgumentParser:
    """The command line, its index defaults the scheduler's settings."""
    parser = argparse.ArgumentParser(prog="python -m strata_tools.bench.index_scale",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="vectors indexed")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--centres", type=int, default=2000)
    parser.add_argument("--centre-cosine", type=float, default=0.8)
    parser.add_argument("--queries", type=int, default=300, help="queries for recall@10")
    parser.add_argument("--latency-queries", type=int, default=1000)
    parser.add_argument("--kinds", default=ALL, help=f"comma-separated, of {ALL}")
    parser.add_argument("--nlist", type=int, default=defaults.ivf_nlist)
    parser.add_argument("--nprobe", type=int, default=defaults.ivf_nprobe)
    parser.add_argument("--train-size", type=int, default=defaults.ivf_train_size)
    parser.add_argument("--pq-m", type=int, default=48, help="PQ sub-quantizers (8 bits each)")
    parser.add_argument("--k-factor", type=float, default=10.0, help="re-ranked candidates per result (RFlat)")
    parser.add_argument("--hnsw-m", type=int, default=defaults.hnsw_m)
    parser.add_argument("--hnsw-ef-construction", type=int, default=defaults.hnsw_ef_construction)
    parser.add_argument("--hnsw-ef-search", type=int, default=defaults.hnsw_ef_search)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _make_dataset(args: argparse.Namespace) -> _Dataset:
    """The clustered vectors and queries of ``--seed``, with the queries' exact top 10."""
    rng = np.random.default_rng(args.seed)
    centres = rng.normal(size=(args.centres, args.dim)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    data = np.concatenate([synthetic(min(CHUNK, args.size - s), rng, centres, args.centre_cosine)
                           for s in range(0, args.size, CHUNK)])
    queries = synthetic(args.queries, rng, centres, args.centre_cosine)
    timed = synthetic(args.latency_queries, rng, centres, args.centre_cosine)
    faiss.omp_set_num_threads(2)
    flat = faiss.IndexFlatIP(args.dim)
    flat.add(data)
    _, truth = flat.search(queries, 10)
    return _Dataset(data, queries, timed, truth)


def _measure(kind: str, args: argparse.Namespace, defaults: SchedulerSettings, dataset: _Dataset) -> _Row:
    """One candidate built, its memory, recall@10 and latency measured; its line printed."""
    faiss.omp_set_num_threads(2)
    before = rss_bytes(os.getpid()) / 2**20
    built = _build(kind, args, defaults, dataset.data)
    grown = rss_bytes(os.getpid()) / 2**20 - before
    faiss.omp_set_num_threads(2)
    found = built.search(dataset.queries)
    recall = float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, dataset.truth.tolist(), strict=True)]))
    one, two = latency_ms(built.search, dataset.timed, 1), latency_ms(built.search, dataset.timed, 2)
    row = _Row(kind, built.params, built.build_s, built.nbytes / 2**20, grown, one, two, recall)
    print(f"{kind}: {row.params}; built in {row.build_s:.1f} s, {row.mb:.0f} MB (RSS +{grown:.0f} MB); "
          f"1 thread p50 {one[0]:.2f} p99 {one[1]:.2f} ms, 2 threads p50 {two[0]:.2f} p99 {two[1]:.2f} ms; "
          f"recall@10 {recall:.3f}", flush=True)
    return row


def _build(kind: str, args: argparse.Namespace, defaults: SchedulerSettings, data: np.ndarray) -> _Built:
    """Candidate ``kind`` built over ``data`` and timed (training included)."""
    started = time.perf_counter()
    if kind == "prompt-index":
        index = _prompt_index(args, defaults, data)
        build_s = time.perf_counter() - started
        params = f"{index.kind} stage (exact to {defaults.exact_index_max_size}, IVF above {defaults.ivf_min_size})"
        return _Built(_prompt_index_search(index), params, build_s, index.memory_bytes())
    raw, params = faiss_candidate(kind, args, data)
    build_s = time.perf_counter() - started
    return _Built(_faiss_search(raw), params, build_s, faiss.serialize_index(raw).nbytes)


def _prompt_index(args: argparse.Namespace, defaults: SchedulerSettings, data: np.ndarray) -> PromptIndex:
    """The scheduler's own index with the settings' stage limits, grown in ``CHUNK`` batches as the engine does."""
    from svc_scheduler.index import PromptIndex

    index = PromptIndex(
        args.dim, defaults.exact_index_max_size, args.hnsw_m, args.hnsw_ef_construction, args.hnsw_ef_search,
        ivf_min_size=defaults.ivf_min_size, ivf_nlist=args.nlist, ivf_nprobe=args.nprobe,
        ivf_train_size=args.train_size,
    )
    for start in range(0, len(data), CHUNK):
        index.add([str(i) for i in range(start, min(start + CHUNK, len(data)))], data[start:start + CHUNK])
    return index


def _prompt_index_search(index: PromptIndex) -> _Search:
    """A search over the scheduler's index, its string ids read back as row ids."""

    def search(q: np.ndarray) -> list[list[int]]:
        return [[int(h) for h, _ in hits] for hits in index.search(q, 10)]

    return search


def _faiss_search(index: faiss.Index) -> _Search:
    """A search over a raw FAISS index."""

    def search(q: np.ndarray) -> list[list[int]]:
        return index.search(q, 10)[1].tolist()

    return search


if __name__ == "__main__":
    raise SystemExit(main())
