"""The load bench's open-loop client: seeded send times, Submit with its refusal's code and retry hint, and
a thread pool that sends each request at its scheduled time however slowly earlier calls return."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc

from strata.rpc import RETRY_PUSHBACK_KEY
from strata.v1 import common_pb2, scheduler_pb2

_RETRY_IN = re.compile(r"retry in (\d+(?:\.\d+)?) ?s")


@dataclass(frozen=True)
class Reply:
    """What one Submit got."""

    code: str  # "OK" or the grpc.StatusCode name
    retry_hint_s: float | None = None  # a refusal's retry hint, seconds
    decision: str = ""  # accepted only: the Decision name (DECISION_SKIP, DECISION_LEVEL_1, ...)
    pushback: bool = False  # the hint came as the grpc-retry-pushback-ms trailer, which a retry policy honours


@dataclass(frozen=True)
class Call:
    """One Submit as the open-loop client made it; times are ``time.monotonic()``."""

    request_id: str
    scheduled_at: float  # when the schedule said to send it
    sent_at: float  # when a worker sent it: later than scheduled when every worker was busy
    latency_ms: float
    reply: Reply

    @property
    def accepted(self) -> bool:
        return self.reply.code == "OK"


Submitter = Callable[[str, str], Reply]  # (request id, prompt) -> what the server answered


def send_offsets(rate: float, duration_s: float, seed: int, poisson: bool = True) -> list[float]:
    """Send times, in seconds from the start, of an offered ``rate`` over ``duration_s``: Poisson arrivals
    (exponential gaps, seeded) or evenly spaced from 0. Pure."""
    if not poisson:
        return [i / rate for i in range(round(rate * duration_s))]
    rng = random.Random(seed)
    offsets: list[float] = []
    at = rng.expovariate(rate)
    while at < duration_s:
        offsets.append(at)
        at += rng.expovariate(rate)
    return offsets


def _pushback_ms(metadata: Sequence[tuple[str, Any]]) -> float | None:
    """The ``grpc-retry-pushback-ms`` trailer's value; None when it is absent or not a number."""
    for key, value in metadata:
        if key == RETRY_PUSHBACK_KEY:
            try:
                return float(value.decode() if isinstance(value, bytes) else value)
            except ValueError:
                return None
    return None


def pushback_s(metadata: Sequence[tuple[str, Any]]) -> float | None:
    """The trailer's retry hint in seconds; None without one (a negative pushback means "do not retry")."""
    millis = _pushback_ms(metadata)
    return millis / 1000 if millis is not None and millis >= 0 else None


def retry_hint_s(metadata: Sequence[tuple[str, Any]], details: str) -> float | None:
    """A refusal's retry hint in seconds: gRPC's ``grpc-retry-pushback-ms`` trailer, else "retry in X s"
    in the details; None without one (a negative pushback means "do not retry": no hint)."""
    millis = _pushback_ms(metadata)
    if millis is not None:
        return millis / 1000 if millis >= 0 else None
    found = _RETRY_IN.search(details)
    return float(found.group(1)) if found else None


def grpc_submitter(stub: Any, timeout_s: float) -> Submitter:
    """Submit one prompt with one sample through ``stub`` (a SchedulerStub); a refusal becomes its code."""
    def submit(request_id: str, prompt: str) -> Reply:
        request = scheduler_pb2.SubmitRequest(prompt=prompt, n_samples=1, request_id=request_id)
        try:
            response = stub.Submit(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            trailers = exc.trailing_metadata() or ()
            return Reply(exc.code().name, retry_hint_s(trailers, exc.details() or ""),
                         pushback=pushback_s(trailers) is not None)
        return Reply("OK", decision=common_pb2.Decision.Name(response.decision))

    return submit


class OpenLoopClient:
    """Sends each request at its scheduled time from a pool of ``workers`` threads, whether or not earlier
    calls have returned. With every worker busy a send waits for one and goes out late; each call records
    its scheduled and actual send time, so the lateness shows instead of a silently lower rate."""

    def __init__(self, submit: Submitter, workers: int) -> None:
        self._submit = submit
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="load-submit")

    def run(self, offsets: Sequence[float], requests: Iterator[tuple[str, str]]) -> list[Call]:
        """One call per offset (seconds from now), each the next (request id, prompt) of ``requests``;
        returns when every call has returned."""
        start = time.monotonic()
        futures = []
        for offset in offsets:
            scheduled_at = start + offset
            wait_s = scheduled_at - time.monotonic()
            if wait_s > 0:
                time.sleep(wait_s)  # pacing to the schedule; never waits on a reply
            request_id, prompt = next(requests)
            futures.append(self._pool.submit(self._call, request_id, prompt, scheduled_at))
        return [f.result() for f in futures]

    def _call(self, request_id: str, prompt: str, scheduled_at: float) -> Call:
        sent_at = time.monotonic()
        reply = self._submit(request_id, prompt)
        return Call(request_id, scheduled_at, sent_at, 1000 * (time.monotonic() - sent_at), reply)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)  # queued sends of a stopped run are not sent
