"""Watch fan-out: a late subscriber gets the recent events, then live ones, never twice."""

from __future__ import annotations

import threading

from svc_scheduler.watch import WatchHub


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(subscription) -> list:
    events = []
    while (event := subscription.get(0.0)) is not None:
        events.append(event)
    return events


def test_subscriber_after_the_events_gets_them_replayed_then_live() -> None:
    hub = WatchHub(buffer_s=60, max_prompts=10, max_events=10)
    hub.publish("a", "routed-a")
    hub.publish("b", "routed-b")
    subscription = hub.subscribe("a")
    hub.publish("a", "reward-a")
    assert drain(subscription) == ["routed-a", "reward-a"]
    subscription.close()
    hub.publish("a", "late")
    assert drain(subscription) == []
    assert hub.subscriber_count == 0


def test_buffer_horizon_and_bounds() -> None:
    clock = Clock()
    hub = WatchHub(buffer_s=10, max_prompts=2, max_events=2, clock=clock)
    hub.publish("a", 1)
    clock.now = 5
    hub.publish("a", 2)
    hub.publish("a", 3)  # only the last 2 events per prompt are kept
    clock.now = 12  # event 2 (t=5) is still within 10 s
    assert drain(hub.subscribe("a")) == [2, 3]
    clock.now = 20
    assert drain(hub.subscribe("a")) == []  # older than the horizon
    hub.publish("b", "b1")
    hub.publish("c", "c1")  # "a" was least recently active: evicted
    assert drain(hub.subscribe("b")) == ["b1"]


def test_concurrent_publish_and_subscribe_lose_nothing_and_duplicate_nothing() -> None:
    hub = WatchHub(buffer_s=60, max_prompts=10, max_events=10_000)
    published = list(range(2000))
    thread = threading.Thread(target=lambda: [hub.publish("p", i) for i in published])
    thread.start()
    subscription = hub.subscribe("p")  # somewhere in the middle of the publishing
    thread.join()
    assert drain(subscription) == published
