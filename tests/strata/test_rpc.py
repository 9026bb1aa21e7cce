"""The shared gRPC server: health, reflection, INVALID_ARGUMENT naming the field."""

from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from strata.rpc import RunningServer, ServiceBinding, abort_invalid, start_server
from strata.v1 import learner_pb2, learner_pb2_grpc


class _Learner(learner_pb2_grpc.LearnerServicer):
    def Status(self, request, context):
        return learner_pb2.LearnerStatus(policy_version=4, step=40)

    def Checkpoint(self, request, context):
        abort_invalid(context, "checkpoint_dir", "not configured")


LEARNER = learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name


@pytest.fixture
def server() -> Iterator[RunningServer]:
    running = start_server(
        [ServiceBinding(learner_pb2_grpc.add_LearnerServicer_to_server, _Learner(), LEARNER)], port=0,
        host="127.0.0.1",
    )
    yield running
    running.stop(0)


@pytest.fixture
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        yield ch


def test_business_call(channel: grpc.Channel) -> None:
    status = learner_pb2_grpc.LearnerStub(channel).Status(learner_pb2.LearnerStatusRequest(), timeout=5)
    assert (status.policy_version, status.step) == (4, 40)


def test_health_reports_serving_per_service(server: RunningServer, channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", LEARNER):
        assert stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status == \
            health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as err:
        stub.Check(health_pb2.HealthCheckRequest(service="strata.v1.Nope"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    server.set_serving(False)
    assert stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
        health_pb2.HealthCheckResponse.NOT_SERVING


def test_reflection_lists_services(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {LEARNER, "grpc.health.v1.Health"} <= names


def test_invalid_argument_names_the_field(channel: grpc.Channel) -> None:
    with pytest.raises(grpc.RpcError) as err:
        learner_pb2_grpc.LearnerStub(channel).Checkpoint(learner_pb2.CheckpointRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == "checkpoint_dir: not configured"


def test_a_second_server_on_a_taken_port_fails_to_bind_instead_of_sharing_it(server: RunningServer) -> None:
    # With gRPC's default SO_REUSEPORT both would bind, and the kernel would split the connections.
    with pytest.raises(OSError, match="could not bind gRPC port"):
        start_server([ServiceBinding(learner_pb2_grpc.add_LearnerServicer_to_server, _Learner(), LEARNER)],
                     port=server.port, host="127.0.0.1")
