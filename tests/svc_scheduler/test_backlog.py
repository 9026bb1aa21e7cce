"""The door's shedding rule and drain rate on constructed readings (no Kafka: svc_scheduler/backlog.py is pure
but for its reading loop, which the service test drives against a real broker)."""

from __future__ import annotations

import math
import threading

import pytest

from strata.bus.admin import GroupPosition
from svc_scheduler.backlog import BacklogGauge, DrainRate, StageReading, shed_decision
from svc_scheduler.config import SchedulerSettings


def test_a_tier_sheds_when_its_queue_would_keep_a_new_prompt_past_the_bound() -> None:
    generator = StageReading("svc-generator-l1", "strata.prompts.level1", lag=600, rate=5.0)  # 120 s of work
    reward = StageReading("svc-reward", "strata.rollouts.generated", lag=100, rate=50.0)  # 2 s
    shed = shed_decision([reward, generator], bound_s=60.0, min_backlog=64, max_retry_after_s=60.0)
    assert shed is not None and shed.stage is generator
    # Back under the bound once 600 - 5 * 60 = 300 events have drained: 60 s at 5 a second.
    assert shed.retry_after_s == pytest.approx(60.0)
    assert "svc-generator-l1 has 600 events queued" in shed.message() and "retry in 60.0 s" in shed.message()
    assert shed_decision([reward], 60.0, 64, 60.0) is None
    assert shed_decision([generator], 0.0, 64, 60.0) is None  # 0: shedding off


def test_the_hint_is_when_the_queue_is_back_under_the_bound_clamped() -> None:
    just_over = StageReading("g", "t", lag=310, rate=5.0)  # 62 s: 2 s to drain to the bound
    assert shed_decision([just_over], 60.0, 64, 30.0).retry_after_s == pytest.approx(2.0)
    barely = StageReading("g", "t", lag=301, rate=5.0)  # 0.2 s, hinted at no less than a second
    assert shed_decision([barely], 60.0, 64, 30.0).retry_after_s == 1.0
    far = StageReading("g", "t", lag=10_000, rate=5.0)
    assert shed_decision([far], 60.0, 64, 30.0).retry_after_s == 30.0


def test_a_stalled_tier_sheds_only_past_the_minimum_backlog() -> None:
    stalled = StageReading("g", "t", lag=64, rate=0.0)
    assert math.isinf(stalled.wait_s)
    shed = shed_decision([stalled], 60.0, 64, 45.0)
    assert shed is not None and shed.retry_after_s == 45.0 and "nothing draining" in shed.message()
    # An idle tier's first events have no measured rate yet: under the minimum they refuse nothing.
    assert shed_decision([StageReading("g", "t", lag=63, rate=None)], 60.0, 64, 45.0) is None
    assert StageReading("g", "t", lag=0, rate=None).wait_s == 0.0


def test_the_worst_tier_is_named() -> None:
    slow = StageReading("svc-generator-l2", "t2", lag=1000, rate=2.0)  # 500 s
    slower = StageReading("svc-probe", "t0", lag=900, rate=1.0)  # 900 s
    assert shed_decision([slow, slower], 60.0, 64, 60.0).stage is slower


def test_the_drain_rate_is_the_commits_advance_over_the_window() -> None:
    rate = DrainRate(window_s=10.0)
    assert rate.add(0.0, 100) is None
    assert rate.add(0.5, 105) is None  # under a second of readings
    assert rate.add(2.0, 120) == pytest.approx(10.0)
    for t in range(3, 30):
        last = rate.add(float(t), 120 + 4 * (t - 2))  # now 4 a second
    # The window forgets the first readings: 4 a second, from the newest reading at least 10 s old.
    assert last == pytest.approx(4.0)
    assert rate.points[0][0] == 19.0
    assert rate.add(30.0, 0) is None  # offsets went back (the group was recreated): measured afresh


class ConstructedPositions:
    """Scripted Kafka positions for the gauge's loop; each read advances the clock a second."""

    def __init__(self, clock: list[float], lags: list[int], active: set[str]) -> None:
        self.clock, self.lags, self.groups_active = clock, lags, active
        self.reads = 0
        self.closed = False

    def active(self, groups: list[str]) -> set[str]:
        return self.groups_active & set(groups)

    def positions(self, groups: list[str]) -> dict[tuple[str, str], GroupPosition]:
        lag = self.lags[min(self.reads, len(self.lags) - 1)]
        self.reads += 1
        self.clock[0] += 1.0
        return {(g, "topic"): GroupPosition(committed=0, lag=lag) for g in groups}

    def close(self) -> None:
        self.closed = True


def gauge(clock: list[float], **settings: object) -> BacklogGauge:
    config = SchedulerSettings(backlog_groups="live,gone", backlog_poll_s=0.001, shed_min_backlog=64, **settings)
    return BacklogGauge(config, connect=lambda: None, clock=lambda: clock[0])


def test_the_gauge_sheds_on_fresh_readings_of_groups_with_members_only() -> None:
    clock = [0.0]
    readings = gauge(clock)
    assert readings.shed() is None  # no reading yet
    readings.record({("live", "t"): GroupPosition(0, 500)})
    clock[0] += 2.0
    readings.record({("live", "t"): GroupPosition(0, 500)})  # a second apart, nothing committed: stalled
    shed = readings.shed()
    assert shed is not None and shed.stage.group == "live"
    clock[0] += 60.0  # no reading for a minute (Kafka unreachable): a stale gauge refuses nothing
    assert readings.shed() is None
    assert gauge(clock, shed_backlog_wait_s=0.0).shed() is None

    # The loop drops groups without members ("gone" is not deployed, its lag only grows).
    source = ConstructedPositions(clock, lags=[500, 500, 500], active={"live"})
    looping = gauge(clock)
    looping.connect = lambda: source
    stop = threading.Event()
    original = source.positions

    def positions_then_stop(groups: list[str]) -> dict[tuple[str, str], GroupPosition]:
        if source.reads == 2:
            stop.set()
        return original(groups)

    source.positions = positions_then_stop  # type: ignore[method-assign]
    looping.run(stop)
    assert source.closed and [r.group for r in looping.readings] == ["live"]
    assert looping.shed() is not None
