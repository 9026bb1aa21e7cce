"""Abusive load: open streams and Submit floods are capped per client and per replica, and the calls
that matter (Submit from others, Stats, health) are still answered while the caps are reached."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adversarial.edgeutil import Edge
from strata.hashing import content_hash
from strata.v1 import scheduler_pb2

pytestmark = pytest.mark.integration

EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


class OpenWatch:
    """A Watch held open on a hash no one submits, until closed."""

    def __init__(self, edge: Edge, client: str) -> None:
        self.stream = edge.scheduler(client).Watch(
            scheduler_pb2.WatchRequest(prompt_hash=content_hash(f"idle {client} {id(self)}")), timeout=120)
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        try:
            for _ in self.stream:
                pass
        except grpc.RpcError as exc:
            self.error = exc

    def close(self) -> None:
        self.stream.cancel()
        self.thread.join(timeout=10)


def watch_refusal(edge: Edge, client: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        list(edge.scheduler(client).Watch(scheduler_pb2.WatchRequest(prompt_hash="1" * 64), timeout=30))
    return refused.value


def wait_open(edge: Edge, streams: list[OpenWatch], expected: int) -> None:
    """Until the server counts ``expected`` open Watch streams (each is admitted on its first read)."""
    servicer = edge_servicer(edge)
    for _ in range(400):
        if servicer.watch_streams.open >= expected:
            return
        threading.Event().wait(0.025)
    raise AssertionError(f"{servicer.watch_streams.open} Watch streams open, expected {expected}")


def edge_servicer(edge: Edge):
    return edge.scheduler_servicer  # type: ignore[attr-defined]


@pytest.fixture
def streams() -> Iterator[list[OpenWatch]]:
    opened: list[OpenWatch] = []
    yield opened
    for stream in opened:
        stream.close()


def test_watch_streams_are_capped_per_client_and_per_replica_and_unary_calls_still_answer(
    edge: Edge, streams: list[OpenWatch]
) -> None:
    streams += [OpenWatch(edge, "alice"), OpenWatch(edge, "alice")]
    wait_open(edge, streams, 2)
    per_client = watch_refusal(edge, "alice")
    assert per_client.code() == EXHAUSTED and "per client" in per_client.details()
    streams += [OpenWatch(edge, "bob"), OpenWatch(edge, "bob")]
    wait_open(edge, streams, 4)
    full = watch_refusal(edge, "carol")
    assert full.code() == EXHAUSTED and "limit 4" in full.details()
    # Every Watch slot is taken and the server has only two threads for unary calls: still answered.
    stats = edge.scheduler("dave").Stats(scheduler_pb2.StatsRequest(), timeout=10)
    assert stats.index_size >= 0
    health = health_pb2_grpc.HealthStub(edge.channel("scheduler", None, token=None))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    assert all(s.error is None for s in streams)  # the open ones were not disturbed


def test_a_closed_watch_gives_its_slot_back(edge: Edge, streams: list[OpenWatch]) -> None:
    streams += [OpenWatch(edge, "erin"), OpenWatch(edge, "erin")]
    wait_open(edge, streams, 2)
    assert watch_refusal(edge, "erin").code() == EXHAUSTED
    streams.pop().close()
    for _ in range(400):
        if edge_servicer(edge).watch_streams.open <= 1:
            break
        threading.Event().wait(0.025)
    streams.append(OpenWatch(edge, "erin"))
    wait_open(edge, streams, 2)


def test_a_submit_flood_is_refused_with_when_to_retry_and_other_clients_are_served(edge: Edge) -> None:
    flooder = edge.scheduler("carol")
    empty = scheduler_pb2.SubmitRequest(prompt="")  # cheap to refuse, but still charged
    codes = []
    for _ in range(120):
        try:
            flooder.Submit(empty, timeout=10)
        except grpc.RpcError as exc:
            codes.append(exc.code())
            if exc.code() == EXHAUSTED:
                assert "retry in" in exc.details()
                break
    assert codes[-1] == EXHAUSTED, "the flood was never limited"
    assert len(codes) == 101  # the burst (100), then refused
    assert set(codes[:-1]) == {grpc.StatusCode.INVALID_ARGUMENT}
    other = edge.scheduler("bob").Submit(scheduler_pb2.SubmitRequest(prompt="Is a tomato a fruit?", n_samples=1),
                                         timeout=30)
    assert len(other.prompt_hash) == 64
