"""Reference responses are good under the oracle; each degradation makes them worse."""

from __future__ import annotations

import random
import statistics
from collections import defaultdict

from strata.zoo.corpus import DEGRADATIONS, degrade, lm_texts, probe_texts, reference_response, rm_pairs
from strata.zoo.oracle import oracle_score
from strata.zoo.suite import load_suite


def test_reference_responses_score_high() -> None:
    rng = random.Random(0)
    records = load_suite("eval")
    scores = [oracle_score(r, reference_response(r, rng)) for r in records]
    assert statistics.mean(scores) > 4.6
    assert min(scores) > 3.8


def test_every_degradation_lowers_the_mean_score() -> None:
    rng = random.Random(0)
    records = load_suite("eval")
    drops: dict[str, list[float]] = defaultdict(list)
    for record in records:
        reference = reference_response(record, rng)
        for kind in DEGRADATIONS:
            if kind in ("unsafe", "no_caution") and not record.risk:
                continue
            worse = degrade(record, reference, kind, rng)
            drops[kind].append(oracle_score(record, reference) - oracle_score(record, worse))
    for kind, values in drops.items():
        assert statistics.mean(values) > 0.5, kind


def test_corpora_are_deterministic() -> None:
    records = load_suite("train")[:50]
    assert lm_texts(records, 2, seed=3) == lm_texts(records, 2, seed=3)
    assert lm_texts(records, 2, seed=3) != lm_texts(records, 2, seed=4)
    assert probe_texts(records, seed=1) == probe_texts(records, seed=1)
    assert rm_pairs(records, 2, seed=5) == rm_pairs(records, 2, seed=5)
    assert all(text.startswith("Q: ") and "\nA: " in text for text in lm_texts(records, 1, seed=0))


def test_rm_pairs_have_a_wide_spread_of_scores() -> None:
    pairs = rm_pairs(load_suite("train")[:400], 2, seed=0)
    scores = [oracle_score(p.record, p.response) for p in pairs]
    assert statistics.pstdev(scores) > 1.0
    assert min(scores) < 1.5 and max(scores) > 4.5
