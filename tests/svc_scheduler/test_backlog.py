"""The door's shedding rule and drain rate on constructed readings (no Kafka: svc_scheduler/backlog.py is pure
but for its reading loop, which the service test drives against a real broker)."""

from __future__ import annotations

import math
import threading

import pytest

from strata.bus.admin import GroupPosition
from svc_generator.config import GeneratorSettings
from svc_probe.config import ProbeSettings
from svc_reward.config import RewardSettings
from svc_scheduler.backlog import STAGE_NAMES, BacklogGauge, DrainRate, StageReading, shed_decision
from svc_scheduler.config import SchedulerSettings


def test_a_tier_sheds_when_its_queue_would_keep_a_new_prompt_past_the_bound() -> None:
    generator = StageReading("svc-generator-l1", "strata.prompts.level1", lag=600, rate=5.0)  # 120 s of work
    reward = StageReading("svc-reward", "strata.rollouts.generated", lag=100, rate=50.0)  # 2 s
    shed = shed_decision([reward, generator], bound_s=60.0, min_backlog=64, max_retry_after_s=60.0)
    assert shed is not None and shed.stage is generator
    # Back under the bound once 600 - 5 * 60 = 300 events have drained: 60 s at 5 a second.
    assert shed.retry_after_s == pytest.approx(60.0)
    assert "Level-1 generation has 600 prompts queued" in shed.message() and "retry in 60.0 s" in shed.message()
    # The client reads stages; the operator's log reads the deployment's groups and topics.
    assert "svc-generator-l1" not in shed.message() and "strata.prompts" not in shed.message()
    assert "group svc-generator-l1 has 600 events queued on strata.prompts.level1" in shed.detail()
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
    assert shed_decision([StageReading("g", "t", lag=63, rate=0.0)], 60.0, 64, 45.0) is None
    # A rate not measured yet is not a stall: however long the queue, it refuses nothing.
    assert shed_decision([StageReading("g", "t", lag=10_000, rate=None)], 60.0, 64, 45.0) is None


def test_the_worst_tier_is_named() -> None:
    slow = StageReading("svc-generator-l2", "t2", lag=1000, rate=2.0)  # 500 s
    slower = StageReading("svc-probe", "t0", lag=900, rate=1.0)  # 900 s
    assert shed_decision([slow, slower], 60.0, 64, 60.0).stage is slower


def test_the_drain_rate_is_the_commits_advance_over_the_busy_window() -> None:
    rate = DrainRate(window_s=10.0)
    assert rate.add(0.0, 100, lag=50) is None
    assert rate.add(4.0, 140, lag=50) is None  # a busy spell under 5 s: not measured yet
    assert rate.add(5.0, 150, lag=50) == pytest.approx(10.0)
    for t in range(6, 30):
        last = rate.add(float(t), 150 + 4 * (t - 5), lag=50)  # now 4 a second
    # The window forgets the first readings: 4 a second, from the newest reading at least 10 s old.
    assert last == pytest.approx(4.0)
    assert rate.points[0][0] == 19.0
    assert rate.add(30.0, 0, lag=50) is None  # offsets went back (the group was recreated): measured afresh


def test_a_burst_after_an_idle_spell_is_judged_by_its_busy_seconds_only() -> None:
    # Idle for a minute, then 5 000 events draining at 100 a second: 50 s of work, under a 60 s bound.
    rate = DrainRate(window_s=30.0)
    for t in range(60):
        assert rate.add(float(t), 1000, lag=0) is None
    committed, queued, arrived_at = 1000, 5000, 60.5
    for t in range(61, 90):
        done = min(queued, round(100 * (t - arrived_at)))
        reading = StageReading("g", "t", lag=queued - done, rate=rate.add(float(t), committed + done, queued - done))
        assert shed_decision([reading], 60.0, 64, 60.0) is None, (t, reading)
    # A tier that commits nothing: unknown for a whole window, then stalled.
    stuck = DrainRate(window_s=30.0)
    assert all(stuck.add(float(t), 7, lag=500) is None for t in range(30))
    assert stuck.add(30.0, 7, lag=500) == 0.0


class ConstructedPositions:
    """Scripted Kafka positions for the gauge's loop: per read the groups with members and the lag of every
    group; each read advances the clock 5 s."""

    def __init__(self, clock: list[float], reads: list[tuple[set[str], int]]) -> None:
        self.clock, self.script = clock, reads
        self.reads = 0
        self.closed = False

    def active(self, groups: list[str]) -> set[str]:
        return self.script[min(self.reads, len(self.script) - 1)][0] & set(groups)

    def positions(self, groups: list[str]) -> dict[tuple[str, str], GroupPosition]:
        lag = self.script[min(self.reads, len(self.script) - 1)][1]
        self.reads += 1
        self.clock[0] += 5.0
        return {(g, "topic"): GroupPosition(committed=0, lag=lag) for g in groups}

    def close(self) -> None:
        self.closed = True


def gauge(clock: list[float], **settings: object) -> BacklogGauge:
    config = SchedulerSettings(backlog_groups="live,gone", backlog_poll_s=0.001, shed_min_backlog=64,
                               backlog_window_s=10.0, **settings)
    return BacklogGauge(config, connect=lambda: None, clock=lambda: clock[0])


def test_the_gauge_sheds_on_fresh_readings_of_groups_with_members_only() -> None:
    clock = [0.0]
    readings = gauge(clock)
    assert readings.shed() is None  # no reading yet
    readings.record({("live", "t"): GroupPosition(0, 500)})
    clock[0] += 10.0
    readings.record({("live", "t"): GroupPosition(0, 500)})  # a whole window, nothing committed: stalled
    shed = readings.shed()
    assert shed is not None and shed.stage.group == "live"
    clock[0] += 60.0  # no reading for a minute (Kafka unreachable): a stale gauge refuses nothing
    assert readings.shed() is None
    assert gauge(clock, shed_backlog_wait_s=0.0).shed() is None

    # The loop counts a group with members now or lately: "live" loses its member (a crash loop) at the third
    # read and still counts; "gone" was never seen with one (not deployed, its lag only grows) and never does.
    source = ConstructedPositions(clock, [({"live"}, 500), ({"live"}, 500), (set(), 500)])
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
    assert looping.shed() is not None  # stalled for a whole window (10 s over three reads)
    clock[0] += looping.settings.backlog_member_grace_s + 1
    assert looping.counted(set()) == set()  # past the grace without members: no longer counted


def test_a_jittered_hint_stretches_the_wait_and_says_so() -> None:
    shed = shed_decision([StageReading("g", "t", lag=600, rate=5.0)], 60.0, 64, 60.0)
    assert shed is not None
    later = shed.jittered(0.25)
    assert later.retry_after_s == pytest.approx(75.0) and "retry in 75.0 s" in later.message()
    assert shed.retry_after_s == pytest.approx(60.0)  # the gauge's reading is shared: never changed in place


def test_the_watched_groups_and_their_stage_names_are_the_services_defaults() -> None:
    defaults = [ProbeSettings().group_id, GeneratorSettings(tier=1).consumer_group,
                GeneratorSettings(tier=2).consumer_group, RewardSettings().group_id]
    assert SchedulerSettings().backlog_groups.split(",") == defaults
    assert list(STAGE_NAMES) == defaults
