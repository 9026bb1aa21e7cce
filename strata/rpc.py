"""gRPC plumbing shared by every service: a server with health and reflection, and error helpers.

Following gRPC's route_guide / health_checking examples: the servicer only translates and
delegates; ``serve`` is short; a health servicer sits beside the business one; shutdown drains with a
grace period.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from strata.rpc_metrics import GrpcMetricsInterceptor

log = logging.getLogger(__name__)

# Largest request a Strata service accepts (prompts are bounded far below this by config).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ServiceBinding:
    """A business servicer and how to add it: ``add_XServicer_to_server`` and the full service name."""

    add_to_server: Callable[[Any, grpc.Server], None]
    servicer: Any
    full_name: str          # e.g. strata_pb2.DESCRIPTOR.services_by_name["Probe"].full_name


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.health.set("", status)

    def stop(self, grace_s: float = 5.0) -> None:
        """Report NOT_SERVING (load balancers stop sending), then drain in-flight calls."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()


def start_server(
    bindings: Sequence[ServiceBinding], port: int, host: str = "0.0.0.0", max_workers: int = 16
) -> RunningServer:
    """Start a server with ``bindings``, the standard health service and server reflection.

    ``port=0`` picks a free port (tests); the bound port is returned.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        interceptors=[GrpcMetricsInterceptor()],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for binding in bindings:
        binding.add_to_server(binding.servicer, server)
    names = [binding.full_name for binding in bindings]
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"could not bind gRPC port {host}:{port} (in use?)")
    server.start()
    for name in ["", *names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC serving %s on %s:%d", ", ".join(names), host, bound)
    return RunningServer(server, bound, health_servicer)


def wait_for_stop(running: RunningServer, stop: threading.Event, grace_s: float = 5.0) -> None:
    """Block until ``stop`` is set (e.g. by SIGTERM), then shut down gracefully."""
    stop.wait()
    running.stop(grace_s)


def abort_invalid(context: grpc.ServicerContext, field: str, problem: str) -> NoReturn:
    """Reject a request with INVALID_ARGUMENT naming the offending field."""
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")
    raise AssertionError("unreachable")  # context.abort raises


def abort_unavailable(context: grpc.ServicerContext, what: str) -> NoReturn:
    context.abort(grpc.StatusCode.UNAVAILABLE, what)
    raise AssertionError("unreachable")
