"""Shedding at the door: refuse new rollouts while the tiers behind the scheduler are too far behind.

Each rollout tier works off a Kafka topic (the probe, the Level-1 and Level-2 generators, the reward
service); its consumer group's lag is the work it has queued, and the advance of its committed offsets
over the last ``backlog_window_s`` is how fast it works. Their ratio is how long a prompt accepted now
would wait in that tier's queue. Past ``shed_backlog_wait_s`` in any tier, with at least
``shed_min_backlog`` events queued there, Submit refuses the prompts that need a rollout with
``RESOURCE_EXHAUSTED`` and a retry hint (when the queue is expected back under the bound), and serves
the ones it can skip: they need nothing downstream. Accepting work the tiers cannot reach in time would
only move the refusal later, past the client's deadline, where it is a loss.

The rate covers busy time only (the window restarts whenever the queue was empty), so a burst after
an idle spell is not judged by the idle seconds; until a busy spell spans ``MEASURED_AFTER_S`` the rate
is unknown and sheds nothing, and a tier counts as stalled (nothing committed, events waiting) only
after a whole window. Only groups that had members within ``backlog_member_grace_s`` count: a tier
that is not deployed (or whose group was renamed) keeps its old commits and a lag that grows forever,
which must not close the door, while a tier crash-looping or evicted for a slow poll still does. A
reading that could not be taken recently sheds nothing: a stale gauge must not refuse traffic (with
Kafka down, publishing fails on its own, as UNAVAILABLE).

The rule (:func:`shed_decision`, :class:`DrainRate`) is pure; :class:`BacklogGauge` is the thread that
reads Kafka.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from strata.bus.admin import GroupPosition
from svc_scheduler.config import SchedulerSettings

log = logging.getLogger(__name__)

MEASURED_AFTER_S = 5.0  # a busy spell's rate is known once its readings span this long (or the window)
STALE_AFTER_POLLS = 3  # a reading older than this many polls (and STALE_SLACK_S) sheds nothing
STALE_SLACK_S = 5.0


@dataclass(frozen=True)
class StageReading:
    """One tier's queue: its consumer group and topic, what it has queued and how fast it drains."""

    group: str
    topic: str
    lag: int
    rate: float | None  # events/s committed over the busy window; None while unknown

    @property
    def wait_s(self) -> float:
        """Seconds a new event would queue here (infinite when events wait and nothing drains; 0 while the
        rate is unknown: an unmeasured tier sheds nothing)."""
        if self.lag == 0 or self.rate is None:
            return 0.0
        return self.lag / self.rate if self.rate else math.inf


@dataclass(frozen=True)
class Shed:
    """Why rollouts are refused now, and when to try again."""

    stage: StageReading
    bound_s: float
    retry_after_s: float

    def message(self) -> str:
        """What the refused client reads: which stage is behind and when to retry, in the product's terms
        (consumer groups and topics are the deployment's business: ``detail`` has them, for the log)."""
        name, unit = stage_name(self.stage.group)
        return (f"the rollout tiers are behind: {name} has {self.stage.lag} {unit} "
                f"queued ({self._wait()}, bound {self.bound_s:g} s); prompts that need a rollout are refused "
                f"until it drains, skips are served; retry in {self.retry_after_s:.1f} s")

    def detail(self) -> str:
        """The operator's view: the consumer group and topic behind."""
        return (f"group {self.stage.group} has {self.stage.lag} events queued on {self.stage.topic} "
                f"({self._wait()}, bound {self.bound_s:g} s); hint {self.retry_after_s:.1f} s")

    def jittered(self, fraction: float) -> Shed:
        """The same refusal with its hint stretched by ``fraction`` (one draw per call): refused clients
        told one time would all come back at once and be refused together."""
        # Whole milliseconds: the trailer carries ms, and the message must say the same wait.
        return replace(self, retry_after_s=round(self.retry_after_s * (1.0 + fraction), 3))

    def _wait(self) -> str:
        return "with nothing draining" if math.isinf(self.stage.wait_s) else f"~{self.stage.wait_s:.0f} s of work"


# The services' default consumer groups, named as a client knows the stages, with what their queues hold
# (svc_probe, svc_generator and svc_reward's configs; tests/svc_scheduler/test_backlog.py ties them).
STAGE_NAMES = {
    "svc-probe": ("the Level-0 probe", "prompts"),
    "svc-generator-l1": ("Level-1 generation", "prompts"),
    "svc-generator-l2": ("Level-2 generation", "prompts"),
    "svc-reward": ("reward scoring", "rollouts"),
}


def stage_name(group: str) -> tuple[str, str]:
    """What a client reads for ``group``: the stage's name and what its queue holds."""
    return STAGE_NAMES.get(group, ("a rollout stage", "events"))


def shed_decision(readings: Sequence[StageReading], bound_s: float, min_backlog: int,
                  max_retry_after_s: float) -> Shed | None:
    """The tier furthest over the wait bound, or None when every tier would serve a new prompt in time.

    The retry hint is when that tier's queue is expected back under the bound at its measured rate (at
    least a second; ``max_retry_after_s`` when nothing drains)."""
    if bound_s <= 0:
        return None
    over = [r for r in readings if r.rate is not None and r.lag >= min_backlog and r.wait_s > bound_s]
    if not over:
        return None
    worst = max(over, key=lambda r: (r.wait_s, r.lag))
    if worst.rate:
        retry = (worst.lag - worst.rate * bound_s) / worst.rate
        retry = min(max(retry, 1.0), max_retry_after_s)
    else:
        retry = max_retry_after_s
    return Shed(worst, bound_s, retry)


class DrainRate:
    """A tier's drain rate: its committed offsets' advance over the last ``window_s`` seconds of work."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.points: deque[tuple[float, int]] = deque()

    def add(self, at: float, committed: int, lag: int) -> float | None:
        """Record a reading; the rate over the busy window, or None while unknown: the busy spell is shorter
        than ``MEASURED_AFTER_S`` (or the window), or nothing was committed in less than a whole window."""
        if self.points and committed < self.points[-1][1]:  # offsets reset (group recreated): start again
            self.points.clear()
        if lag == 0:  # idle: the next busy spell is measured from its first reading with work queued
            self.points.clear()
            return None
        self.points.append((at, committed))
        while len(self.points) > 2 and at - self.points[1][0] >= self.window_s:
            self.points.popleft()
        first_at, first = self.points[0]
        span = at - first_at
        if span < min(MEASURED_AFTER_S, self.window_s):
            return None
        if committed == first and span < self.window_s:  # maybe mid-batch: stalled only after a whole window
            return None
        return (committed - first) / span


class PositionSource(Protocol):
    def positions(self, groups: Sequence[str]) -> Mapping[tuple[str, str], GroupPosition]: ...

    def active(self, groups: Sequence[str]) -> set[str]: ...

    def close(self) -> None: ...


class BacklogGauge:
    """Reads the tiers' consumer groups every ``backlog_poll_s`` and answers whether to shed now."""

    def __init__(self, settings: SchedulerSettings, connect: Callable[[], PositionSource],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.groups = [g.strip() for g in settings.backlog_groups.split(",") if g.strip()]
        self.connect = connect
        self.clock = clock
        self.rates: dict[tuple[str, str], DrainRate] = {}
        self.members_seen: dict[str, float] = {}  # group -> when it last had members
        self.readings: list[StageReading] = []
        self.read_at: float | None = None
        self.lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.settings.shed_backlog_wait_s > 0 and bool(self.groups)

    def record(self, positions: Mapping[tuple[str, str], GroupPosition]) -> None:
        """Fold one reading in (the loop calls it; tests call it with constructed positions)."""
        now = self.clock()
        readings = []
        for (group, topic), position in sorted(positions.items()):
            rate = self.rates.setdefault((group, topic), DrainRate(self.settings.backlog_window_s))
            readings.append(StageReading(group, topic, position.lag,
                                         rate.add(now, position.committed, position.lag)))
        with self.lock:
            self.readings, self.read_at = readings, now

    def shed(self) -> Shed | None:
        """Whether to refuse rollouts now; None too when the last reading is stale (or none was taken)."""
        with self.lock:
            readings, read_at = self.readings, self.read_at
        stale_after = STALE_AFTER_POLLS * self.settings.backlog_poll_s + STALE_SLACK_S
        if not self.enabled or read_at is None or self.clock() - read_at > stale_after:
            return None
        return shed_decision(readings, self.settings.shed_backlog_wait_s, self.settings.shed_min_backlog,
                             self.settings.max_retry_after_s)

    def counted(self, with_members: set[str]) -> set[str]:
        """The groups whose backlog counts: members now, or within ``backlog_member_grace_s`` (a crash-looping
        tier's queue still closes the door). The first reading names the groups that have none."""
        now = self.clock()
        first = not self.members_seen and self.read_at is None
        for group in with_members:
            self.members_seen[group] = now
        if first and (missing := [g for g in self.groups if g not in with_members]):
            log.info("backlog_groups without members now (not counted until they have some): %s", ", ".join(missing))
        grace = self.settings.backlog_member_grace_s
        return {g for g, seen in self.members_seen.items() if now - seen <= grace}

    def run(self, stop: threading.Event) -> None:
        """Read until ``stop``; a failed read is logged once per outage and leaves the gauge to go stale."""
        if not self.enabled:
            return
        source: PositionSource | None = None
        failing = False
        try:
            while not stop.is_set():
                try:
                    source = source or self.connect()
                    active = self.counted(source.active(self.groups))
                    positions = source.positions(self.groups)
                    self.record({key: p for key, p in positions.items() if key[0] in active})
                    if failing:
                        log.info("the tiers' backlog is readable again")
                    failing = False
                except Exception as exc:  # Kafka down or slow: no reading, no shedding
                    if not failing:
                        log.warning("cannot read the tiers' backlog (%s); not shedding until it can", exc)
                    failing = True
                    if source is not None:
                        with contextlib.suppress(Exception):  # a failing close must not end the loop
                            source.close()
                        source = None
                stop.wait(self.settings.backlog_poll_s)
        finally:
            if source is not None:
                source.close()
