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
A failed round is left to the loop with a rejoin requested, as the loop does for a failure it sees.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_PATCHED_MARK = "_strata_applies_finished_join"


def apply() -> bool:
    """Patch kafka-python's group coordinator once. False when this kafka-python has no such code
    (another major version): nothing is changed then."""
    try:
        from kafka.coordinator.base import BaseCoordinator
        from kafka.coordinator.consumer import ConsumerCoordinator
        from kafka.structs import MemberState
    except ImportError:
        return False
    join = getattr(BaseCoordinator, "join_group_async", None)
    need_rejoin = getattr(ConsumerCoordinator, "need_rejoin", None)
    if join is None or need_rejoin is None:
        return False
    if getattr(join, _PATCHED_MARK, False):
        return True

    def needs_rejoin_or_pending_round(self: Any) -> bool:
        if getattr(self, "_join_task", None) is not None:
            return True
        return need_rejoin(self)

    async def join_group_async(self: Any, timeout_ms: Any = None) -> Any:
        task = getattr(self, "_join_task", None)
        if task is not None and task.is_done:
            self._join_task = None
            if task.succeeded():
                with self._lock:
                    self.rejoining = False
                    self.rejoin_needed = False
                    self.state = MemberState.STABLE
                    self._enable_heartbeat()
                generation = self._generation
                log.debug("group %s: applying a join round that finished after its poll gave up",
                          getattr(self, "group_id", "?"))
                await self._on_join_complete_async(generation.generation_id, generation.member_id,
                                                   generation.protocol, task.value)
            else:
                self.request_rejoin()
        return await join(self, timeout_ms)

    for patched, original in ((needs_rejoin_or_pending_round, need_rejoin), (join_group_async, join)):
        setattr(patched, _PATCHED_MARK, True)
        patched.__doc__ = original.__doc__
    ConsumerCoordinator.need_rejoin = needs_rejoin_or_pending_round
    BaseCoordinator.join_group_async = join_group_async
    return True
