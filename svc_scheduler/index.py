"""Nearest-neighbour index over every historical prompt (R9), in FAISS.

Three stages, each entered once, by a rebuild, as the index grows:

1. **exact** (``IndexFlatIP``) up to ``exact_max_size`` prompts;
2. **hnsw** (``IndexHNSWFlat``, inner product) above it: well under a millisecond at 100k prompts,
   where exact search takes ~19 ms on two cores (NOTES.md);
3. **ivf** (``IndexIVFScalarQuantizer``, float16 vectors, inner product) above ``ivf_min_size``. At
   1M 384-d prompts HNSW takes ~6 min to build on two cores and 1.7 GB, besides the 1.5 GB float32
   copy kept for rebuilds; IVF stores 2 bytes a dimension (0.74 GB at 1M, nothing else kept), searches
   in ~1 ms at recall@10 1.000 (0.98 for HNSW) and adds a prompt with one centroid search
   (docs/performance.md, ``python -m strata_tools.bench.index_scale``). Its ``ivf_nlist`` centroids are
   trained (spherical k-means, seeded) on ``ivf_train_size`` rows sampled with a fixed seed, so a
   rebuild is reproducible; later adds go straight into the trained lists.

After the IVF rebuild the float32 copy is dropped: no later stage needs it, and ``exact_search``
scans every IVF list instead (brute force over the float16 vectors: cosines within ~1e-4 of float32,
~0.1 s a query at 1M).

Vectors must be unit length (the encoder normalises), so scores are cosine similarities. The index
maps FAISS row ids to prompt hashes and ignores a hash it already holds (replicas and restarts add
the same prompt more than once). Thread-safe: gRPC handlers search while the replica-sync loop adds;
a rebuild holds the lock (the IVF one trains k-means: tens of seconds at 300k, logged at INFO).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import faiss
import numpy as np

log = logging.getLogger(__name__)

IVF_TRAIN_SEED = 0  # which rows train the IVF centroids (k-means itself is seeded by faiss: cp.seed)


class PromptIndex:
    def __init__(
        self, dim: int, exact_max_size: int = 20_000, hnsw_m: int = 32, hnsw_ef_construction: int = 80,
        hnsw_ef_search: int = 96, *, ivf_min_size: int = 300_000, ivf_nlist: int = 2048, ivf_nprobe: int = 16,
        ivf_train_size: int = 100_000,
    ) -> None:
        if ivf_nlist > min(ivf_train_size, ivf_min_size + 1):
            raise ValueError(f"ivf_nlist {ivf_nlist} needs at least as many training rows: ivf_train_size "
                             f"{ivf_train_size} and ivf_min_size {ivf_min_size} must both reach it")
        self.dim = dim
        self._exact_max_size = exact_max_size
        self._hnsw = (hnsw_m, hnsw_ef_construction, hnsw_ef_search)
        self._ivf_min_size = ivf_min_size
        self._ivf = (ivf_nlist, ivf_nprobe, ivf_train_size)
        self._kind = "exact"
        self._index: faiss.Index = faiss.IndexFlatIP(dim)
        self._hashes: list[str] = []  # row id -> prompt hash
        self._rows: dict[str, int] = {}  # prompt hash -> row id
        self._chunks: list[np.ndarray] = []  # every vector added, in row order, until the IVF rebuild
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        """The stage: "exact", "hnsw" or "ivf"."""
        return self._kind

    def __len__(self) -> int:
        return len(self._hashes)

    def __contains__(self, prompt_hash: object) -> bool:
        return prompt_hash in self._rows

    def add(self, hashes: Sequence[str], vectors: np.ndarray) -> int:
        """Add the prompts not yet indexed; returns how many were new."""
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        if len(hashes) != len(vectors):
            raise ValueError(f"{len(hashes)} hashes for {len(vectors)} vectors")
        with self._lock:
            keep = []
            for i, digest in enumerate(hashes):
                if digest not in self._rows:
                    self._rows[digest] = len(self._hashes)
                    self._hashes.append(digest)
                    keep.append(i)
            if not keep:
                return 0
            new = vectors[keep].copy()
            if self._kind == "ivf":
                self._index.add(new)
                return len(keep)
            self._chunks.append(new)
            if len(self._hashes) > self._ivf_min_size:
                self._index, self._kind = self._build_ivf(self._all_vectors()), "ivf"
                self._chunks = []  # the IVF lists hold every vector now (float16)
            elif self._kind == "exact" and len(self._hashes) > self._exact_max_size:
                self._index, self._kind = self._build_hnsw(self._all_vectors()), "hnsw"
            else:
                self._index.add(new)
            return len(keep)

    def _all_vectors(self) -> np.ndarray:
        """(N, D) matrix of every vector, row i = row id i (chunks merged once, under the lock)."""
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros((0, self.dim), dtype=np.float32)

    def _build_hnsw(self, vectors: np.ndarray) -> faiss.Index:
        started = time.perf_counter()
        m, ef_construction, ef_search = self._hnsw
        index = faiss.IndexHNSWFlat(self.dim, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
        index.add(vectors)
        log.info("prompt index rebuilt as HNSW (M %d): %d prompts in %.1f s", m, len(vectors),
                 time.perf_counter() - started)
        return index

    def _build_ivf(self, vectors: np.ndarray) -> faiss.Index:
        started = time.perf_counter()
        nlist, nprobe, train_size = self._ivf
        index = faiss.index_factory(self.dim, f"IVF{nlist},SQfp16", faiss.METRIC_INNER_PRODUCT)
        rows = np.random.default_rng(IVF_TRAIN_SEED).choice(len(vectors), min(train_size, len(vectors)), replace=False)
        index.train(vectors[np.sort(rows)])  # (train_size, D)
        trained = time.perf_counter()
        index.add(vectors)
        index.nprobe = nprobe
        log.info("prompt index rebuilt as IVF (nlist %d, nprobe %d): %d prompts in %.1f s (k-means on %d rows "
                 "%.1f s, add %.1f s); searches waited", nlist, nprobe, len(vectors), time.perf_counter() - started,
                 len(rows), trained - started, time.perf_counter() - trained)
        return index

    def memory_bytes(self) -> int:
        """Bytes this index holds: the FAISS index (its serialized size) plus the float32 copy kept for rebuilds.

        Writes the index through a counting sink under the lock (no copy, but O(size)): for benchmarks and
        reports, not the request path. The row id <-> hash maps (Python objects) are not counted.
        """
        written = 0

        def count(chunk: bytes) -> int:
            nonlocal written
            written += len(chunk)
            return len(chunk)

        with self._lock:
            writer = faiss.PyCallbackIOWriter(count)
            faiss.write_index(self._index, writer)
            del writer  # flushes its buffer into count
            return written + sum(chunk.nbytes for chunk in self._chunks)

    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """For each query row, up to k (prompt hash, cosine) pairs, most similar first."""
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        with self._lock:
            if not self._hashes or not len(queries):
                return [[] for _ in range(len(queries))]
            scores, rows = self._index.search(queries, min(k, len(self._hashes)))
            hashes = self._hashes
        return _hits(hashes, scores, rows)

    def exact_search(self, queries: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """Brute-force search over the same vectors (the benchmark's ground truth for recall).

        At the IVF stage, every list is scanned (the float16 vectors the index holds).
        """
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        with self._lock:
            hashes = self._hashes
            if self._kind == "ivf":
                every_list = faiss.SearchParametersIVF(nprobe=self._ivf[0])
                scores, rows = self._index.search(queries, k, params=every_list)
                return _hits(hashes, scores, rows)
            flat = faiss.IndexFlatIP(self.dim)
            flat.add(self._all_vectors())
        scores, rows = flat.search(queries, k)
        return _hits(hashes, scores, rows)


def _hits(hashes: list[str], scores: np.ndarray, rows: np.ndarray) -> list[list[tuple[str, float]]]:
    """FAISS's (Q, k) scores and row ids as (hash, cosine) lists; row -1 (fewer than k) dropped."""
    return [
        [(hashes[r], float(s)) for s, r in zip(score_row, row, strict=True) if r >= 0]
        for score_row, row in zip(scores, rows, strict=True)
    ]
