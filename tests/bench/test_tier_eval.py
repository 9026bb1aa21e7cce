"""Tier evaluation on hand-built outcomes; every expected figure is worked out in the comments."""

from __future__ import annotations

import pytest

from strata_tools.tiering.tier_eval import (
    Answer,
    ArmFigures,
    ExpectedScores,
    PromptOutcome,
    all_level2,
    apgr,
    best_saving_at,
    ceiling,
    ceiling_saving_at,
    cheapest_reaching,
    compare,
    cpt,
    evaluate,
    oracle_router,
    pgr,
    plot_curve,
    random_router,
    random_router_figures,
    route_llm_curve,
    share_of_ceiling_saving,
    sweep,
    threshold_router,
    to_json,
    with_expected,
)

BAD = 3.0


def _po(h: str, l1: tuple[float, float, float] | None, l2: tuple[float, float, float]) -> PromptOutcome:
    """(oracle, rm, device_seconds); param_tokens are 5 per Level-1 answer and 100 per Level-2 answer."""
    level1 = None if l1 is None else Answer(l1[0], l1[1], l1[2], 5.0)
    return PromptOutcome(h, level1, Answer(l2[0], l2[1], l2[2], 100.0), risk=h == "e", human_seconds=10.0)


# Level-1 oracle < 3 (bad): b, c.  Good: a, d.  e is cautious.  Level-1 RM order: b .2 < c .5 < d .6 < a .9.
OUTCOMES = [
    _po("a", (4.0, 0.9, 1.0), (4.5, 0.95, 10.0)),
    _po("b", (1.0, 0.2, 2.0), (4.0, 0.7, 20.0)),
    _po("c", (2.0, 0.5, 3.0), (1.5, 0.4, 30.0)),
    _po("d", (3.5, 0.6, 4.0), (3.0, 0.6, 40.0)),  # equal RMs: keep_better must keep Level-2
    _po("e", None, (5.0, 0.9, 50.0)),
]
# All-Level-2: device 10+20+30+40+50 = 150, param-tokens 5*100 = 500, human 5*10 = 50, oracle 18/5 = 3.6.
BASE = all_level2(OUTCOMES, BAD)


def test_baseline_counts_each_level2_cost_once() -> None:
    assert (BASE.name, BASE.prompts, BASE.level2_share) == ("all-Level-2", 5, 1.0)
    assert BASE.device_seconds == pytest.approx(150.0)
    assert BASE.param_tokens == pytest.approx(500.0)
    assert BASE.human_seconds == pytest.approx(50.0)
    assert BASE.mean_oracle == pytest.approx(3.6)
    assert BASE.bad_case_catch is None and BASE.false_escalation is None


def test_escalated_prompt_pays_both_tiers() -> None:
    arm = compare(evaluate("b up", OUTCOMES, {"b"}, BAD), BASE)
    # Level-1 of a-d: 1+2+3+4 = 10; Level-2 of b and cautious e: 20+50 = 70 -> 80.  Param-tokens 4*5 + 2*100 = 220.
    assert arm.device_seconds == pytest.approx(80.0)
    assert arm.param_tokens == pytest.approx(220.0)
    assert arm.human_seconds == pytest.approx(20.0)
    assert arm.level2_share == pytest.approx(0.4)
    # Quality: a 4.0, b 4.0 (L2), c 2.0, d 3.5, e 5.0 = 18.5 / 5 = 3.7.
    assert arm.mean_oracle == pytest.approx(3.7)
    assert arm.saving == pytest.approx(1 - 80 / 150)
    assert arm.param_token_saving == pytest.approx(1 - 220 / 500)
    assert arm.quality_ratio == pytest.approx(3.7 / 3.6)
    # Bad Level-1 answers b, c: only b escalated.  Good a, d: none escalated.
    assert arm.bad_case_catch == pytest.approx(0.5)
    assert arm.false_escalation == pytest.approx(0.0)
    assert to_json(arm)["saving"] == pytest.approx(1 - 80 / 150)


def test_escalating_everything_costs_more_than_the_baseline() -> None:
    arm = compare(evaluate("all", OUTCOMES, {"a", "b", "c", "d"}, BAD), BASE)
    # 10 of Level-1 on top of the baseline's 150.
    assert arm.device_seconds == pytest.approx(160.0)
    assert arm.saving == pytest.approx(-10 / 150)
    assert arm.mean_oracle == pytest.approx(BASE.mean_oracle)
    assert (arm.bad_case_catch, arm.false_escalation) == (1.0, 1.0)


def test_keep_better_picks_by_rm() -> None:
    everything = {"a", "b", "c", "d"}
    # a: L2 rm .95 > .9 -> 4.5; b: L2 -> 4.0; c: L1 rm .5 > .4 -> 2.0; d: tie -> L2 3.0; e 5.0 -> 18.5 / 5.
    assert evaluate("kb", OUTCOMES, everything, BAD, keep_better=True).mean_oracle == pytest.approx(3.7)
    assert evaluate("plain", OUTCOMES, everything, BAD).mean_oracle == pytest.approx(3.6)
    # Not escalated: Level-1 stays whatever keep_better says.
    assert evaluate("none", OUTCOMES, set(), BAD, keep_better=True).mean_oracle == pytest.approx(15.5 / 5)


def test_routers() -> None:
    assert oracle_router(OUTCOMES, BAD) == {"b", "c"}
    arm = evaluate("oracle", OUTCOMES, oracle_router(OUTCOMES, BAD), BAD)
    assert (arm.bad_case_catch, arm.false_escalation) == (1.0, 0.0)
    assert threshold_router(OUTCOMES, 0.6) == {"b", "c"}
    assert threshold_router(OUTCOMES, 0.65) == {"b", "c", "d"}
    arm = evaluate("t", OUTCOMES, threshold_router(OUTCOMES, 0.65), BAD)
    assert (arm.bad_case_catch, arm.false_escalation) == (1.0, 0.5)


def test_random_router_share_counts_cautious() -> None:
    draws = [random_router(OUTCOMES, 0.6, seed) for seed in range(50)]
    # round(0.6 * 5) = 3 at Level-2, one of them the cautious e -> 2 of the 4 others.
    assert all(len(d) == 2 and d <= {"a", "b", "c", "d"} for d in draws)
    assert len(set(draws)) > 1
    assert random_router(OUTCOMES, 0.6, 7) == random_router(OUTCOMES, 0.6, 7)
    assert random_router(OUTCOMES, 0.1, 0) == frozenset()  # the cautious prompt alone exceeds the share
    assert random_router(OUTCOMES, 1.0, 0) == {"a", "b", "c", "d"}
    with pytest.raises(ValueError):
        random_router(OUTCOMES, 1.5, 0)


def test_random_router_figures_near_expectation() -> None:
    arm = random_router_figures(OUTCOMES, 0.6, BAD, BASE, seeds=400)
    # Each non-cautious prompt escalated with probability 2/4.  Device: 10 + 50 + 0.5 * (10+20+30+40) = 110.
    assert arm.name == "random router"
    assert arm.level2_share == pytest.approx(0.6)
    assert arm.human_seconds == pytest.approx(30.0)
    assert arm.device_seconds == pytest.approx(110.0, abs=3.0)
    assert arm.saving == pytest.approx(1 - 110 / 150, abs=0.02)
    # Oracle: (5 + 0.5 * (4+1+2+3.5) + 0.5 * (4.5+4+1.5+3)) / 5 = (5 + 5.25 + 6.5) / 5 = 3.35.
    assert arm.mean_oracle == pytest.approx(3.35, abs=0.05)
    assert arm.bad_case_catch == pytest.approx(0.5, abs=0.05)
    assert arm.false_escalation == pytest.approx(0.5, abs=0.05)


def test_sweep_endpoints_and_curve() -> None:
    arms = sweep(OUTCOMES, BAD, BASE)
    assert [a.name for a in arms] == [
        "threshold=-inf", "threshold=0.200", "threshold=0.500", "threshold=0.600", "threshold=0.900"]
    # Shares: e alone, then + b, + c, + d, + a.  Oracle sums: 15.5, 18.5, 18.0, 17.5, 18.0 (over 5).
    assert [a.level2_share for a in arms] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert [a.mean_oracle for a in arms] == pytest.approx([3.1, 3.7, 3.6, 3.5, 3.6])
    # First point: Level-1 (10) + cautious e (50); last point: baseline quality at 160 device-seconds.
    assert arms[0].device_seconds == pytest.approx(60.0) and arms[0].saving == pytest.approx(0.6)
    assert arms[-1].mean_oracle == pytest.approx(BASE.mean_oracle) and arms[-1].quality_ratio == pytest.approx(1.0)
    assert arms[-1].saving == pytest.approx(-10 / 150)
    # PGR with weak 3.1, strong 3.6: 0, 1.2, 1.0, 0.8, 1.0.  Trapezoids of width .2: .12 + .22 + .18 + .18 = .70
    # over the span .8 -> .875.  CPT(.5) between (.2, 0) and (.4, 1.2): .2 + .5 / 1.2 * .2.
    points = [(a.level2_share, a.mean_oracle) for a in arms]
    assert apgr(points, arms[0].mean_oracle, BASE.mean_oracle) == pytest.approx(0.875)
    assert cpt(points, arms[0].mean_oracle, BASE.mean_oracle, 0.5) == pytest.approx(0.2 + 0.5 / 1.2 * 0.2)
    # keep_better at the last point: 3.7 (see test_keep_better_picks_by_rm).
    assert sweep(OUTCOMES, BAD, BASE, keep_better=True)[-1].mean_oracle == pytest.approx(3.7)


def test_ceiling_escalates_largest_gains_first() -> None:
    arms = ceiling(OUTCOMES, BAD, BASE)
    # Gains Level-2 minus Level-1: b +3, a +.5, c -.5, d -.5 (tie broken by hash).  Oracle sums: 15.5, then
    # + 3 = 18.5, + .5 = 19.0, - .5 = 18.5, - .5 = 18.0 (over 5); device 60, + 20, + 10, + 30, + 40.
    assert [a.level2_share for a in arms] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert [a.mean_oracle for a in arms] == pytest.approx([3.1, 3.7, 3.8, 3.7, 3.6])
    assert [a.device_seconds for a in arms] == pytest.approx([60.0, 80.0, 90.0, 120.0, 160.0])
    # The ceiling is never under the threshold sweep at the same share.
    for best, threshold in zip(arms, sweep(OUTCOMES, BAD, BASE), strict=True):
        assert best.mean_oracle >= threshold.mean_oracle - 1e-12
    # Quality ratio >= 1 first at k=1 (3.7 / 3.6), the cheapest such arm; 3.8 / 3.6 needs k=2.
    assert cheapest_reaching(arms, 1.0).name == "ceiling k=1"  # type: ignore[union-attr]
    assert cheapest_reaching(arms, 3.8 / 3.6).saving == pytest.approx(1 - 90 / 150)  # type: ignore[union-attr]
    assert cheapest_reaching(arms, 1.1) is None


def test_the_ceiling_buys_gain_per_unit_of_cost_first() -> None:
    # b gains 3 for 300 params x tokens (0.01 per unit), a gains .5 for 10 (0.05): a first, though b gains more.
    outcomes = [PromptOutcome("a", Answer(4.0, 0.9, 1.0, 5.0), Answer(4.5, 0.9, 1.0, 10.0)),
                PromptOutcome("b", Answer(1.0, 0.2, 1.0, 5.0), Answer(4.0, 0.7, 1.0, 300.0))]
    base = all_level2(outcomes, BAD)
    arms = ceiling(outcomes, BAD, base)
    assert [a.param_tokens for a in arms] == pytest.approx([10.0, 20.0, 320.0])
    assert [a.mean_oracle for a in arms] == pytest.approx([2.5, 2.75, 4.25])


def test_router_saving_at_its_operating_point_as_a_share_of_the_ceilings() -> None:
    best = ceiling(OUTCOMES, BAD, BASE)
    # Params x tokens: Level-1 5, Level-2 100, baseline 500.  The ceiling's line from k=0 (120, quality
    # 3.1 / 3.6) to k=1 (b escalated: 220, 3.7 / 3.6) reaches quality 1 five sixths of the way: 203.33, saving
    # 1 - 203.33 / 500 = .5933, more than its point at b (.56).
    assert best_saving_at(best, 1.0) == pytest.approx(0.56)
    assert ceiling_saving_at(best, 1.0) == pytest.approx(1 - (120 + 100 * 5 / 6) / 500)
    served = compare(evaluate("served", OUTCOMES, {"b"}, BAD), BASE)
    assert share_of_ceiling_saving(served, best, 1.0) == pytest.approx(0.56 / (1 - (120 + 100 * 5 / 6) / 500))
    # b and c escalated: 320 (saving .36) at quality 3.6 / 3.6.
    both = compare(evaluate("served", OUTCOMES, {"b", "c"}, BAD), BASE)
    assert share_of_ceiling_saving(both, best, 1.0) == pytest.approx(0.36 / (1 - (120 + 100 * 5 / 6) / 500))
    # Escalating nothing saves most but falls short of the quality (3.1 / 3.6): no share.
    nothing = compare(evaluate("served", OUTCOMES, set(), BAD), BASE)
    assert share_of_ceiling_saving(nothing, best, 1.0) == 0.0
    # Nothing reaches 1.1: there is no ceiling saving to take a share of.
    assert share_of_ceiling_saving(served, best, 1.1) is None


def test_the_route_llm_curve_spans_every_call_from_weak_to_strong() -> None:
    # e is cautious; its unrouted Level-1 answer scores 2.  All at Level-1: 4 + 1 + 2 + 3.5 + 2 = 12.5 (2.5).
    # The router escalates e first (+3 -> 3.1), then by RM score b (+3 -> 3.7), c (-.5), d (-.5), a (+.5 -> 3.6).
    outcomes = [*OUTCOMES[:4], PromptOutcome("e", None, OUTCOMES[4].level2, unrouted_level1=Answer(2.0, 0.0, 0, 0))]
    points = route_llm_curve(outcomes)
    assert [s for s, _ in points] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert [q for _, q in points] == pytest.approx([2.5, 3.1, 3.7, 3.6, 3.5, 3.6])
    # RouteLLM's APGR: (trapezoid area of quality over the calls axis - weak) / (strong - weak), the area
    # .2 * (2.8 + 3.4 + 3.65 + 3.55 + 3.55) = 3.39 -> (3.39 - 2.5) / 1.1.
    assert apgr(points, 2.5, 3.6) == pytest.approx((3.39 - 2.5) / 1.1)
    # Equal RM scores move together, as one threshold passes them.
    tied = [PromptOutcome(h, Answer(1.0, 0.5, 0, 0), Answer(3.0, 0.5, 0, 0)) for h in "xyz"]
    tied[2] = PromptOutcome("z", Answer(1.0, 0.7, 0, 0), Answer(3.0, 0.5, 0, 0))
    assert [x for point in route_llm_curve(tied) for x in point] == pytest.approx([0, 1, 2 / 3, 7 / 3, 1, 3])
    with pytest.raises(ValueError, match="cautious"):
        route_llm_curve(OUTCOMES)


def test_expected_scores_replace_level2s_luck_and_start_the_axis() -> None:
    expected = {h: ExpectedScores(3.5, 4) for h in "abcd"} | {"e": ExpectedScores(3.5, 4, level1=1.5)}
    scored = with_expected(OUTCOMES, expected)
    assert all(o.level2.oracle == 3.5 for o in scored)
    # The Level-1 answers stay the ones the router saw and scored; costs stay the live ones.
    assert [o.level1 for o in scored[:4]] == [o.level1 for o in OUTCOMES[:4]]
    assert [o.level2.param_tokens for o in scored] == [o.level2.param_tokens for o in OUTCOMES]
    unrouted = scored[4].unrouted_level1  # the cautious prompt's Level-1 answer exists only to measure
    assert scored[4].level1 is None and unrouted is not None
    assert (unrouted.oracle, unrouted.device_seconds, unrouted.param_tokens) == (1.5, 0.0, 0.0)
    # All at Level-1: 4 + 1 + 2 + 3.5 + 1.5 = 12 over 5.
    assert route_llm_curve(scored)[0] == (0.0, pytest.approx(2.4))
    with pytest.raises(ValueError, match="no expected scores"):
        with_expected(OUTCOMES, {"a": expected["a"]})
    with pytest.raises(ValueError, match="no expected scores"):  # a cautious prompt needs its Level-1 mean
        with_expected(OUTCOMES, {**expected, "e": ExpectedScores(3.5, 4)})


def test_the_ceilings_saving_is_read_off_its_line_which_bounds_every_router() -> None:
    # a gains 10 for 10 params x tokens, b 1 for .5, c nothing for 10; Level-1 costs 1 each, baseline 20.5.
    outcomes = [PromptOutcome("a", Answer(0.0, 0.1, 0, 1.0), Answer(10.0, 0.0, 0, 10.0)),
                PromptOutcome("b", Answer(0.0, 0.2, 0, 1.0), Answer(1.0, 0.0, 0, 0.5)),
                PromptOutcome("c", Answer(5.0, 0.3, 0, 1.0), Answer(5.0, 0.0, 0, 10.0))]
    base = all_level2(outcomes, BAD)
    best = ceiling(outcomes, BAD, base)
    target = 15.5 / 16  # escalating a alone reaches quality 15 / 16 of all-Level-2's 16: not enough here
    served = compare(evaluate("served", outcomes, {"a"}, BAD), base)
    # The greedy order (b, then a) overshoots: its point after a saves 1 - 13.5 / 20.5, but the line between
    # the points reaches the target for less; the points alone would let a router beat the "ceiling".
    line = ceiling_saving_at(best, target)
    assert line is not None and line >= best_saving_at(best, target)  # type: ignore[operator]
    assert share_of_ceiling_saving(served, best, 15 / 16) <= 1.0  # type: ignore[operator]
    for k in ("a", "b", "c", "ab", "ac", "bc", "abc"):
        arm = compare(evaluate(k, outcomes, set(k), BAD), base)
        reached = ceiling_saving_at(best, arm.quality_ratio)  # type: ignore[arg-type]
        assert reached is not None and arm.param_token_saving <= reached + 1e-12, k  # type: ignore[operator]


def test_pgr_apgr_cpt_linear_and_concave() -> None:
    linear = [(0.0, 1.0), (0.5, 2.0), (1.0, 3.0)]
    assert pgr(2.5, 1.0, 3.0) == pytest.approx(0.75)
    assert apgr(linear, 1.0, 3.0) == pytest.approx(0.5)
    assert cpt(linear, 1.0, 3.0, 0.5) == pytest.approx(0.5)
    assert cpt(linear, 1.0, 3.0, 0.8) == pytest.approx(0.8)
    assert cpt(linear, 1.0, 3.0, 0.0) == pytest.approx(0.0)
    assert cpt(linear, 1.0, 3.0, 1.01) is None
    # Unsorted, with a worse duplicate at share .5 that must be dropped: still the linear curve.
    assert apgr([(1.0, 3.0), (0.5, 2.0), (0.0, 1.0), (0.5, 1.5)], 1.0, 3.0) == pytest.approx(0.5)
    # Concave: PGR 0, .75, 1 -> (.375 + .875) / 2 = .625.
    concave = [(0.0, 1.0), (0.5, 2.5), (1.0, 3.0)]
    assert apgr(concave, 1.0, 3.0) == pytest.approx(0.625)
    # PGR .75 reached at .5; .8 is 1/5 of the way from .75 to 1 -> .5 + .2 * .5 = .6.
    assert cpt(concave, 1.0, 3.0, 0.8) == pytest.approx(0.6)
    # Shares starting at the cautious share: the average is over [.2, 1], not [0, 1].
    assert apgr([(0.2, 1.0), (1.0, 3.0)], 1.0, 3.0) == pytest.approx(0.5)


def test_value_errors() -> None:
    with pytest.raises(ValueError):
        evaluate("x", [], set(), BAD)
    with pytest.raises(ValueError, match="zz"):
        evaluate("x", OUTCOMES, {"b", "zz"}, BAD)
    with pytest.raises(ValueError):
        evaluate("x", [*OUTCOMES, OUTCOMES[0]], set(), BAD)
    with pytest.raises(ValueError):
        all_level2([], BAD)
    with pytest.raises(ValueError):
        pgr(2.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        apgr([(0.5, 1.0), (0.5, 2.0)], 1.0, 3.0)
    with pytest.raises(ValueError):
        cpt([], 1.0, 3.0, 0.5)


def test_compare_with_zero_baseline() -> None:
    zero = ArmFigures("z", 1, 0.0, 0.0, 0.0, 0.0, 1.0, None, None)
    arm = compare(evaluate("b up", OUTCOMES, {"b"}, BAD), zero)
    assert (arm.saving, arm.param_token_saving, arm.quality_ratio) == (None, None, None)
    assert arm.device_seconds == pytest.approx(80.0)


def test_plot_curve_writes_png(tmp_path) -> None:
    arms = sweep(OUTCOMES, BAD, BASE)
    marks = {
        "tiered": compare(evaluate("tiered", OUTCOMES, {"b"}, BAD), BASE),
        "random router": random_router_figures(OUTCOMES, 0.4, BAD, BASE, seeds=10),
        "oracle router": compare(evaluate("oracle", OUTCOMES, oracle_router(OUTCOMES, BAD), BAD), BASE),
        "all-Level-2": compare(BASE, BASE),
    }
    path = tmp_path / "curve.png"
    plot_curve(path, arms, marks)
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 1000
    with pytest.raises(ValueError, match="compare"):
        plot_curve(tmp_path / "x.png", arms, {"raw": BASE})
