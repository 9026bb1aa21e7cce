"""The kafka-python work-around (strata/bus/kafka_fixes.py): installed once, by importing the bus, for the
3.0 releases it was checked against; and what it does with a join round that finished while no poll was
waiting, on a coordinator stand-in. Against the broker: tests/integration/test_bus.py (short polls)."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import kafka
import pytest
from kafka import errors
from kafka.coordinator.base import BaseCoordinator
from kafka.coordinator.consumer import ConsumerCoordinator
from kafka.future import Future
from kafka.structs import MemberState

import strata.bus  # noqa: F401  (installs the work-around)
from strata.bus import kafka_fixes


def test_importing_the_bus_installs_the_work_around_once_for_the_checked_release() -> None:
    assert kafka.__version__.startswith("3.0."), "a new kafka-python: check kafka_fixes.py against it first"
    need_rejoin, join = ConsumerCoordinator.need_rejoin, BaseCoordinator.join_group_async
    assert getattr(need_rejoin, kafka_fixes._PATCHED_MARK, False)
    assert getattr(join, kafka_fixes._PATCHED_MARK, False)
    assert kafka_fixes.apply() is True
    assert ConsumerCoordinator.need_rejoin is need_rejoin
    assert BaseCoordinator.join_group_async is join


@dataclass
class Generation:
    generation_id: int = 7
    member_id: str = "m-1"
    protocol: str | None = "range"


@dataclass
class Coordinator:
    """The attributes of a ConsumerCoordinator the work-around reads and writes."""

    _join_task: Any = None
    state: MemberState = MemberState.REBALANCING
    _generation: Generation = field(default_factory=Generation)
    rejoining: bool = True
    rejoin_needed: bool = False
    heartbeat_enabled: bool = False
    completed: list[tuple] = field(default_factory=list)
    group_id: str = "g"
    _lock: Any = field(default_factory=threading.Lock)

    def _enable_heartbeat(self) -> None:
        self.heartbeat_enabled = True

    def request_rejoin(self) -> None:
        self.rejoin_needed = True

    async def _on_join_complete_async(self, generation: int, member: str, protocol: str, assignment: bytes) -> None:
        self.completed.append((generation, member, protocol, assignment))


def finished(value: bytes | None = None, error: BaseException | None = None) -> Future:
    future = Future()
    if error is None:
        future.success(value)
    else:
        future.failure(error)
    return future


def test_a_round_that_finished_unwatched_is_applied_with_the_loops_steps() -> None:
    coordinator = Coordinator(_join_task=finished(b"assignment"))
    asyncio.run(kafka_fixes.apply_finished_round(coordinator))
    assert coordinator.completed == [(7, "m-1", "range", b"assignment")]
    assert coordinator._join_task is None and coordinator.state is MemberState.STABLE
    assert coordinator.heartbeat_enabled and not coordinator.rejoining and not coordinator.rejoin_needed


def test_a_round_in_flight_is_left_to_the_loop_and_keeps_the_member_rejoining() -> None:
    pending = Future()
    coordinator = Coordinator(_join_task=pending)
    asyncio.run(kafka_fixes.apply_finished_round(coordinator))
    assert coordinator._join_task is pending and coordinator.completed == []
    # While it is in flight the consumer must come back for it: need_rejoin says so whatever the snapshots.
    assert ConsumerCoordinator.need_rejoin(coordinator) is True


@pytest.mark.parametrize("error", [errors.UnknownMemberIdError(), errors.RebalanceInProgressError(),
                                   errors.KafkaTimeoutError()])
def test_a_round_that_failed_for_membership_or_a_retriable_error_asks_for_another(error: BaseException) -> None:
    coordinator = Coordinator(_join_task=finished(error=error))
    asyncio.run(kafka_fixes.apply_finished_round(coordinator))
    assert coordinator._join_task is None and coordinator.rejoin_needed and coordinator.completed == []


def test_a_round_that_failed_otherwise_raises_as_the_loop_would() -> None:
    coordinator = Coordinator(_join_task=finished(error=errors.GroupAuthorizationFailedError()))
    with pytest.raises(errors.GroupAuthorizationFailedError):
        asyncio.run(kafka_fixes.apply_finished_round(coordinator))
    assert coordinator._join_task is None and coordinator.completed == []


def test_a_round_that_finished_after_the_member_left_is_dropped() -> None:
    left = Coordinator(_join_task=finished(b"stale"), state=MemberState.UNJOINED,
                       _generation=Generation(-1, "", None))
    asyncio.run(kafka_fixes.apply_finished_round(left))
    assert left.completed == [] and left.rejoin_needed and left.state is MemberState.UNJOINED
