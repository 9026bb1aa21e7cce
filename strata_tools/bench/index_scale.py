"""``python -m strata_tools.bench.index_scale``: FAISS index candidates for the scheduler at 10k-1M prompts.

Builds each candidate over ``--size`` clustered unit vectors (strata_tools.bench.scheduler's synthetic
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
import time
from collections.abc import Callable

import faiss
import numpy as np

ALL = "ivf-fp16,ivf-flat,ivf-sq8,ivf-pq,ivf-pq-refine,hnsw,prompt-index"
CHUNK = 20_000  # rows per add, as strata_tools.bench.scheduler grows the engine's index


def synthetic(n: int, rng: np.random.Generator, centres: np.ndarray, cosine: float) -> np.ndarray:
    """(n, D) unit vectors: a random centre plus Gaussian noise, cosine to the centre ~``cosine``."""
    dim = centres.shape[1]
    sigma = np.sqrt((1 / cosine**2 - 1) / dim)  # |noise|^2 = 1/cos^2 - 1 against a unit centre
    x = centres[rng.integers(0, len(centres), n)] + rng.normal(scale=sigma, size=(n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


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


def main() -> int:
    from svc_scheduler.config import SchedulerSettings

    defaults = SchedulerSettings()
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
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")  # PromptIndex's rebuilds
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if unknown := set(kinds) - set(ALL.split(",")):
        parser.error(f"unknown --kinds {sorted(unknown)}")

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
    _, truth = flat.search(queries, 10)  # (Q, 10) row ids, float32 brute force
    del flat
    print(f"index_scale: {args.size} x {args.dim}-d vectors, {args.centres} centres at cosine "
          f"{args.centre_cosine}; recall@10 on {args.queries} queries, latency on {args.latency_queries}", flush=True)

    rows = []
    for kind in kinds:
        faiss.omp_set_num_threads(2)
        before, started = rss_mb(), time.perf_counter()
        if kind == "prompt-index":
            from svc_scheduler.index import PromptIndex

            index = PromptIndex(
                args.dim, defaults.exact_index_max_size, args.hnsw_m, args.hnsw_ef_construction, args.hnsw_ef_search,
                ivf_min_size=defaults.ivf_min_size, ivf_nlist=args.nlist, ivf_nprobe=args.nprobe,
                ivf_train_size=args.train_size,
            )
            for start in range(0, len(data), CHUNK):
                index.add([str(i) for i in range(start, min(start + CHUNK, len(data)))], data[start:start + CHUNK])
            build_s = time.perf_counter() - started
            params = f"{index.kind} stage (exact to {defaults.exact_index_max_size}, IVF above {defaults.ivf_min_size})"
            nbytes = index.memory_bytes()

            def search(q: np.ndarray, index: PromptIndex = index) -> list[list[int]]:
                return [[int(h) for h, _ in hits] for hits in index.search(q, 10)]
        else:
            index, params = faiss_candidate(kind, args, data)
            build_s = time.perf_counter() - started
            nbytes = faiss.serialize_index(index).nbytes

            def search(q: np.ndarray, index: faiss.Index = index) -> list[list[int]]:
                return index.search(q, 10)[1].tolist()
        grown = rss_mb() - before
        faiss.omp_set_num_threads(2)
        found = search(queries)
        recall = float(np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth.tolist(), strict=True)]))
        one, two = latency_ms(search, timed, 1), latency_ms(search, timed, 2)
        rows.append((kind, params, build_s, nbytes / 2**20, grown, one, two, recall))
        print(f"{kind}: {params}; built in {build_s:.1f} s, {nbytes / 2**20:.0f} MB (RSS +{grown:.0f} MB); "
              f"1 thread p50 {one[0]:.2f} p99 {one[1]:.2f} ms, 2 threads p50 {two[0]:.2f} p99 {two[1]:.2f} ms; "
              f"recall@10 {recall:.3f}", flush=True)
        del index, search

    print()
    print("| index | parameters | build s | index MB | RSS +MB | 1 thread p50/p99 ms | 2 threads p50/p99 ms "
          "| recall@10 |\n|---|---|---|---|---|---|---|---|")
    for kind, params, build_s, mb, grown, one, two, recall in rows:
        print(f"| {kind} | {params} | {build_s:.1f} | {mb:.0f} | {grown:.0f} | {one[0]:.2f} / {one[1]:.2f} "
              f"| {two[0]:.2f} / {two[1]:.2f} | {recall:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
