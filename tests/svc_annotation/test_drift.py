import math
import random

import pytest

from svc_annotation.drift import (
    Agreement,
    AnnotatorState,
    DriftSettings,
    DriftTracker,
    Observation,
    acknowledge,
    agreement,
    cusum_step,
    item_observations,
    observe,
    snapshot,
)

DEFAULTS = DriftSettings()


def gold_obs(item: int, score: float, gold: float, annotator: str = "ann") -> Observation:
    return Observation(annotator, f"item-{item}", score, gold=gold)


def noisy(rng: random.Random, gold: float, bias: float = 0.0) -> float:
    """A SimulatedAnnotator-like score: noise sd 0.3, rounded to 0.5, clipped to 0-5."""
    return min(5.0, max(0.0, round((gold + bias + rng.gauss(0.0, 0.3)) * 2) / 2))


def test_agreement_table() -> None:
    # differences 0.5, -0.5, 1.0, 0.0: mean 0.25, mean |.| 0.5, within 0.5: three of four.
    assert agreement([0.5, -0.5, 1.0, 0.0], tolerance=0.5) == Agreement(4, 0.25, 0.5, 0.75)
    assert agreement([0.5, -0.5, 1.0, 0.0], tolerance=0.0) == Agreement(4, 0.25, 0.5, 0.25)
    assert agreement([], tolerance=0.5) == Agreement(0, None, None, None)


def test_cusum_step_hand_computed() -> None:
    # k = 0.15, residuals winsorized to +-1.0.
    up, down = cusum_step(0.0, 0.0, 0.5, DEFAULTS)
    assert (up, down) == pytest.approx((0.35, 0.0))
    up, down = cusum_step(up, down, -3.0, DEFAULTS)  # a misclick counts as -1.0
    assert (up, down) == pytest.approx((0.0, 0.85))
    assert cusum_step(0.0, 0.0, 0.1, DEFAULTS) == (0.0, 0.0)  # within the slack: no evidence either way


def test_snapshot_figures_against_each_reference() -> None:
    tracker = DriftTracker(DriftSettings(agreement_tolerance=0.5))
    tracker.observe(Observation("ann", "a", 4.0, gold=3.5, model_reward=4.0, peer_scores=(3.0,)))
    tracker.observe(Observation("ann", "b", 2.0, gold=2.5, model_reward=1.0))
    tracker.observe(Observation("ann", "c", 3.0, model_reward=3.5, peer_scores=(3.0, 4.0)))
    snap = tracker.snapshot("ann")
    # gold: +0.5, -0.5 -> bias 0, mae 0.5, both within 0.5
    assert (snap.gold.n, snap.gold.bias, snap.gold.mae, snap.gold.within) == (2, 0.0, 0.5, 1.0)
    # model: 0, +1, -0.5 -> bias 1/6, mae 0.5, within 2/3
    assert snap.model.n == 3
    assert snap.model.bias == pytest.approx(1 / 6)
    assert snap.model.mae == pytest.approx(0.5)
    assert snap.model.within == pytest.approx(2 / 3)
    # peers: +1, 0, -1 -> bias 0, mae 2/3, within 1/3
    assert (snap.peers.n, snap.peers.bias) == (3, 0.0)
    assert snap.peers.mae == pytest.approx(2 / 3)
    assert snap.peers.within == pytest.approx(1 / 3)
    assert (snap.items, snap.gold_items, snap.window_items) == (3, 2, 3)


def test_not_judged_without_enough_gold_is_not_fine() -> None:
    tracker = DriftTracker()
    assert tracker.snapshot("nobody").status == "not_judged"
    for i in range(50):
        tracker.observe(Observation("ann", f"r{i}", 3.0, model_reward=3.0))
    snap = tracker.snapshot("ann")
    assert snap.status == "not_judged" and not snap.judged
    assert snap.gold.bias is None and math.isnan(snap.gauges()["gold_bias"])
    for i in range(DEFAULTS.min_gold_items):
        tracker.observe(gold_obs(i, 3.0, 3.0))
    assert tracker.snapshot("ann").status == "ok"


def test_window_slides_over_the_latest_items() -> None:
    settings = DriftSettings(window_items=3, min_gold_items=1)
    state = AnnotatorState("ann")
    for i, residual in enumerate([1.0, 1.0, 0.0, 0.0, 0.0]):
        state = observe(state, gold_obs(i, 2.0 + residual, 2.0), settings)
    snap = snapshot(state, settings)
    assert [r.item for r in state.window] == [2, 3, 4]
    assert (snap.window_items, snap.gold.n, snap.gold.bias) == (3, 3, 0.0)
    assert (snap.items, snap.gold_items) == (5, 5)  # totals keep counting


def test_no_alarm_under_pure_noise_over_a_long_run() -> None:
    # 2,000 gold items (20,000 items at a 10% gold share). Measured on such residuals: one false
    # alarm per ~20,000 gold items at the default settings.
    rng = random.Random(0)
    tracker = DriftTracker()
    for i in range(2000):
        gold = round(rng.uniform(0.0, 5.0) * 2) / 2
        tracker.observe(gold_obs(i, noisy(rng, gold), gold))
    snap = tracker.snapshot("ann")
    assert snap.status == "ok" and not snap.alarm
    assert abs(snap.gold.bias or 0.0) < 0.1


@pytest.mark.parametrize(("shift", "kind"), [(0.4, "drift_up"), (-0.4, "drift_down")])
def test_a_shift_of_0_4_is_flagged_within_a_bounded_delay(shift: float, kind: str) -> None:
    # Measured: a +-0.4 step is flagged after a median of ~11 gold items (p95 ~22).
    start, bound = 300, 40
    for seed in range(5):
        rng = random.Random(seed)
        tracker = DriftTracker()
        for i in range(start + bound):
            gold = round(rng.uniform(0.5, 4.5) * 2) / 2
            state = tracker.observe(gold_obs(i, noisy(rng, gold, shift if i >= start else 0.0), gold))
            if state.alarm is not None:
                break
        assert state.alarm is not None, f"seed {seed}: no alarm {bound} gold items after the shift"
        assert state.alarm.kind == kind
        assert start <= state.alarm.since_item < start + bound


def test_one_misclick_does_not_raise_the_alarm() -> None:
    tracker = DriftTracker()
    for i in range(20):
        tracker.observe(gold_obs(i, 3.0, 3.0))
    state = tracker.observe(gold_obs(20, 0.0, 5.0))  # a 0 for a gold 5: winsorized to -1.0
    assert state.alarm is None
    assert state.cusum_down == pytest.approx(1.0 - DEFAULTS.cusum_slack)


def test_the_cusum_waits_for_min_gold_items() -> None:
    tracker = DriftTracker()
    for i in range(DEFAULTS.min_gold_items - 1):  # +1 each: the up arm passes 3.0 at the 4th
        assert tracker.observe(gold_obs(i, 4.0, 3.0)).alarm is None
    alarm = tracker.observe(gold_obs(9, 4.0, 3.0)).alarm
    assert alarm is not None and (alarm.kind, alarm.since_item) == ("drift_up", 9)
    assert alarm.statistic == pytest.approx(10 * 0.85)


def test_careless_but_unbiased_annotator_raises_disagreement() -> None:
    tracker = DriftTracker()
    state = None
    for i in range(DEFAULTS.min_gold_items):  # residuals +0.8, -0.8, ...: the CUSUM arms stay at 0.65
        state = tracker.observe(gold_obs(i, 3.0 + (0.8 if i % 2 == 0 else -0.8), 3.0))
    assert state is not None and state.alarm is not None
    assert (state.alarm.kind, state.alarm.since_item) == ("disagreement", 9)
    assert state.alarm.statistic == pytest.approx(0.8)


def test_an_alarm_latches_until_acknowledged() -> None:
    tracker = DriftTracker()
    for i in range(10):
        tracker.observe(gold_obs(i, 4.0, 3.0))
    for i in range(10, 30):
        tracker.observe(gold_obs(i, 3.0, 3.0))  # good again: the alarm stays
    snap = tracker.snapshot("ann")
    assert (snap.status, snap.alarm_since) == ("drift_up", 9)
    snap = tracker.acknowledge("ann")
    assert (snap.status, snap.alarm, snap.cusum_up, snap.items) == ("not_judged", False, 0.0, 30)
    assert acknowledge(tracker.state("ann")) == tracker.state("ann")


def test_item_observations_make_annotators_each_others_peers() -> None:
    a, b = item_observations("x", {"a": 4.0, "b": 3.0}, gold=None, model_reward=3.5)
    assert (a.annotator, a.peer_scores, a.model_reward) == ("a", (3.0,), 3.5)
    assert (b.annotator, b.peer_scores) == ("b", (4.0,))


@pytest.mark.parametrize("bad", [5.5, -0.1, math.nan])
def test_scores_off_the_scale_are_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        Observation("ann", "x", bad)
    with pytest.raises(ValueError):
        Observation("ann", "x", 3.0, gold=bad)


def test_a_state_refuses_another_annotators_observation() -> None:
    with pytest.raises(ValueError):
        observe(AnnotatorState("a"), Observation("b", "x", 3.0), DEFAULTS)


def test_gauges_are_flat_floats() -> None:
    tracker = DriftTracker()
    tracker.observe(gold_obs(0, 3.5, 3.0))
    gauges = tracker.snapshot("ann").gauges()
    assert gauges["gold_bias"] == 0.5 and gauges["judged"] == 0.0 and gauges["alarm"] == 0.0
    assert math.isnan(gauges["peers_bias"])
    assert all(isinstance(v, float) for v in gauges.values())
