"""The critical-path trace on scripted event streams (pure): each second of an update attributed to the
stage the batch's last sample was in, the stages summing to the update's wall time."""

from __future__ import annotations

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from strata.v1 import common_pb2, events_pb2
from strata_tools.trace import STAGES, SampleTimes, UpdateTimes, from_events, trace, trace_update


def test_the_last_sample_of_the_batch_carries_the_wait() -> None:
    previous, update = UpdateTimes(1, 100.0, 2.0, 0.5), UpdateTimes(2, 110.0, 3.0, 1.0)
    samples = [SampleTimes(101.0, 102.0, 104.0, 104.5),   # scored earlier: not the one waited for
               SampleTimes(100.5, 101.5, 104.0, 105.0)]   # the last before training began at 106
    got = trace_update(previous, update, samples)
    assert got.seconds == {"driver": 0.5, "scheduler+probe": 1.0, "generation": 2.5, "reward": 1.0,
                           "batching": 1.0, "training": 3.0, "sync": 1.0}
    assert sum(got.seconds.values()) == pytest.approx(got.wall) == 10.0
    assert got.critical == "training"


def test_what_ran_before_the_previous_version_overlapped_and_costs_nothing() -> None:
    previous, update = UpdateTimes(1, 100.0, 0, 0), UpdateTimes(2, 104.0, 1.0, 0.0)
    # Submitted and routed during the previous update, generated 1 s into this one.
    got = trace_update(previous, update, [SampleTimes(95.0, 97.0, 101.0, 102.0)])
    assert got.seconds["driver"] == got.seconds["scheduler+probe"] == 0.0
    assert (got.seconds["generation"], got.seconds["reward"], got.seconds["batching"]) == (1.0, 1.0, 1.0)
    assert sum(got.seconds.values()) == pytest.approx(4.0)


def test_missing_marks_merge_into_the_next_known_segment_and_an_early_batch_is_all_batching() -> None:
    previous, update = UpdateTimes(1, 0.0, 0, 0), UpdateTimes(2, 10.0, 2.0, 0.0)
    got = trace_update(previous, update, [SampleTimes(None, None, 5.0, 6.0)])
    assert got.seconds["generation"] == 5.0 and got.seconds["driver"] == got.seconds["scheduler+probe"] == 0.0
    empty = trace_update(previous, update, [])
    assert empty.seconds["batching"] == 8.0 and empty.seconds["training"] == 2.0
    # The learner's own seconds exceed the wall (clocks, rounding): the trace still sums to the wall.
    over = trace_update(previous, UpdateTimes(2, 1.0, 3.0, 1.0), [])
    assert sum(over.seconds.values()) == pytest.approx(1.0) and over.seconds["training"] == 1.0


def test_a_run_is_traced_update_by_update_and_named_by_its_largest_stage() -> None:
    updates = [UpdateTimes(v, 10.0 * v, 1.0, 0.0) for v in (1, 2, 3)] + [UpdateTimes(5, 60.0, 1.0, 0.0)]
    samples = [SampleTimes(10.0 * v + 1, 10.0 * v + 2, 10.0 * v + 8, 10.0 * v + 8.5) for v in (1, 2)]
    run = trace(updates, samples)
    assert [u.version for u in run.updates] == [2, 3]  # 3 -> 5 skips a version: not one update
    assert run.critical == "generation" and run.mean_seconds()["generation"] == 6.0
    assert set(run.mean_seconds()) == set(STAGES)
    assert "generation 6.00 s (60%)" in run.line()
    assert "no two consecutive" in trace([], []).line()


def _at(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def test_events_are_joined_into_sample_times() -> None:
    policy = [events_pb2.PolicyUpdated(policy_version=v, published_at=_at(10.0 * v),
                                       metrics={"perf/update_seconds": 2.0, "sync/seconds": 0.5}) for v in (1, 2)]
    routed = [events_pb2.PromptRouted(prompt_hash="p", request_id="r", submitted_at=_at(11.0), routed_at=_at(12.0))]
    rollouts = [events_pb2.RolloutGenerated(response_hash="a", request_id="r", sample_index=0, routed_at=_at(12.0),
                                            generated_at=_at(14.0))]
    rewards = [events_pb2.RewardScored(prompt_hash="p", response_hash="a", request_id="r", sample_index=0,
                                       tier=common_pb2.TIER_LEVEL_1, final=True, generated_at=_at(14.0),
                                       scored_at=_at(15.0)),
               events_pb2.RewardScored(prompt_hash="p", response_hash="b", request_id="r", sample_index=1,
                                       tier=common_pb2.TIER_LEVEL_1, final=False, scored_at=_at(16.0))]  # escalated
    updates, samples = from_events(policy, rewards, rollouts, routed)
    assert updates == [UpdateTimes(1, 10.0, 2.0, 0.5), UpdateTimes(2, 20.0, 2.0, 0.5)]
    assert samples == [SampleTimes(11.0, 12.0, 14.0, 15.0)]
