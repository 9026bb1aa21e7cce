"""Process metrics every service should export, ready to wire in (R16 observability).

- :class:`GrpcMetricsInterceptor`: ``strata_grpc_requests_total{service,method,code}`` and
  ``strata_grpc_request_seconds{service,method}`` for every unary and server-streaming RPC; pass it to
  ``grpc.server(..., interceptors=[GrpcMetricsInterceptor()])`` (``strata.rpc.start_server``).
- :func:`register_device_memory_metrics`: CUDA memory per device, read by the
  ``memory`` check; call it where the Prometheus endpoint starts (``strata.service.start_service``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

DEVICE_METRIC = "strata_device_memory_allocated_bytes"

GRPC_REQUESTS = Counter("strata_grpc_requests_total", "gRPC requests handled, by final status code",
                        ["service", "method", "code"])
GRPC_SECONDS = Histogram("strata_grpc_request_seconds", "gRPC handler wall time (streams: until the last message)",
                         ["service", "method"],
                         buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))


def _split(full_method: str) -> tuple[str, str]:
    """``/strata.v1.Reward/Score`` -> (``strata.v1.Reward``, ``Score``)."""
    _, service, method = [*full_method.split("/"), "", ""][:3]
    return service or "unknown", method or "unknown"


def _code_of(context: grpc.ServicerContext, exc: BaseException | None) -> str:
    code = context.code() if hasattr(context, "code") else None
    if code is not None:
        return code.name if isinstance(code, grpc.StatusCode) else str(code)
    return "UNKNOWN" if exc is not None else "OK"


class GrpcMetricsInterceptor(grpc.ServerInterceptor):
    """Counts and times every RPC; the business servicers stay unaware of metrics."""

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        service, method = _split(handler_call_details.method)

        def record(context: grpc.ServicerContext, started: float, exc: BaseException | None) -> None:
            GRPC_SECONDS.labels(service, method).observe(time.perf_counter() - started)
            GRPC_REQUESTS.labels(service, method, _code_of(context, exc)).inc()

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                started, exc = time.perf_counter(), None
                try:
                    return inner(request, context)
                except BaseException as error:  # context.abort raises; the code is on the context
                    exc = error
                    raise
                finally:
                    record(context, started, exc)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                started, exc = time.perf_counter(), None
                try:
                    yield from inner_stream(request, context)
                except BaseException as error:
                    exc = error
                    raise
                finally:
                    record(context, started, exc)

            return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return handler  # client-streaming RPCs: none in Strata's protos


class DeviceMemoryCollector(Collector):
    """``strata_device_memory_{allocated,reserved}_bytes{device}`` at scrape time (CUDA only)."""

    def collect(self) -> Iterator[Metric]:
        torch = sys.modules.get("torch")  # never import torch (or initialise CUDA) just to scrape
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        allocated = GaugeMetricFamily(DEVICE_METRIC, "torch.cuda.memory_allocated per device", labels=["device"])
        reserved = GaugeMetricFamily("strata_device_memory_reserved_bytes", "torch.cuda.memory_reserved per device",
                                     labels=["device"])
        for i in range(torch.cuda.device_count()):
            allocated.add_metric([f"cuda:{i}"], torch.cuda.memory_allocated(i))
            reserved.add_metric([f"cuda:{i}"], torch.cuda.memory_reserved(i))
        yield allocated
        yield reserved


_registered: set[int] = set()


def register_device_memory_metrics(registry: CollectorRegistry = REGISTRY) -> None:
    """Export device memory from this process (idempotent); services call it next to their metrics."""
    if id(registry) not in _registered:
        registry.register(DeviceMemoryCollector())
        _registered.add(id(registry))


__all__ = ["DEVICE_METRIC", "GRPC_REQUESTS", "GRPC_SECONDS", "DeviceMemoryCollector", "GrpcMetricsInterceptor",
           "register_device_memory_metrics"]
