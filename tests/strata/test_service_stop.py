"""Stopping a service: workers finish their last batch while the loops serving them still run."""

from __future__ import annotations

import queue
import threading

from strata.config import StrataSettings
from strata.service import ServiceParts, start_service, stop_service


class BatchAtStop:
    """A worker stand-in whose last batch, handled after the stop signal, needs a loop to answer it
    (as a generator worker's batch needs the batcher loop)."""

    group_id = "drain-test"

    def __init__(self, requests: queue.Queue[queue.Queue[str]]) -> None:
        self.requests = requests
        self.answer: str | None = None

    def run(self, stop: threading.Event) -> None:
        stop.wait()
        reply: queue.Queue[str] = queue.Queue()
        self.requests.put(reply)
        self.answer = reply.get(timeout=30)


def test_workers_drain_before_the_loops_stop() -> None:
    requests: queue.Queue[queue.Queue[str]] = queue.Queue()
    worker = BatchAtStop(requests)
    order: list[str] = []

    def serving_loop(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                requests.get(timeout=0.05).put("generated")
            except queue.Empty:
                continue
        order.append("loop stopped")

    parts = ServiceParts("drain", StrataSettings(), [], 0, workers=[worker], loops=[serving_loop],  # type: ignore[list-item]
                         on_stopping=[lambda: order.append("stopping")], on_stop=[lambda: order.append("stopped")])
    running = start_service(parts)
    stop_service(parts, running, grace_s=0)
    assert worker.answer == "generated"  # the batch in flight at the stop was served, not failed
    assert order == ["stopping", "loop stopped", "stopped"]
    assert not running.failures
