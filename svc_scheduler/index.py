"""Nearest-neighbour index over every historical prompt (R9), in FAISS.

Exact inner-product search (``IndexFlatIP``) while the index is small; once it grows past
``exact_max_size`` it is rebuilt once as HNSW (``IndexHNSWFlat``, inner product), which answers in
well under a millisecond at 100k prompts where exact search takes ~19 ms on two cores (NOTES.md).
The benchmark measures HNSW's recall@10 against exact search.

Vectors must be unit length (the encoder normalises), so scores are cosine similarities. The index
maps FAISS row ids to prompt hashes and ignores a hash it already holds (replicas and restarts add
the same prompt more than once). Thread-safe: gRPC handlers search while the replica-sync loop adds.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import faiss
import numpy as np


class PromptIndex:
    def __init__(
        self, dim: int, exact_max_size: int = 20_000, hnsw_m: int = 32, hnsw_ef_construction: int = 80,
        hnsw_ef_search: int = 96,
    ) -> None:
        self.dim = dim
        self._exact_max_size = exact_max_size
        self._hnsw = (hnsw_m, hnsw_ef_construction, hnsw_ef_search)
        self._index: faiss.Index = faiss.IndexFlatIP(dim)
        self._hashes: list[str] = []  # row id -> prompt hash
        self._rows: dict[str, int] = {}  # prompt hash -> row id
        self._chunks: list[np.ndarray] = []  # every vector added, in row order (to rebuild as HNSW)
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        return "exact" if isinstance(self._index, faiss.IndexFlatIP) else "hnsw"

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
            self._chunks.append(new)
            if self.kind == "exact" and len(self._hashes) > self._exact_max_size:
                self._index = self._build_hnsw(self._all_vectors())
            else:
                self._index.add(new)
            return len(keep)

    def _all_vectors(self) -> np.ndarray:
        """(N, D) matrix of every vector, row i = row id i (chunks merged once, under the lock)."""
        if len(self._chunks) > 1:
            self._chunks = [np.concatenate(self._chunks)]
        return self._chunks[0] if self._chunks else np.zeros((0, self.dim), dtype=np.float32)

    def _build_hnsw(self, vectors: np.ndarray) -> faiss.Index:
        m, ef_construction, ef_search = self._hnsw
        index = faiss.IndexHNSWFlat(self.dim, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
        index.add(vectors)
        return index

    def search(self, queries: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """For each query row, up to k (prompt hash, cosine) pairs, most similar first."""
        queries = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        with self._lock:
            if not self._hashes or not len(queries):
                return [[] for _ in range(len(queries))]
            scores, rows = self._index.search(queries, min(k, len(self._hashes)))
            hashes = self._hashes
        return [
            [(hashes[r], float(s)) for s, r in zip(score_row, row, strict=True) if r >= 0]
            for score_row, row in zip(scores, rows, strict=True)
        ]

    def exact_search(self, queries: np.ndarray, k: int) -> list[list[tuple[str, float]]]:
        """Brute-force search over the same vectors (the benchmark's ground truth for recall)."""
        with self._lock:
            flat = faiss.IndexFlatIP(self.dim)
            flat.add(self._all_vectors())
            hashes = self._hashes
        scores, rows = flat.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return [
            [(hashes[r], float(s)) for s, r in zip(sr, rr, strict=True) if r >= 0]
            for sr, rr in zip(scores, rows, strict=True)
        ]
