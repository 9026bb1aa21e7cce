"""The rules of a refresh turn (strata_tools.rm.refresh): the split, the replay, the figures and the verdict."""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import spearmanr

from strata_tools.rm.refresh import (
    RefreshOptions,
    SliceFigures,
    fine_tune_steps,
    gain_se,
    grouped_by_prompt,
    is_held_out,
    replay_groups,
    shortfall,
    slice_figures,
    spearman,
    split_by_prompt,
    verdict,
)


def rows_for(n_prompts: int, answers: int = 2) -> list[dict]:
    return [{"prompt": f"How do I fix thing {p}?", "response": f"answer {a} to {p}", "score": (p + a) % 5}
            for p in range(n_prompts) for a in range(answers)]


def test_the_split_keeps_every_answer_to_a_prompt_on_one_side_and_is_stable() -> None:
    rows = rows_for(400)
    train, held = split_by_prompt(rows, 0.3)
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in held})
    assert len(train) + len(held) == len(rows)
    assert 0.25 < len({r["prompt"] for r in held}) / 400 < 0.35
    assert split_by_prompt(list(reversed(rows)), 0.3)[1] == list(reversed(held))  # by hash, not by position
    assert all(is_held_out(r["prompt"], 0.5) for r in held)  # a larger share keeps the smaller one's prompts


def test_labels_are_grouped_by_prompt_and_replay_takes_whole_groups() -> None:
    grouped = grouped_by_prompt(rows_for(3))
    assert len({r["group"] for r in grouped}) == 3
    assert grouped[0]["group"] == grouped[1]["group"] != grouped[2]["group"]
    data = [{"prompt": f"p{g}", "response": f"r{i}", "score": 1.0, "group": g} for g in range(10) for i in range(4)]
    data.append({"prompt": "lone", "response": "r", "score": 2.0})  # no group: a group of its own
    replay = replay_groups(data, 4, seed=1)
    groups = {r["group"] for r in replay}
    assert len(groups) == 4 and all(g.startswith("replay:") for g in groups)
    assert all(sum(r["group"] == g for r in replay) in (1, 4) for g in groups)  # whole groups only
    assert replay == replay_groups(data, 4, seed=1)
    assert len({r["group"] for r in replay_groups(data, 99, seed=1)}) == 11  # capped at what there is
    assert replay_groups(data, 0, seed=1) == []


def test_too_few_labels_are_refused_with_the_counts() -> None:
    options = RefreshOptions(min_train=20, min_held_out=10)
    assert shortfall(20, 10, options) is None
    why = shortfall(40, 9, options)
    assert why is not None and "40 labels to train on and 9 held out" in why and "min_held_out" in why
    assert shortfall(19, 50, options) is not None


def test_spearman_matches_scipy_with_ties() -> None:
    rng = random.Random(3)
    for _ in range(20):
        a = [rng.choice([0, 0.5, 1, 2, 2, 3]) for _ in range(15)]
        b = [x + rng.gauss(0, 1) for x in a]
        assert spearman(a, b) == pytest.approx(spearmanr(a, b).statistic)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="2 predictions for 3"):
        spearman([1, 2], [1, 2, 3])


def test_slice_figures_count_pairs_within_a_prompt_only() -> None:
    prompts = ["a", "a", "b", "b", "c"]
    labels = [1.0, 4.0, 2.0, 2.2, 5.0]  # b's answers are 0.2 apart: no pair
    rewards = [1.5, 3.0, 2.5, 1.0, 0.0]
    figures = slice_figures(rewards, labels, prompts)
    assert (figures.n, figures.n_pairs, figures.pair_accuracy) == (5, 1, 1.0)
    wrong = slice_figures([3.0, 1.5, 2.5, 1.0, 0.0], labels, prompts)
    assert wrong.pair_accuracy == 0.0
    assert math.isnan(slice_figures(rewards, labels, ["a", "b", "c", "d", "e"]).pair_accuracy)


def test_the_gain_has_a_bootstrap_error_that_shrinks_with_more_labels() -> None:
    rng = random.Random(0)

    def se(n: int) -> float:
        labels = [rng.uniform(0, 5) for _ in range(n)]
        current = [x + rng.gauss(0, 2) for x in labels]
        candidate = [x + rng.gauss(0, 1) for x in labels]
        return gain_se(candidate, current, labels, rounds=300, seed=1)

    assert gain_se([1, 2, 3, 4], [1, 2, 3, 4], [4, 3, 2, 1], rounds=200, seed=0) == 0.0  # the same RM: no gain
    assert se(400) < se(25)


def test_the_verdict_promotes_only_a_better_ranking_and_says_why() -> None:
    current, better, worse = (SliceFigures(30, rho, 0.7, 10) for rho in (0.40, 0.55, 0.35))
    promote = verdict(current, better, 0.05, 0.0, "light-old", "light-new")
    assert promote.promote and promote.reason.startswith("promoting light-new")
    assert "0.400 (light-old, in service) -> 0.550 (light-new), gain +0.150 ± 0.050" in promote.reason
    refuse = verdict(current, worse, 0.05, 0.0, "light-old", "light-new")
    assert not refuse.promote and "gain -0.050" in refuse.reason
    assert not verdict(current, better, 0.05, 0.2, "light-old", "light-new").promote  # under min_gain
    noisy = verdict(current, better, 0.10, 0.0, "light-old", "light-new", min_gain_se=2.0)
    assert not noisy.promote and "not above the 0.200 needed" in noisy.reason  # within two SEs: noise
    assert not verdict(current, SliceFigures(30, math.nan, math.nan, 0), 0.0, 0.0, "o", "n").promote


def test_options_come_from_the_environment_and_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_RM_REFRESH_EVERY_S", "3600")
    monkeypatch.setenv("STRATA_RM_REFRESH_HOLD_OUT", "0.25")
    options = RefreshOptions()
    assert (options.every_s, options.hold_out) == (3600.0, 0.25)
    assert RefreshOptions(hold_out=0.4).hold_out == 0.4  # a flag wins
    with pytest.raises(ValueError, match="hold_out"):
        RefreshOptions(hold_out=1.0)


def test_fine_tuning_runs_its_epochs_over_the_labels_and_the_replay_unless_told_the_steps() -> None:
    assert fine_tune_steps(200, 100, 4, RefreshOptions(strong_epochs=3.0)) == 225
    assert fine_tune_steps(1, 0, 4, RefreshOptions(strong_epochs=1.0)) == 1
    assert fine_tune_steps(200, 100, 4, RefreshOptions(strong_steps=7)) == 7
