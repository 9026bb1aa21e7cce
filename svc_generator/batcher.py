"""Dynamic batching (R15): the generator's engine loop, in the vLLM-v1 shape.

Callers (gRPC threads, the Kafka worker) ``submit`` requests and get futures; one loop thread runs:
  1. poll input  — take the first waiting request, then gather more until the batch is full
                   (``max_batch_size``) or the first one has waited ``max_wait_s``;
  2. step        — one backend call for the whole batch (weights swapped first if an update waits);
                   a batch that fails is retried in halves, so one bad request fails alone;
  3. emit output — resolve each future with its output, the policy version and its share of the
                   batch's device time; then give cached device memory back.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from svc_generator.backends.base import Backend, GenerationOutput, GenerationRequest

log = logging.getLogger(__name__)

BATCH_SIZE = Histogram("strata_generator_batch_size", "Sequences per generation batch",
                       buckets=(1, 2, 4, 8, 16, 32, 64))
BATCH_SECONDS = Histogram("strata_generator_batch_seconds", "Wall time of one generation batch")
QUEUE_DEPTH = Gauge("strata_generator_queue_depth", "Requests waiting for a batch")
TOKENS = Counter("strata_generator_tokens_total", "Response tokens generated")
FAILED = Counter("strata_generator_failed_requests_total", "Requests whose generation failed (alone, after splitting)")
POLICY_VERSION = Gauge("strata_generator_policy_version", "Policy version of the loaded weights")


@dataclass(frozen=True)
class SampleResult:
    output: GenerationOutput
    policy_version: int         # version of the weights that generated it (R13)
    model_id: str
    device_seconds: float       # this sample's share of its batch's time, by tokens (R4)
    batch_size: int


@dataclass
class _Pending:
    request: GenerationRequest
    future: Future[SampleResult]
    enqueued_at: float


class DynamicBatcher:
    def __init__(self, backend: Backend, max_batch_size: int, max_wait_s: float, policy_version: int = 0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock  # device-seconds (strata.devicetime)
        self._backend = backend
        self._max_batch_size = max_batch_size
        self._max_wait_s = max_wait_s
        self._queue: queue.Queue[_Pending] = queue.Queue()
        self._policy_version = policy_version
        self._pending_weights: tuple[str, int] | None = None
        self._any_version_next = False
        self._lock = threading.Lock()
        self.batches = 0
        POLICY_VERSION.set(policy_version)

    @property
    def policy_version(self) -> int:
        return self._policy_version

    def submit(self, requests: Sequence[GenerationRequest]) -> list[Future[SampleResult]]:
        now = time.monotonic()
        futures = []
        for request in requests:
            future: Future[SampleResult] = Future()
            self._queue.put(_Pending(request, future, now))
            futures.append(future)
        QUEUE_DEPTH.set(self._queue.qsize())
        return futures

    def reset_version_floor(self) -> None:
        """A new lineage (training run) began: its first version loads even if its number is lower."""
        with self._lock:
            self._pending_weights = None
            self._any_version_next = True

    def request_weights(self, path: str, version: int) -> None:
        """Load ``path`` before the next batch; later rollouts carry ``version``."""
        with self._lock:
            floor = self._pending_weights[1] if self._pending_weights else self._policy_version
            if self._any_version_next or version > floor:
                self._pending_weights = (path, version)
                self._any_version_next = False

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step(poll_timeout_s=0.1)
        self._fail_waiting(RuntimeError("generator is shutting down"))

    def step(self, poll_timeout_s: float = 0.1) -> int:
        """One loop iteration; returns the batch size (0 when nothing was waiting)."""
        self._apply_weights()
        # 1. poll input
        try:
            first = self._queue.get(timeout=poll_timeout_s)
        except queue.Empty:
            return 0
        batch = [first]
        deadline = first.enqueued_at + self._max_wait_s
        while len(batch) < self._max_batch_size:
            remaining = deadline - time.monotonic()
            try:
                batch.append(self._queue.get(timeout=max(remaining, 0)) if remaining > 0 else self._queue.get_nowait())
            except queue.Empty:
                break
        QUEUE_DEPTH.set(self._queue.qsize())
        batch = [p for p in batch if p.future.set_running_or_notify_cancel()]
        if not batch:
            return 0
        # 2. step the backend
        self._generate(batch)
        return len(batch)

    def _generate(self, batch: list[_Pending]) -> None:
        """Steps 2 and 3 for ``batch``. A failed batch is split in halves and each retried, so one
        bad request fails alone and its batch-mates are served (log2(n) extra calls per bad item)."""
        started = self._clock()
        try:
            outputs = self._backend.generate([p.request for p in batch])
        except Exception as exc:
            self._backend.release_memory()
            if len(batch) == 1:
                log.warning("generation failed for one request: %s: %s", type(exc).__name__, exc)
                FAILED.inc()
                batch[0].future.set_exception(exc)
                return
            log.warning("generation batch of %d failed (%s: %s); retrying it in halves", len(batch),
                        type(exc).__name__, exc)
            middle = len(batch) // 2
            self._generate(batch[:middle])
            self._generate(batch[middle:])
            return
        self._backend.release_memory()
        elapsed = self._clock() - started
        # 3. emit output
        total_tokens = sum(max(len(o.token_ids), 1) for o in outputs)
        for pending, output in zip(batch, outputs, strict=True):
            share = elapsed * max(len(output.token_ids), 1) / total_tokens
            pending.future.set_result(
                SampleResult(output, self._policy_version, self._backend.model_id, share, len(batch))
            )
        self.batches += 1
        BATCH_SIZE.observe(len(batch))
        BATCH_SECONDS.observe(elapsed)
        TOKENS.inc(sum(len(o.token_ids) for o in outputs))

    def _apply_weights(self) -> None:
        with self._lock:
            pending, self._pending_weights = self._pending_weights, None
        if pending is None:
            return
        path, version = pending
        started = time.perf_counter()
        try:
            self._backend.load_weights(path)
        except Exception:
            log.exception("could not load policy v%d from %s; keeping v%d", version, path, self._policy_version)
            return
        self._policy_version = version
        POLICY_VERSION.set(version)
        log.info("policy v%d loaded in %.2f s from %s", version, time.perf_counter() - started, path)

    def _fail_waiting(self, exc: Exception) -> None:
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                return
            if pending.future.set_running_or_notify_cancel():
                pending.future.set_exception(exc)
