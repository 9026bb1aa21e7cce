"""gRPC plumbing shared by every service: a server with health, reflection, TLS and bearer tokens;
the matching client channel; error helpers.

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
from pathlib import Path
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from strata.config import StrataSettings
from strata.rpc_auth import HEALTH_SERVICE, BearerTokenInterceptor, TokenTable, with_bearer
from strata.rpc_metrics import GrpcMetricsInterceptor

log = logging.getLogger(__name__)

# Largest response a Strata service sends; requests are bounded by ``grpc_max_receive_bytes``.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Calls admitted beyond the threads that serve them wait in gRPC's queue; past this many per thread
# the server answers RESOURCE_EXHAUSTED at once instead of letting the queue grow without bound.
QUEUED_CALLS_PER_THREAD = 4


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


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OSError(f"cannot read the {what} {path}: {exc.strerror}") from exc


def server_credentials(settings: StrataSettings) -> grpc.ServerCredentials | None:
    """TLS credentials from ``grpc_tls_cert``/``grpc_tls_key`` (mutual with ``grpc_tls_client_ca``); None: plaintext."""
    if settings.grpc_tls_cert is None or settings.grpc_tls_key is None:
        return None
    pair = (_read(settings.grpc_tls_key, "gRPC TLS key"), _read(settings.grpc_tls_cert, "gRPC TLS certificate"))
    client_ca = _read(settings.grpc_tls_client_ca, "gRPC client CA") if settings.grpc_tls_client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=client_ca, require_client_auth=client_ca is not None)


def token_table(settings: StrataSettings) -> TokenTable | None:
    return TokenTable.load(settings.grpc_tokens_file) if settings.grpc_tokens_file is not None else None


def start_server(
    bindings: Sequence[ServiceBinding], port: int, settings: StrataSettings | None = None, stream_slots: int = 0,
    host: str | None = None,
) -> RunningServer:
    """Start a server with ``bindings``, the standard health service and, if set, reflection.

    ``settings`` (the service's): bind address, TLS, bearer tokens, reflection, message size and
    threads. ``stream_slots``: long-lived streams the service admits at most (its own limiter caps
    them); they get threads of their own on top of ``grpc_max_workers``, so that unary calls and
    health always find one free. ``port=0`` picks a free port (tests); the bound port is returned.
    """
    settings = settings or StrataSettings()
    host = host or settings.grpc_bind_host
    tokens = token_table(settings)
    interceptors: list[grpc.ServerInterceptor] = [GrpcMetricsInterceptor()]
    if tokens is not None:
        exempt = () if settings.grpc_auth_health else (HEALTH_SERVICE,)
        interceptors.append(BearerTokenInterceptor(tokens, exempt))
    threads = settings.grpc_max_workers + stream_slots
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grpc"),
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", settings.grpc_max_receive_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC binds with SO_REUSEPORT by default: a second service started on a taken port would
            # bind too and take half its connections ("Method not found"). Fail the bind instead.
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=threads * QUEUED_CALLS_PER_THREAD,
    )
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for binding in bindings:
        binding.add_to_server(binding.servicer, server)
    names = [binding.full_name for binding in bindings]
    if settings.grpc_reflection:
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME], server
        )
    credentials = server_credentials(settings)
    address = f"{host}:{port}"
    try:
        bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError:  # newer grpcio raises where older ones returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"could not bind gRPC port {address} (in use?)")
    server.start()
    for name in ["", *names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC serving %s on %s:%d (tls=%s, tokens=%s, reflection=%s)", ", ".join(names), host, bound,
             "mutual" if settings.grpc_tls_client_ca else bool(credentials), tokens is not None,
             settings.grpc_reflection)
    return RunningServer(server, bound, health_servicer)


def channel(target: str, settings: StrataSettings | None = None) -> grpc.Channel:
    """A client channel to a Strata service, with the TLS and bearer token ``settings`` configure.

    TLS is on when ``grpc_tls_ca`` (or a client certificate) is set; the token then travels as call
    credentials. Without TLS a token is still sent (as metadata): fine on loopback, in clear elsewhere.
    """
    settings = settings or StrataSettings()
    options: list[tuple[str, Any]] = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
    token = settings.grpc_token.get_secret_value() if settings.grpc_token is not None else None
    if settings.grpc_tls_ca is not None or settings.grpc_tls_client_cert is not None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(settings.grpc_tls_ca, "gRPC TLS CA") if settings.grpc_tls_ca else None,
            private_key=_read(settings.grpc_tls_client_key, "gRPC client key") if settings.grpc_tls_client_key
            else None,
            certificate_chain=_read(settings.grpc_tls_client_cert, "gRPC client certificate")
            if settings.grpc_tls_client_cert else None,
        )
        if token is not None:
            credentials = grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
        if settings.grpc_tls_server_name:
            options.append(("grpc.ssl_target_name_override", settings.grpc_tls_server_name))
        return grpc.secure_channel(target, credentials, options=options)
    plain = grpc.insecure_channel(target, options=options)
    return with_bearer(plain, token) if token is not None else plain


def wait_for_stop(running: RunningServer, stop: threading.Event, grace_s: float = 5.0) -> None:
    """Block until ``stop`` is set (e.g. by SIGTERM), then shut down gracefully."""
    stop.wait()
    running.stop(grace_s)


def abort_invalid(context: grpc.ServicerContext, field: str, problem: str) -> NoReturn:
    """Reject a request with INVALID_ARGUMENT naming the offending field."""
    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")
    raise AssertionError("unreachable")  # context.abort raises


RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"  # gRPC's retry hint (A6): a client's retry policy waits this long


def set_retry_pushback(context: grpc.ServicerContext, retry_after_s: float) -> None:
    """Say when to retry as gRPC's pushback trailer (whole milliseconds, at least one)."""
    context.set_trailing_metadata(((RETRY_PUSHBACK_KEY, str(max(1, round(retry_after_s * 1000)))),))


def abort_exhausted(context: grpc.ServicerContext, what: str, retry_after_s: float) -> NoReturn:
    """Refuse with RESOURCE_EXHAUSTED and when to retry: in the message, and as gRPC's pushback trailer."""
    set_retry_pushback(context, retry_after_s)
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, what)
    raise AssertionError("unreachable")


def abort_unavailable(context: grpc.ServicerContext, what: str) -> NoReturn:
    context.abort(grpc.StatusCode.UNAVAILABLE, what)
    raise AssertionError("unreachable")
