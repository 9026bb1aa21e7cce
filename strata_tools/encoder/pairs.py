"""Prompt pairs labelled by reward agreement, and how well a similarity predicts it (pure, no I/O).

The scheduler reuses a neighbour's reward when the two prompts are close; what it needs from the
encoder is that close means *same reward*, not only same topic (issue 39, part 2). The pairs here
are what its history holds: prompts that were rolled out and scored, proposed as pairs by the
encoder the scheduler serves (each prompt's ``k`` nearest above a loose floor: the pairs a skip
decision would weigh), labelled by whether their mean rewards agree within the audit's tolerance.

A held-out share of the *prompts* (by hash, deterministic) never trains: its pairs measure whether
a fine-tuned encoder generalises to prompts it has not seen, as AUC of the cosine for agreement
(the semantic-cache measure of arXiv 2402.01173) and as the precision and recall of the similarity
floor.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ROWS_PER_BLOCK = 1024  # similarity rows computed at a time: a 100k-prompt history never holds N x N floats


@dataclass(frozen=True)
class ScoredPrompt:
    """One prompt of the history: its text and what its rewards say."""

    prompt_hash: str
    text: str
    mean: float  # mean reward (0-5 scale)
    count: int  # rewards behind it
    variance: float = 0.0  # of one reward about the mean (inf: unknown)
    effective_count: float = 0.0  # of decay-weighted rewards, (sum w)^2 / sum w^2 (0: ``count``)
    group: str = ""  # held out together (a paraphrase family, where known); "": the prompt alone

    @property
    def standard_error(self) -> float:
        """Of the mean: how far it may sit from the prompt's true reward (aged rewards count for less)."""
        n = self.effective_count or self.count
        return math.sqrt(self.variance / n) if n > 0 else math.inf

    @property
    def split_key(self) -> str:
        """What the held-out split hashes: the group where there is one, else the prompt."""
        return self.group or self.prompt_hash


@dataclass(frozen=True)
class RewardPair:
    """Prompts ``a`` and ``b`` (indices into the history) and whether their rewards agree."""

    a: int
    b: int
    agree: bool


@dataclass(frozen=True)
class FloorFigures:
    """What a similarity floor does on labelled pairs."""

    floor: float
    precision: float  # of the pairs at or above the floor, the share that agree
    recall: float  # of the agreeing pairs, the share at or above the floor
    kept: int  # pairs at or above the floor


def agreement(difference: float, standard_error: float, tolerance: float, z: float) -> bool | None:
    """Whether two means ``difference`` apart agree within ``tolerance``, as far as their noise lets one say.

    Agree when ``difference + z * se <= tolerance``, disagree when ``difference - z * se > tolerance``,
    else None (undecided: dropped). Two means of four rewards each of a prompt that is right half the
    time differ by more than 0.5 most of the time by chance alone; labelled by the difference alone
    (``z`` = 0), a quarter of the bench's pairs said the opposite of the prompts' true rewards.
    """
    slack = z * standard_error if z else 0.0  # z = 0: the difference alone, even of unknown noise
    if difference + slack <= tolerance:
        return True
    if difference - slack > tolerance:
        return False
    return None


def neighbour_pairs(vectors: np.ndarray, means: Sequence[float], k: int, min_similarity: float,
                    tolerance: float, standard_errors: Sequence[float] | None = None,
                    z: float = 0.0) -> list[RewardPair]:
    """Each prompt's ``k`` nearest others at cosine >= ``min_similarity``, once per unordered pair.

    ``vectors``: (N, D) unit rows. Labels by :func:`agreement` on the two means, with the standard
    error of their difference from ``standard_errors`` (each mean's; none: exact means).
    """
    n = len(vectors)
    if n != len(means):
        raise ValueError(f"{n} vectors but {len(means)} means")
    if standard_errors is not None and n != len(standard_errors):
        raise ValueError(f"{n} vectors but {len(standard_errors)} standard errors")
    mean = np.asarray(means, dtype=np.float64)
    error = np.zeros(n) if standard_errors is None else np.asarray(standard_errors, dtype=np.float64)
    pairs: list[RewardPair] = []
    for i, j in nearest_pairs(vectors, k, min_similarity):
        label = agreement(abs(mean[i] - mean[j]), math.hypot(error[i], error[j]), tolerance, z)
        if label is not None:
            pairs.append(RewardPair(i, j, label))
    return pairs


def nearest_pairs(vectors: np.ndarray, k: int, min_similarity: float) -> list[tuple[int, int]]:
    """(i, j), i < j, for each prompt's ``k`` nearest others at cosine >= ``min_similarity``, once each."""
    if k < 1:
        raise ValueError("k must be >= 1")
    n = len(vectors)
    take = min(k, n - 1)
    if take < 1:
        return []
    seen: set[tuple[int, int]] = set()
    found: list[tuple[int, int]] = []
    for start in range(0, n, ROWS_PER_BLOCK):
        block = vectors[start:start + ROWS_PER_BLOCK] @ vectors.T  # (B, N)
        for row in range(len(block)):
            block[row, start + row] = -np.inf  # a prompt is not its own pair
        nearest = np.argpartition(-block, take - 1, axis=1)[:, :take]
        for row, columns in enumerate(nearest):
            i = start + row
            for j in columns.tolist():
                key = (min(i, j), max(i, j))
                if block[row, j] >= min_similarity and key not in seen:
                    seen.add(key)
                    found.append(key)
    return found


def neighbourhood_groups(vectors: np.ndarray, k: int, min_similarity: float) -> list[int]:
    """Each prompt's group: connected by nearest-neighbour links at cosine >= ``min_similarity``.

    Where the history names no groups (paraphrase families are a bench's knowledge), prompts the
    scheduler would reuse across are held out together, so the held-out figures are not paraphrases
    of training prompts. A chain can join groups that are far apart: that coarsens the split, never
    leaks across it. Returns each prompt's group's lowest index.
    """
    parent = list(range(len(vectors)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in nearest_pairs(vectors, k, min_similarity):
        a, b = root(i), root(j)
        if a != b:
            parent[max(a, b)] = min(a, b)
    return [root(i) for i in range(len(vectors))]


def held_out(key: str, share: float) -> bool:
    """Whether a prompt (or group) belongs to the held-out share, by a hash of ``key``: the same in every run."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "big") / 0x1_0000_0000 < share


def split_pairs(pairs: Sequence[RewardPair], keys: Sequence[str], share: float,
                ) -> tuple[list[RewardPair], list[RewardPair]]:
    """(training pairs: neither prompt held out, evaluation pairs: both held out); mixed pairs are dropped.

    ``keys``: each prompt's :attr:`ScoredPrompt.split_key`.
    """
    out = [held_out(key, share) for key in keys]
    train = [p for p in pairs if not out[p.a] and not out[p.b]]
    evaluation = [p for p in pairs if out[p.a] and out[p.b]]
    return train, evaluation


def pair_similarities(vectors: np.ndarray, pairs: Sequence[RewardPair]) -> np.ndarray:
    """Cosine of each pair under ``vectors`` (unit rows)."""
    if not pairs:
        return np.zeros(0)
    a = np.array([p.a for p in pairs])
    b = np.array([p.b for p in pairs])
    return np.einsum("ij,ij->i", vectors[a], vectors[b]).astype(np.float64)


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Probability that a random positive scores above a random negative (ties count half); nan if a class is empty."""
    from strata.models.probe_head import roc_auc

    value = roc_auc(scores, positive)
    return float("nan") if value is None else value


def at_floor(similarities: np.ndarray, agree: np.ndarray, floor: float) -> FloorFigures:
    """Precision and recall of reusing across every pair at or above ``floor``."""
    agree = np.asarray(agree, dtype=bool)
    kept = similarities >= floor
    n_kept = int(kept.sum())
    precision = float(agree[kept].mean()) if n_kept else float("nan")
    recall = float((agree & kept).sum() / agree.sum()) if agree.any() else float("nan")
    return FloorFigures(floor, precision, recall, n_kept)


def floor_for_precision(similarities: np.ndarray, agree: np.ndarray, precision: float,
                        min_kept: int = 10) -> FloorFigures | None:
    """The lowest floor whose pairs at or above it agree at least at ``precision`` (keeping >= ``min_kept``).

    The most reuse at the error of a reference floor: a fine-tuned encoder's floor is re-measured so,
    against the precision the off-the-shelf encoder had at its own. None when no floor reaches it.
    """
    agree = np.asarray(agree, dtype=bool)
    order = np.argsort(-similarities, kind="mergesort")
    ranked = similarities[order]
    hits = np.cumsum(agree[order])
    lowest: int | None = None
    for i in range(min_kept - 1, len(ranked)):
        if i + 1 < len(ranked) and ranked[i + 1] == ranked[i]:
            continue  # a floor keeps every pair tied with it
        if hits[i] / (i + 1) >= precision:
            lowest = i
    return None if lowest is None else at_floor(similarities, agree, float(ranked[lowest]))
