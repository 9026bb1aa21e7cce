"""The chaos bench's schedule and tally (its pure parts; the run itself is `strata bench chaos`)."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest

from strata_tools.bench.chaos.faults import POISONS, SERVICES, cluster_schedule, schedule
from strata_tools.bench.chaos.outcomes import FinalReward, Outcomes, doubled_batches, rhythm, stalls, tally


def test_the_schedule_has_every_fault_once_in_a_seeded_order() -> None:
    faults = schedule(seed=7, lead_in_s=10, spacing_s=5)
    assert len(faults) >= 12 and len({f.kind for f in faults}) >= 6
    assert sorted(f.target for f in faults if f.kind == "sigkill") == sorted(SERVICES)
    assert sorted(f.target for f in faults if f.kind == "poison") == sorted(POISONS)
    assert [f.at_s for f in faults] == [10 + 5 * i for i in range(len(faults))]
    assert faults == schedule(seed=7, lead_in_s=10, spacing_s=5)
    assert [f.target for f in faults] != [f.target for f in schedule(seed=8, lead_in_s=10, spacing_s=5)]


def test_tally_separates_served_doubled_redelivered_lost_and_stuck() -> None:
    one = FinalReward(0, "r1", 1)
    other = FinalReward(0, "r2", 1)
    finals = {"served": [one], "redelivered": [one, one], "doubled": [one, other], "orphan": [one]}
    result = tally(["served", "redelivered", "doubled", "dead", "quiet"], finals, dead={"dead"}, work_queued=False)
    assert (result.accepted, result.served, result.redelivered) == (5, 2, 1)
    assert (result.doubled, result.lost, result.stuck) == (["doubled"], ["dead", "quiet"], [])
    assert result.served_unacknowledged == 1
    queued = tally(["dead", "quiet"], {}, dead={"dead"}, work_queued=True)
    assert (queued.lost, queued.stuck) == (["dead"], ["quiet"])


def test_a_batch_listed_twice_is_a_double_application() -> None:
    assert doubled_batches(["a", "b", "a", "c"]) == ["a"]
    assert doubled_batches(["a", "b"]) == []


@pytest.mark.integration
def test_outcomes_read_finals_and_dead_letters_from_the_start_of_the_run(infra) -> None:
    from strata.bus import Publisher, topics
    from strata.bus.worker import dead_letter_headers, publish_dead_letter
    from strata.v1 import events_pb2

    since_ms = int(time.time() * 1000)
    request = f"chaos-test-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(infra)
    try:
        final = events_pb2.RewardScored(prompt_hash="a" * 64, response_hash="b" * 64, final=True, request_id=request)
        publisher.publish_and_wait(topics.REWARDS_SCORED, final)
        publisher.publish_and_wait(topics.REWARDS_SCORED, final)  # a redelivery
        forged = events_pb2.PolicyUpdated(policy_version=2**62, checkpoint_path="/etc")
        record = SimpleNamespace(topic=topics.POLICY_UPDATED.name, partition=0, offset=0, key=b"x",
                                 value=forged.SerializeToString())
        publish_dead_letter(publisher, topics.POLICY_UPDATED, record,
                            dead_letter_headers(record, "control", "forged", 1, "test"))
    finally:
        publisher.close()
    outcomes = Outcomes(infra, since_ms)
    outcomes.settle([request], timeout_s=30)
    assert outcomes.finals[request] == [FinalReward(0, "b" * 64, 0)] * 2
    assert outcomes.dead_letters[topics.POLICY_UPDATED.dlq] >= 1


def test_the_cluster_schedule_restarts_what_it_killed_twice_over() -> None:
    faults = cluster_schedule(lead_in_s=20, spacing_s=15)
    assert [f.kind for f in faults] == ["broker-kill", "broker-restart", "primary-kill", "primary-restart"] * 2
    assert [f.at_s for f in faults] == [20 + 15 * i for i in range(8)]


def test_a_stall_is_the_longest_gap_between_final_rewards_until_the_next_fault() -> None:
    finals = [0, 2, 4, 6, 13, 15, 17, 19, 21, 23]  # a reward every 2 s, none from 6 to 13
    faults = [5.0, 14.0]
    assert stalls(finals, faults, end_time=24) == [7.0, 2.0]
    assert rhythm(finals, first_fault=5.0) == 2.0
    # A fault after which no final reward came at all stalls until the window closes.
    assert stalls([0, 2], [3.0], end_time=30) == [28.0]
