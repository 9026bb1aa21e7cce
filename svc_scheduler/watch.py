"""Watch fan-out: one reader of the prompt, rollout and reward topics per replica, many subscribers.

The race a Watch must not lose: a client calls Submit, gets the hash, then calls Watch; the routed
event (and, for a skip, the reused reward) is on Kafka *before* Submit returns, so a Watch that only
saw events arriving after it subscribed would miss them. Two things close the gap:

- the hub keeps each prompt's recent events (``watch_buffer_s``, bounded per prompt and in number
  of prompts, least recently active evicted first) and replays them to a new subscriber;
- replay and registration happen under one lock with delivery, so an event is either in the replay
  or delivered live, never both and never neither;
- at start the reader begins ``watch_lookback_s`` in the past, so a replica that (re)started just
  after a Submit still has the events.

A Watch that starts later than the buffer's horizon sees only new events (documented in
docs/scheduler.md). Events are protobuf messages here, opaque to the hub.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from strata.bus import topics
from strata.bus.tail import TailReader
from strata.v1 import scheduler_pb2
from svc_scheduler.config import SchedulerSettings

log = logging.getLogger(__name__)


class Subscription:
    def __init__(self, hub: WatchHub, prompt_hash: str) -> None:
        self.prompt_hash = prompt_hash
        self.events: queue.Queue[Any] = queue.Queue()
        self._hub = hub

    def get(self, timeout_s: float) -> Any | None:
        try:
            return self.events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._hub.unsubscribe(self)


class WatchHub:
    def __init__(
        self, buffer_s: float, max_prompts: int, max_events: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._buffer_s = buffer_s
        self._max_prompts = max_prompts
        self._max_events = max_events
        self._clock = clock
        self._recent: OrderedDict[str, deque[tuple[float, Any]]] = OrderedDict()
        self._subscribers: dict[str, list[Subscription]] = {}
        self._lock = threading.Lock()

    def publish(self, prompt_hash: str, event: Any) -> None:
        now = self._clock()
        with self._lock:
            recent = self._recent.pop(prompt_hash, None) or deque(maxlen=self._max_events)
            recent.append((now, event))
            self._recent[prompt_hash] = recent  # most recently active last
            while len(self._recent) > self._max_prompts:
                self._recent.popitem(last=False)
            for subscription in self._subscribers.get(prompt_hash, ()):
                subscription.events.put(event)

    def subscribe(self, prompt_hash: str) -> Subscription:
        subscription = Subscription(self, prompt_hash)
        horizon = self._clock() - self._buffer_s
        with self._lock:
            for at, event in self._recent.get(prompt_hash, ()):
                if at >= horizon:
                    subscription.events.put(event)
            self._subscribers.setdefault(prompt_hash, []).append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            subscribers = self._subscribers.get(subscription.prompt_hash, [])
            if subscription in subscribers:
                subscribers.remove(subscription)
            if not subscribers:
                self._subscribers.pop(subscription.prompt_hash, None)

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._subscribers.values())


WATCHED_TOPICS = (
    topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2, topics.ROLLOUTS_GENERATED,
    topics.REWARDS_SCORED,
)


def watch_event(message: Any) -> scheduler_pb2.WatchEvent:
    """Wrap a bus event in the Watch stream's oneof."""
    name = type(message).__name__
    field = {"PromptRouted": "routed", "RolloutGenerated": "rollout", "RewardScored": "reward"}[name]
    event = scheduler_pb2.WatchEvent()
    getattr(event, field).CopyFrom(message)
    return event


class WatchFeed:
    """The loop feeding the hub from Kafka (one per replica; runs as a ``ServiceParts`` loop)."""

    def __init__(self, settings: SchedulerSettings, hub: WatchHub, client_id: str) -> None:
        self.hub = hub
        self._reader = TailReader(settings, WATCHED_TOPICS, client_id)
        self._reader.seek_to_time(int((time.time() - settings.watch_lookback_s) * 1000))

    def poll_once(self, timeout_s: float = 0.5) -> int:
        events = self._reader.poll(timeout_s)
        for _topic, message in events:
            self.hub.publish(message.prompt_hash, watch_event(message))
        return len(events)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.poll_once()
        finally:
            self._reader.close()
