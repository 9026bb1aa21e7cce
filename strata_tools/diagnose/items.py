"""The (prompt, response) items the RM checks score: the zoo suite's fresh prompts, or a user's file.

Default items need no model: suite prompts with corpus responses of mixed quality (references and
degraded ones, ``strata_tools.task.corpus.rm_pairs``), each with its oracle score (0-5) as the reference.
The ``fresh`` split holds one subject per topic that no zoo model was trained on (RM overfit, R16).
A user's own items come from JSONL: ``{"prompt": ..., "response": ..., "score": optional}``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from strata_tools.task.corpus import rm_pairs
from strata_tools.task.oracle import judge
from strata_tools.task.suite import load_suite


@dataclass(frozen=True)
class Pair:
    prompt: str
    response: str
    reference: float | None = None  # the truth to rank against (oracle or human score), when known


@dataclass(frozen=True)
class ScoredBatch:
    """What one Score call returned, in the request's order."""

    rewards: list[float]
    spreads: list[float]  # per-item std across ensemble members (0 for a single RM)
    rm_version: str


def suite_pairs(n: int, split: str = "fresh", seed: int = 0) -> list[Pair]:
    """``n`` pairs from the zoo suite's ``split`` (cycled when the split is smaller), oracle-scored."""
    records = load_suite(split)
    if not records:
        raise ValueError(f"the prompt suite has no {split!r} prompts")
    pairs: list[Pair] = []
    round_ = 0
    while len(pairs) < n:
        for pair in rm_pairs(records, 1, seed + round_):
            pairs.append(Pair(pair.record.text, pair.response, judge(pair.record, pair.response).score))
            if len(pairs) == n:
                break
        round_ += 1
    return pairs


def load_pairs(path: str | Path, n: int | None = None) -> list[Pair]:
    """Pairs from a JSONL file (first ``n`` when given)."""
    pairs = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            score = row.get("score")
            pairs.append(Pair(str(row["prompt"]), str(row["response"]), None if score is None else float(score)))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{line_no}: need a JSON object with prompt, response (and score): {exc}") from exc
        if n is not None and len(pairs) == n:
            break
    if not pairs:
        raise ValueError(f"{path}: no pairs")
    return pairs


def chunks(items: Sequence[Pair], size: int) -> list[Sequence[Pair]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
