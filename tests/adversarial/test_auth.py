"""Callers without the right credentials: refused before any handler runs, on every service."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adversarial.edgeutil import Edge, Outcomes
from strata.v1 import (
    generator_pb2,
    generator_pb2_grpc,
    probe_pb2,
    probe_pb2_grpc,
    reward_pb2,
    reward_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)

pytestmark = pytest.mark.integration

UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def code(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


def submit(stub: scheduler_pb2_grpc.SchedulerStub, request_id: str) -> object:
    return stub.Submit(scheduler_pb2.SubmitRequest(prompt="What is a lever?", request_id=request_id), timeout=30)


CREDENTIALS = [
    ("no token", None),
    ("unknown token", "x" * 43),
    ("empty token", ""),
]


@pytest.mark.parametrize("token", [c[1] for c in CREDENTIALS], ids=[c[0] for c in CREDENTIALS])
def test_submit_without_a_known_token_is_unauthenticated(edge: Edge, outcomes: Outcomes, token: str | None) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(edge.channel("scheduler", None, token=token))
    request_id = f"unauth-{token!r}"
    assert code(lambda: submit(stub, request_id)) == UNAUTHENTICATED
    outcomes.poll()
    assert request_id not in outcomes.routed


def test_a_basic_auth_header_is_not_a_bearer_token(edge: Edge) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(edge.channel("scheduler", None, token=None))
    call = lambda: stub.Submit(scheduler_pb2.SubmitRequest(prompt="hi"), timeout=30,  # noqa: E731
                               metadata=[("authorization", f"Basic {edge.tokens['alice']}")])
    assert code(call) == UNAUTHENTICATED


def test_another_clients_token_in_the_wrong_header_is_refused(edge: Edge) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(edge.channel("scheduler", None, token=None))
    call = lambda: stub.Stats(scheduler_pb2.StatsRequest(), timeout=30,  # noqa: E731
                              metadata=[("x-token", edge.tokens["alice"])])
    assert code(call) == UNAUTHENTICATED


def test_watch_and_stats_need_a_token(edge: Edge) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(edge.channel("scheduler", None, token=None))
    assert code(lambda: list(stub.Watch(scheduler_pb2.WatchRequest(prompt_hash="0" * 64), timeout=30))) == \
        UNAUTHENTICATED
    assert code(lambda: stub.Stats(scheduler_pb2.StatsRequest(), timeout=30)) == UNAUTHENTICATED


def test_plaintext_to_a_tls_port_gets_no_answer(edge: Edge) -> None:
    stub = scheduler_pb2_grpc.SchedulerStub(edge.channel("scheduler", "alice", tls=False))
    assert code(lambda: submit(stub, "plaintext")) == grpc.StatusCode.UNAVAILABLE


def test_health_answers_without_a_token(edge: Edge) -> None:
    for service in edge.ports:
        stub = health_pb2_grpc.HealthStub(edge.channel(service, None, token=None))
        assert stub.Check(health_pb2.HealthCheckRequest(), timeout=30).status == \
            health_pb2.HealthCheckResponse.SERVING


def test_reflection_is_off(edge: Edge) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(edge.channel("scheduler", "alice"))
    request = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    assert code(lambda: list(stub.ServerReflectionInfo(request, timeout=30))) == grpc.StatusCode.UNIMPLEMENTED


TIER_CALLS = [
    ("probe", lambda ch: probe_pb2_grpc.ProbeStub(ch).Directions(probe_pb2.DirectionsRequest(prompt="hi"),
                                                                  timeout=30)),
    ("level1", lambda ch: generator_pb2_grpc.GeneratorStub(ch).Generate(
        generator_pb2.GenerateRequest(prompt="hi"), timeout=60)),
    ("level2", lambda ch: list(generator_pb2_grpc.GeneratorStub(ch).GenerateStream(
        generator_pb2.GenerateRequest(prompt="hi"), timeout=60))),
    ("reward", lambda ch: reward_pb2_grpc.RewardStub(ch).Score(
        reward_pb2.ScoreRequest(items=[reward_pb2.ScoreItem(prompt="hi", response="hello")]), timeout=60)),
]


@pytest.mark.parametrize(("service", "call"), TIER_CALLS, ids=[c[0] for c in TIER_CALLS])
def test_every_tier_refuses_a_caller_without_a_token_and_serves_one_with_it(edge: Edge, service: str, call) -> None:
    assert code(lambda: call(edge.channel(service, None, token=None))) == UNAUTHENTICATED
    assert call(edge.channel(service, "bob")) is not None
