"""FAISS index: exact below the size limit, HNSW above it, dedupe by hash, cosine scores."""

from __future__ import annotations

import numpy as np

from svc_scheduler.index import PromptIndex


def unit(rows: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_exact_search_orders_by_cosine_and_dedupes() -> None:
    index = PromptIndex(dim=8, exact_max_size=100)
    vectors = unit(20, 8, 0)
    assert index.add([f"h{i}" for i in range(20)], vectors) == 20
    assert index.add(["h0", "new"], unit(2, 8, 1)) == 1  # h0 is already there
    assert len(index) == 21 and index.kind == "exact"
    [hits] = index.search(vectors[3:4], k=5)
    assert hits[0][0] == "h3" and abs(hits[0][1] - 1.0) < 1e-5
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    expected = sorted(range(20), key=lambda i: -float(vectors[i] @ vectors[3]))[:5]
    assert [h for h, _ in hits] == [f"h{i}" for i in expected]


def test_switches_to_hnsw_above_the_limit_with_high_recall() -> None:
    index = PromptIndex(dim=16, exact_max_size=500, hnsw_m=16, hnsw_ef_construction=64, hnsw_ef_search=64)
    data = unit(1500, 16, 2)
    index.add([f"h{i}" for i in range(1000)], data[:1000])
    assert index.kind == "hnsw"
    index.add([f"h{i}" for i in range(1000, 1500)], data[1000:])  # incremental adds after the switch
    queries = unit(50, 16, 3)
    approx, exact = index.search(queries, 10), index.exact_search(queries, 10)
    recall = np.mean([len({h for h, _ in a} & {h for h, _ in e}) / 10 for a, e in zip(approx, exact, strict=True)])
    assert recall > 0.9
    [hits] = index.search(data[1234:1235], 1)
    assert hits[0][0] == "h1234"


def test_empty_index_returns_no_neighbours() -> None:
    assert PromptIndex(dim=4).search(unit(2, 4, 0), 10) == [[], []]
