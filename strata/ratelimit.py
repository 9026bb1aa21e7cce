"""Per-client limits at a service's edge: token buckets for request rates, slots for open streams.

Pure (no I/O, no gRPC): the servicer says who the client is (``strata.rpc_auth.CallerIdentity``)
and turns a refusal into ``RESOURCE_EXHAUSTED`` with the reason these return.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per client: ``rate`` units a second, at most ``burst`` saved up.

    A request of ``n`` units passes when the bucket holds ``min(n, burst)`` and then takes all ``n``
    (the bucket may go into debt), so a batch larger than the burst is served once and paid for after.
    ``rate == 0`` turns the limit off. The least recently seen clients are forgotten past
    ``max_clients``, so an address scan cannot grow the table without bound.
    """

    def __init__(self, rate: float, burst: float, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0 or burst < 1:
            raise ValueError("rate must be >= 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._max_clients = max_clients
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, client: str, n: int = 1) -> float | None:
        """Charge ``n`` units to ``client``: None when allowed, else the seconds to wait before retrying."""
        if self.rate == 0:
            return None
        now = self._clock()
        with self._lock:
            bucket = self._buckets.pop(client, None) or _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            self._buckets[client] = bucket  # most recently seen last
            while len(self._buckets) > self._max_clients:
                self._buckets.popitem(last=False)
            needed = min(n, self.burst)
            if bucket.tokens < needed:
                return (needed - bucket.tokens) / self.rate
            bucket.tokens -= n
            return None


    def refund(self, client: str, n: int = 1) -> None:
        """Give back ``n`` units ``take`` charged for work that was then refused for another reason (the
        client is told to retry; the retry should not also find its budget spent)."""
        if self.rate == 0:
            return
        with self._lock:
            bucket = self._buckets.get(client)
            if bucket is not None:
                bucket.tokens = min(self.burst, bucket.tokens + n)


class RetryHints:
    """When each client was last told to come back (a refusal's retry hint), so that a refusal is refunded
    (``RateLimiter.refund``) only to a client that honoured the hint before it: one that waits is not also
    refused for the rate its refusals spent, and one that loops through refusals pays for each. The least
    recently told clients are forgotten past ``max_clients``."""

    def __init__(self, max_clients: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._until: OrderedDict[str, float] = OrderedDict()
        self._max_clients = max_clients
        self._clock = clock
        self._lock = threading.Lock()

    def honoured(self, client: str) -> bool:
        """True when ``client`` was never told to wait, or its last hint has passed."""
        with self._lock:
            return self._clock() >= self._until.get(client, -math.inf)

    def told(self, client: str, retry_after_s: float) -> None:
        with self._lock:
            self._until.pop(client, None)
            self._until[client] = self._clock() + retry_after_s  # most recently told last
            while len(self._until) > self._max_clients:
                self._until.popitem(last=False)


class StreamLimiter:
    """Open streams, counted globally and per client; ``acquire`` says why when full."""

    def __init__(self, limit: int, per_client: int, what: str = "streams") -> None:
        self.limit = limit
        self.per_client = per_client
        self._what = what
        self._open: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    @property
    def open(self) -> int:
        with self._lock:
            return self._total

    def acquire(self, client: str) -> str | None:
        """Take a slot for ``client``; None when taken, else the reason it cannot be."""
        with self._lock:
            mine = self._open.get(client, 0)
            if self._total >= self.limit:
                return f"{self._total} {self._what} are open on this replica (limit {self.limit}); retry later"
            if mine >= self.per_client:
                return (f"this client holds {mine} {self._what} (limit {self.per_client} per client); "
                        "close one or watch fewer at once")
            self._open[client] = mine + 1
            self._total += 1
            return None

    def release(self, client: str) -> None:
        with self._lock:
            held = self._open.get(client, 0)
            if held == 0:
                return
            self._total -= 1
            if held > 1:
                self._open[client] = held - 1
            else:
                del self._open[client]
