"""Simulated annotators at svc_annotation's desk (R18): the demo's and the tests' human stand-ins.

Each ``SimulatedAnnotator`` (strata_tools.task.oracle: the oracle plus noise, rounding and, for one of them,
drift) works in a thread of its own through the service's gRPC API exactly as a person's client
would: ``Next`` (the prompt and response texts), a score from the oracle's judgement, ``Score``, and
a short wait when the queue is empty.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc

from strata import rpc
from strata.config import StrataSettings
from strata.v1 import annotation_pb2, annotation_pb2_grpc
from strata_tools.task.oracle import SimulatedAnnotator, infer_prompt_info

log = logging.getLogger(__name__)


def demo_pool(seed: int = 0) -> list[SimulatedAnnotator]:
    """Three annotators; the third drifts upward by 0.8 over its first 40 items (the seed's 3.8 -> 4.2
    drift, faster and larger, so that a demo's few dozen items show it)."""
    return [SimulatedAnnotator("sim-ann", seed=seed), SimulatedAnnotator("sim-bob", seed=seed + 1),
            SimulatedAnnotator("sim-drift", seed=seed + 2, drift=0.8, drift_items=40)]


@dataclass
class DeskCounts:
    scored: Counter = field(default_factory=Counter)   # annotator -> items scored
    refused: Counter = field(default_factory=Counter)  # gRPC code -> Score calls refused
    lock: threading.Lock = field(default_factory=threading.Lock)


class SimulatedDesk:
    """Runs ``annotators`` against the desk at ``address`` until stopped."""

    def __init__(self, address: str, annotators: Sequence[SimulatedAnnotator], idle_s: float = 0.5,
                 settings: StrataSettings | None = None) -> None:
        self._address = address
        self._annotators = list(annotators)
        self._idle_s = idle_s
        self._settings = settings or StrataSettings()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.counts = DeskCounts()

    def start(self) -> SimulatedDesk:
        for annotator in self._annotators:
            thread = threading.Thread(target=self._work, args=(annotator,), name=f"desk-{annotator.name}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=timeout_s)

    def __enter__(self) -> SimulatedDesk:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def _work(self, annotator: SimulatedAnnotator) -> None:
        with rpc.channel(self._address, self._settings) as channel:
            desk = annotation_pb2_grpc.AnnotationStub(channel)
            while not self._stop.is_set():
                try:
                    offer = desk.Next(annotation_pb2.NextRequest(annotator_id=annotator.name), timeout=10)
                    if not offer.has_item:
                        self._stop.wait(self._idle_s)
                        continue
                    score = annotator.annotate(infer_prompt_info(offer.prompt), offer.response)
                    desk.Score(annotation_pb2.AnnotationScoreRequest(
                        annotator_id=annotator.name, item_id=offer.item_id, score=score), timeout=10)
                    with self.counts.lock:
                        self.counts.scored[annotator.name] += 1
                except grpc.RpcError as exc:  # the desk restarting, an item closed meanwhile: go on
                    code = exc.code()  # type: ignore[attr-defined]
                    with self.counts.lock:
                        self.counts.refused[code.name] += 1
                    log.debug("%s: %s", annotator.name, code.name)
                    self._stop.wait(self._idle_s)
