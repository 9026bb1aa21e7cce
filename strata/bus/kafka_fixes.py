"""A work-around for a kafka-python 3.0 bug that leaves a consumer-group member assigned nothing.

``BaseCoordinator.join_group_async`` runs each JoinGroup -> SyncGroup round as a task. When the
caller's ``poll(timeout_ms=...)`` runs out first, the task is left in flight and the next poll is
meant to pick up its result. It only looks while ``need_rejoin()`` is true, and a rejoin started
because the group's metadata changed (a topic gained partitions; or, on a busy machine, the first
metadata arrived while the first join was in flight) stops being needed inside the task itself,
when the leader records its new assignment snapshot. The finished round is then never applied:
the member keeps no partitions (all were revoked for the rebalance) and sends no heartbeats, so the
coordinator evicts it and nothing tells it to rejoin. The Worker polls in short slices, so on a
loaded machine the window is hit (tests/integration/test_bus.py reproduces it every time with a
partition increase and 1 ms polls). Present in 3.0.12 and in upstream master (2026-08).

The fix: a round in flight or finished keeps ``need_rejoin()`` true until it is applied, so the next
poll comes back for it; a finished round is applied before the library's loop runs, with the same
steps the loop takes when it awaits the round itself (the loop would send a new JoinGroup instead).
A failed round is handled as the loop handles one it sees: a membership or retriable error asks for
a new round, any other error is raised. A round that finished after the member left the group is
dropped. Installed for kafka-python 3.0.x only (``pyproject.toml`` pins ``<3.1``): a new minor release
is checked again before it is allowed (tests/strata/test_kafka_fixes.py fails until then).
"""

from __future__ import annotations

import logging
from typing import Any

import kafka
from kafka import errors
from kafka.coordinator.base import BaseCoordinator
from kafka.coordinator.consumer import ConsumerCoordinator
from kafka.structs import MemberState

log = logging.getLogger(__name__)

_PATCHED_MARK = "_strata_applies_finished_join"


# Errors the library's join loop answers with a new round (base.py, ``join_group_async``).
MEMBERSHIP_ERRORS = (errors.UnknownMemberIdError, errors.RebalanceInProgressError, errors.IllegalGenerationError,
                     errors.MemberIdRequiredError, errors.RetriableError)


async def apply_finished_round(coordinator: Any) -> None:
    """Apply (or drop, or raise) a join round that finished while no poll was waiting for it."""
    task = getattr(coordinator, "_join_task", None)
    if task is None or not task.is_done:
        return
    coordinator._join_task = None
    group = getattr(coordinator, "group_id", "?")
    if task.failed():
        if not isinstance(task.exception, MEMBERSHIP_ERRORS):
            raise task.exception
        log.info("group %s: a join round failed after its poll gave up (%s); joining again", group,
                 type(task.exception).__name__)
        coordinator.request_rejoin()
        return
    generation = coordinator._generation
    if coordinator.state is not MemberState.REBALANCING or generation.protocol is None:
        # The member left or reset its generation meanwhile: the round's assignment is void.
        log.info("group %s: dropping a join round that finished after the member left", group)
        coordinator.request_rejoin()
        return
    with coordinator._lock:
        coordinator.rejoining = False
        coordinator.rejoin_needed = False
        coordinator.state = MemberState.STABLE
        coordinator._enable_heartbeat()
    log.info("group %s: applying a join round that finished after its poll gave up", group)
    await coordinator._on_join_complete_async(generation.generation_id, generation.member_id,
                                              generation.protocol, task.value)


def apply() -> bool:
    """Patch kafka-python's group coordinator once. False (nothing changed, a warning logged) when the
    installed kafka-python is not a 3.0.x release this was checked against."""
    if not kafka.__version__.startswith("3.0."):
        log.warning("kafka-python %s: the group-join work-around is for 3.0.x only and is not installed",
                    kafka.__version__)
        return False
    join = BaseCoordinator.join_group_async
    need_rejoin = ConsumerCoordinator.need_rejoin
    if getattr(join, _PATCHED_MARK, False):
        return True

    def needs_rejoin_or_pending_round(self: Any) -> bool:
        if getattr(self, "_join_task", None) is not None:
            return True
        return need_rejoin(self)

    async def join_group_async(self: Any, timeout_ms: Any = None) -> Any:
        await apply_finished_round(self)
        return await join(self, timeout_ms)

    for patched, original in ((needs_rejoin_or_pending_round, need_rejoin), (join_group_async, join)):
        setattr(patched, _PATCHED_MARK, True)
        patched.__doc__ = original.__doc__
    ConsumerCoordinator.need_rejoin = needs_rejoin_or_pending_round
    BaseCoordinator.join_group_async = join_group_async
    return True
