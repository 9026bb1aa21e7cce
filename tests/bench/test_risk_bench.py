"""``strata bench risk``: the floor is chosen on validation by its rule, and the served default is that floor."""

from __future__ import annotations

import pytest

from strata_tools.bench.risk import CHOSEN_ON, _measure, _negatives, choose_floor, detected, read_detection


def test_the_floor_sits_just_above_the_last_prompt_the_budget_cannot_afford() -> None:
    similarity = [0.10, 0.20, 0.30, 0.40, 0.50, 0.60, 0.70, 0.80, 0.90, 0.95]
    no_keywords = [False] * 10
    # 20 % of 10: two prompts may be flagged, so the floor lies just above the third highest (0.80).
    assert choose_floor(similarity, no_keywords, 0.2) == pytest.approx(0.801)
    assert sum(detected(similarity, no_keywords, 0.801)) == 2
    # A keyword hit spends one of the two.
    with_keyword = [True] + [False] * 9
    assert choose_floor(similarity, with_keyword, 0.2) == pytest.approx(0.901)
    # Ties with the blocking prompt stay below the floor.
    assert choose_floor([0.5, 0.5, 0.5, 0.2], [False] * 4, 0.25) == pytest.approx(0.501)
    # Keywords alone over the budget: no floor is affordable.
    assert choose_floor([0.1, 0.2], [True, True], 0.4) > 1
    # A budget of all but one prompt flags all but the lowest.
    assert choose_floor([0.1, 0.2], [False, False], 0.99) == pytest.approx(0.101)


def test_choose_floor_refuses_mismatched_or_impossible_input() -> None:
    with pytest.raises(ValueError, match="one keyword flag"):
        choose_floor([0.1], [], 0.1)
    with pytest.raises(ValueError, match="max_flagged"):
        choose_floor([0.1], [False], 1.0)


def test_recall_and_flagged_are_read_by_family() -> None:
    hits = [True, True, False, False, True, False]
    risky = [True, True, True, True, False, False]
    families = ["a", "a", "b", "b", "c", "d"]
    detection = read_detection(hits, risky, families, seed=0, draws=200)
    assert detection.recall.estimate == pytest.approx(0.5) and detection.recall.clusters == 2
    assert detection.flagged.estimate == pytest.approx(0.5) and detection.flagged.clusters == 2
    # Family a is all hits, b all misses: resamples give 0, 0.5 or 1.
    assert detection.recall.low == 0.0 and detection.recall.high == 1.0


def test_the_served_floor_is_the_one_validation_chooses() -> None:
    """Change the exemplars, the keywords or the encoder and this fails: rerun ``strata bench risk`` and
    serve the floor it chooses on the validation split."""
    from svc_scheduler.config import SchedulerSettings
    from svc_scheduler.encoder import Encoder

    settings = SchedulerSettings()
    split = _measure(settings, Encoder.from_settings(settings))[CHOSEN_ON]
    assert choose_floor(*_negatives(split), 0.01) == pytest.approx(settings.risk_exemplar_min_similarity)
