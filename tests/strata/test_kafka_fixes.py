"""The kafka-python work-around is installed once, by importing the bus, and never wraps itself.
What it fixes is tested against the broker (tests/integration/test_bus.py, short polls)."""

from kafka.coordinator.base import BaseCoordinator
from kafka.coordinator.consumer import ConsumerCoordinator

import strata.bus  # noqa: F401  (installs the work-around)
from strata.bus import kafka_fixes


def test_importing_the_bus_installs_the_work_around_once() -> None:
    need_rejoin, join = ConsumerCoordinator.need_rejoin, BaseCoordinator.join_group_async
    assert getattr(need_rejoin, kafka_fixes._PATCHED_MARK, False)
    assert getattr(join, kafka_fixes._PATCHED_MARK, False)
    assert kafka_fixes.apply() is True
    assert ConsumerCoordinator.need_rejoin is need_rejoin
    assert BaseCoordinator.join_group_async is join
