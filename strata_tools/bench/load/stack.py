"""The load bench's view of the running stack: final rewards as they arrive, the services' processes (CPU,
RSS, threads, open files) and a monitor thread reading their groups' lag, those and Redis' memory."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from strata.bus import topics
from strata.bus.tail import TailReader
from strata_tools.bench.load.client import Call
from strata_tools.bench.load.figures import Sample
from strata_tools.infra.process import open_fds, rss_bytes, thread_count

log = logging.getLogger(__name__)

class Finals:
    """Arrival times (``time.monotonic()``) of the final rewards per request id with ``prefix``, read from
    ``strata.rewards.scored`` by a thread of its own from the end of the topic at construction."""

    def __init__(self, settings: Any, prefix: str) -> None:
        self._reader = TailReader(settings, [topics.REWARDS_SCORED], client_id=f"load-{uuid.uuid4().hex[:6]}")
        self._reader.seek_to_end()
        self._prefix = prefix
        self._arrivals: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, daemon=True, name="load-finals")
        self._thread.start()

    def _follow(self) -> None:
        try:
            while not self._stop.is_set():
                for _topic, event in self._reader.poll(0.25):
                    if event.final and event.request_id.startswith(self._prefix):
                        with self._lock:
                            self._arrivals.setdefault(event.request_id, []).append(time.monotonic())
        except Exception as exc:  # raised again by wait(): a dead reader must not look like lost finals
            self.error = exc

    def arrivals(self) -> dict[str, list[float]]:
        with self._lock:
            return {r: list(times) for r, times in self._arrivals.items()}

    def wait(self, calls: Sequence[Call], deadline_s: float) -> None:
        """Until every accepted call has a final or is ``deadline_s`` past its send."""
        pending = [c for c in calls if c.accepted]
        while pending:
            if self.error is not None:
                raise RuntimeError("the final-reward reader stopped") from self.error
            now = time.monotonic()
            arrived = self.arrivals()
            pending = [c for c in pending if c.request_id not in arrived and now - c.sent_at <= deadline_s]
            self._stop.wait(0.5)  # interval between checks of a real condition

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._reader.close()


class Monitor:
    """Samples the groups' lag, the services' RSS and Redis' memory every ``interval_s`` in a thread."""

    def __init__(self, read: Callable[[], Sample], interval_s: float) -> None:
        self._read = read
        self._interval_s = interval_s
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True, name="load-monitor")
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self._read()
                with self._lock:
                    self._samples.append(sample)
            except Exception as exc:  # a slow Kafka costs a reading, not the run
                log.warning("no reading of the stack this time: %s", exc)
            self._stop.wait(self._interval_s)

    def between(self, start: float, end: float) -> list[Sample]:
        with self._lock:
            return [s for s in self._samples if start <= s.at <= end]

    def last_before(self, at: float) -> Sample | None:
        with self._lock:
            return next((s for s in reversed(self._samples) if s.at <= at), None)

    def fresh(self, timeout_s: float) -> Sample | None:
        """The first reading taken after this call; None when none comes within ``timeout_s``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            latest = self.last_before(time.monotonic())
            if latest is not None and latest.at > start:
                return latest
            self._stop.wait(min(self._interval_s, 0.5))  # interval between checks of a real condition
        return None

    def wait_drained(self, timeout_s: float) -> float | None:
        """Seconds until a reading taken after this call shows no lag in any group; None after ``timeout_s``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            latest = self.last_before(time.monotonic())
            if latest is not None and latest.at > start and not any(latest.lags.values()):
                return latest.at - start
            self._stop.wait(min(self._interval_s, 0.5))  # interval between checks of a real condition
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def stack_reader(lag_reader: Any, groups: Mapping[str, str], pids: Mapping[str, int], redis: Any
                 ) -> Callable[[], Sample]:
    """A reading of the stack now: lag summed over each group's topics, each service's RSS, threads and open
    file descriptors, Redis memory. ``groups`` and ``pids`` are by service name (``LiveTiers.consumer_groups``
    and ``.pids``, read at each reading: a restarted service is read in its new process). ``lag_reader`` (a
    ``strata.bus.admin.LagReader``) stays open between readings: the caller closes it, after the monitor
    that calls this."""
    service_of = {group: service for service, group in groups.items()}

    def read() -> Sample:
        lags = dict.fromkeys(groups, 0)
        for (group, _topic), position in lag_reader.positions(list(groups.values())).items():
            lags[service_of[group]] += position.lag
        now = dict(pids)
        return Sample(time.monotonic(), lags, {s: rss_bytes(p) for s, p in now.items()},
                      int(redis.info("memory")["used_memory"]), fds={s: open_fds(p) for s, p in now.items()},
                      threads={s: thread_count(p) for s, p in now.items()})

    return read
