"""The load bench's view of the running stack: final rewards as they arrive, the services' processes (CPU
and RSS), this run's consumer groups, and a monitor thread reading their lag, RSS and Redis' memory."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from strata.bus import topics
from strata.bus.tail import TailReader
from strata_tools.bench.load.client import Call
from strata_tools.bench.load.figures import Sample
from strata_tools.infra.process import process_cmdline

log = logging.getLogger(__name__)

# Consumer groups of LiveTiers (bench-<run>-<suffix>) by the service that owns them, so that lag and CPU
# name the same thing.
SERVICE_OF_GROUP = {"probe": "probe", "l1": "generator-l1", "l2": "generator-l2", "reward": "reward",
                    "stats": "scheduler", "learner": "learner"}


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


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (/proc/<pid>/stat); 0 when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)", which may hold spaces: state is fields[0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS in /proc/<pid>/status); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def service_pids(ports: Mapping[str, int], parent: int) -> dict[str, int]:
    """The pid of each service ``parent`` started, by name, found by the ``--grpc-port`` on its command line
    (LiveTiers keeps its processes to itself)."""
    by_port = {f"--grpc-port {port} ": name for name, port in ports.items()}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(entry, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        cmdline = process_cmdline(int(entry.name)) + " "
        if ppid == parent:
            found.update({name: int(entry.name) for marker, name in by_port.items() if marker in cmdline})
    return found


def run_groups(admin: Any, run_id: str) -> dict[str, str]:
    """This run's consumer groups (``bench-<run>-<suffix>``, as LiveTiers names them) by the service owning
    each, listed through ``admin`` (a KafkaAdminClient: the run's LagReader's)."""
    prefix = f"bench-{run_id}-"
    groups = [g["group_id"] for g in admin.list_groups() if g["group_id"].startswith(prefix)]
    return {SERVICE_OF_GROUP.get(g[len(prefix):], g[len(prefix):]): g for g in sorted(groups)}


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
    """A reading of the stack now: lag summed over each group's topics, each service's RSS, Redis memory.
    ``lag_reader`` (a ``strata.bus.admin.LagReader``) stays open between readings: the caller closes it,
    after the monitor that calls this."""
    service_of = {group: service for service, group in groups.items()}

    def read() -> Sample:
        lags = dict.fromkeys(groups, 0)
        for (group, _topic), position in lag_reader.positions(list(groups.values())).items():
            lags[service_of[group]] += position.lag
        return Sample(time.monotonic(), lags, {s: rss_bytes(p) for s, p in pids.items()},
                      int(redis.info("memory")["used_memory"]))

    return read
