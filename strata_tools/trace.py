"""Where each second of a PPO update goes: the critical path, from timestamps the events already carry.

An update's wall time is the time between two policy versions' ``PolicyUpdated`` events. The learner
spends the end of it training (``perf/update_seconds``) and syncing weights (``sync/seconds``); before
that it waits for its batch. The batch is complete when its last sample's final reward arrives, so the
wait is that sample's path, cut to the window: the driver had not sent it yet, the scheduler and probe
routed it, the generator queued and wrote it, the reward service scored it, and the learner read it
and filled its batch. Those segments tile the update, so the trace sums to its wall time::

    previous version published                                            this version published
    |-- driver --|-- scheduler+probe --|-- generation --|-- reward --|-- batching --|-- train --|-- sync --|

A segment of the critical sample that lies before the previous version was published overlapped the
previous update and costs this one nothing. Stages are named by ``STAGES``; pure: events in, figures out
(``read_events`` reads them off Kafka for ``strata bench peers`` and ``strata diagnose``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strata.bus import topics
from strata.bus.scan import TopicScan
from strata.v1 import common_pb2

if TYPE_CHECKING:
    from strata.bus.security import KafkaTarget

STAGES = ("driver", "scheduler+probe", "generation", "reward", "batching", "training", "sync")


@dataclass(frozen=True)
class SampleTimes:
    """One Level-1 sample's timestamps (unix seconds; None where no event said)."""

    submitted: float | None  # the request reached the scheduler
    routed: float | None  # the prompt was routed to the generator that wrote it
    generated: float | None
    scored: float  # its final reward was published


@dataclass(frozen=True)
class UpdateTimes:
    """One policy version's publication and the learner's own seconds for the update that made it."""

    version: int
    published: float
    train_seconds: float
    sync_seconds: float


@dataclass(frozen=True)
class UpdateTrace:
    version: int
    wall: float
    seconds: dict[str, float]  # stage -> seconds of this update, summing to ``wall``

    @property
    def critical(self) -> str:
        return max(self.seconds, key=lambda s: self.seconds[s])


def trace_update(previous: UpdateTimes, update: UpdateTimes, samples: Sequence[SampleTimes]) -> UpdateTrace:
    """The critical path of the update between ``previous`` and ``update``; ``samples``: final Level-1
    samples, any order (the one scored last before training began completed the batch)."""
    start, end = previous.published, update.published
    train, sync = max(0.0, update.train_seconds), max(0.0, update.sync_seconds)
    training_start = max(start, end - train - sync)
    before = [s for s in samples if s.scored <= training_start]
    seconds = dict.fromkeys(STAGES, 0.0)
    seconds["training"] = min(train, end - start)
    seconds["sync"] = max(0.0, (end - start) - seconds["training"] - (training_start - start))
    if not before:  # nothing scored inside the window's wait: the batch was filled before it began
        seconds["batching"] = training_start - start
        return UpdateTrace(update.version, end - start, seconds)
    last = max(before, key=lambda s: s.scored)
    # The sample's path, each mark no earlier than the one before it; a missing mark merges its segment
    # into the next one that is known.
    marks: list[tuple[str, float]] = []
    floor = start
    for stage, at in (("driver", last.submitted), ("scheduler+probe", last.routed), ("generation", last.generated),
                      ("reward", last.scored), ("batching", training_start)):
        if at is None:
            continue
        at = min(max(at, floor), training_start)
        marks.append((stage, at))
        floor = at
    previous_mark = start
    for stage, at in marks:
        seconds[stage] += at - previous_mark
        previous_mark = at
    return UpdateTrace(update.version, end - start, seconds)


@dataclass(frozen=True)
class Trace:
    updates: list[UpdateTrace] = field(default_factory=list)

    def mean_seconds(self) -> dict[str, float]:
        if not self.updates:
            return dict.fromkeys(STAGES, float("nan"))
        return {s: sum(u.seconds[s] for u in self.updates) / len(self.updates) for s in STAGES}

    @property
    def mean_wall(self) -> float:
        return sum(u.wall for u in self.updates) / len(self.updates) if self.updates else float("nan")

    @property
    def critical(self) -> str | None:
        """The stage with the largest share of the updates' time."""
        means = self.mean_seconds()
        return max(means, key=lambda s: means[s]) if self.updates else None

    def line(self) -> str:
        """One line: mean seconds per update by stage, with shares, largest first."""
        if not self.updates:
            return "critical path: no two consecutive policy versions with samples between them"
        means, wall = self.mean_seconds(), self.mean_wall
        parts = ", ".join(f"{s} {v:.2f} s ({v / wall:.0%})" for s, v in sorted(means.items(), key=lambda kv: -kv[1])
                          if v > 0)
        return f"critical path per update ({len(self.updates)} updates, {wall:.2f} s mean): {parts}"


def trace(updates: Iterable[UpdateTimes], samples: Sequence[SampleTimes]) -> Trace:
    """Every consecutive pair of versions' update, in version order (the first version has no previous)."""
    ordered = sorted(updates, key=lambda u: u.version)
    return Trace([trace_update(a, b, [s for s in samples if a.published < s.scored <= b.published])
                  for a, b in itertools.pairwise(ordered) if b.version == a.version + 1])


# --- the events, off Kafka ----------------------------------------------------------------------------


def _seconds(timestamp: Any) -> float | None:
    return timestamp.ToNanoseconds() / 1e9 if timestamp.seconds or timestamp.nanos else None


def from_events(policy: Iterable[Any], rewards: Iterable[Any], rollouts: Iterable[Any], routed: Iterable[Any],
                since: float = 0.0) -> tuple[list[UpdateTimes], list[SampleTimes]]:
    """``PolicyUpdated``, ``RewardScored``, ``RolloutGenerated`` and Level-1 ``PromptRouted`` events -> the
    update and sample timestamps the trace needs (final Level-1 rewards only: the learner trains on them);
    ``since``: unix seconds before which versions and rewards belong to another run."""
    updates = [UpdateTimes(int(e.policy_version), _seconds(e.published_at) or 0.0,
                           float(e.metrics.get("perf/update_seconds", 0.0)), float(e.metrics.get("sync/seconds", 0.0)))
               for e in policy if e.published_at.seconds and (_seconds(e.published_at) or 0.0) >= since]
    routed_at = {(r.response_hash, r.request_id, r.sample_index): _seconds(r.routed_at) for r in rollouts}
    submitted_at: Mapping[tuple[str, str], float | None] = {
        (p.prompt_hash, p.request_id): _seconds(p.submitted_at) for p in routed}
    samples = []
    for r in rewards:
        scored = _seconds(r.scored_at)
        if not r.final or r.tier != common_pb2.TIER_LEVEL_1 or scored is None or scored < since:
            continue
        samples.append(SampleTimes(submitted_at.get((r.prompt_hash, r.request_id)),
                                   routed_at.get((r.response_hash, r.request_id, r.sample_index)),
                                   _seconds(r.generated_at), scored))
    return updates, samples


def read_events(cluster: KafkaTarget, since: float = 0.0, newest: int | None = None, idle_timeout_s: float = 20.0,
                names: Sequence[Any] | None = None) -> tuple[list[UpdateTimes], list[SampleTimes]]:
    """The stack's events as they are now (no consumer group, nothing committed), from ``since`` on;
    ``newest``: only that many of each partition's newest events (a running stack's recent updates);
    ``names``: the (policy, rewards, rollouts, Level-1 prompts) topics, the stack's by default."""
    policy, rewards, rollouts, routed = names or (topics.POLICY_UPDATED, topics.REWARDS_SCORED,
                                                  topics.ROLLOUTS_GENERATED, topics.PROMPTS_LEVEL1)

    with TopicScan(cluster, client_id="strata-trace", idle_timeout_s=idle_timeout_s) as scan:
        def messages(topic: Any) -> list[Any]:
            bounds = None if newest is None else scan.newest(topic.name, newest)
            return [d.message for d in scan.events(topic, bounds=bounds)]

        return from_events(messages(policy), messages(rewards), messages(rollouts), messages(routed), since)
