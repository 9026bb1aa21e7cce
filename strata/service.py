"""How every Strata service process runs: gRPC server + Kafka workers + clean shutdown.

A service's ``__main__`` builds its settings, its pure core, its servicer and its workers, then hands
them to :func:`run_service`, which:

1. logs the resolved settings (never secrets or texts),
2. starts the gRPC server (health, reflection, TLS and tokens as set) and, when configured, the Prometheus endpoint,
3. runs each worker's poll loop in its own thread,
4. on SIGTERM/SIGINT: reports NOT_SERVING, drains in-flight RPCs, lets every worker finish its
   current event and commit, then exits. A worker that crashes stops the process (exit code 1) so
   that a supervisor (``strata up``, compose) restarts it; uncommitted events are redelivered.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from strata.bus import Worker
from strata.config import StrataSettings, add_settings_flags, parse_settings
from strata.errors import ServiceConfigError
from strata.lifecycle import stop_on_signals
from strata.rpc import RunningServer, ServiceBinding, start_server
from strata.rpc_metrics import register_device_memory_metrics
from strata.telemetry import setup_logging, start_metrics_server

Settings = TypeVar("Settings", bound=StrataSettings)

log = logging.getLogger(__name__)


@dataclass
class ServiceParts:
    """Everything a service process runs."""

    name: str
    settings: StrataSettings
    bindings: Sequence[ServiceBinding]
    grpc_port: int
    workers: Sequence[Worker] = ()
    # Extra loops (e.g. a batcher thread); each gets the stop event and must return when it is set.
    loops: Sequence[Callable[[threading.Event], None]] = ()
    on_stop: Sequence[Callable[[], None]] = field(default_factory=list)
    # Called as soon as stopping begins, before the gRPC server's grace period (e.g. end open streams).
    on_stopping: Sequence[Callable[[], None]] = field(default_factory=list)
    # Long-lived streams the service admits (its own limiter caps them): threads on top of the pool.
    stream_slots: int = 0


@dataclass
class RunningService:
    server: RunningServer
    worker_threads: list[threading.Thread]
    loop_threads: list[threading.Thread]
    stop: threading.Event  # set: the service is stopping (workers finish their batch and leave)
    loops_stop: threading.Event  # set once the workers are done: the loops they may still need stop last
    failures: list[BaseException]

    @property
    def port(self) -> int:
        return self.server.port


def start_service(parts: ServiceParts, stop: threading.Event | None = None) -> RunningService:
    """Start server, workers and loops; returns at once (tests use this in-process)."""
    stop = stop or threading.Event()
    log.info("%s starting with settings %s", parts.name, json.dumps(parts.settings.as_log_dict(), default=str))
    if parts.settings.metrics_port is not None:
        register_device_memory_metrics()  # CUDA memory per device (the memory diagnostic reads it)
        port = start_metrics_server(parts.settings.metrics_port, host=parts.settings.metrics_bind_host)
        log.info("%s metrics on %s:%d/metrics", parts.name, parts.settings.metrics_bind_host, port)
    server = start_server(parts.bindings, parts.grpc_port, parts.settings, stream_slots=parts.stream_slots)
    failures: list[BaseException] = []
    loops_stop = threading.Event()

    def guarded(target: Callable[[threading.Event], None], label: str, until: threading.Event) -> Callable[[], None]:
        def body() -> None:
            try:
                target(until)
            except BaseException as exc:  # a crashed loop takes the process down, on purpose
                log.exception("%s: %s crashed", parts.name, label)
                failures.append(exc)
                stop.set()

        return body

    # Daemon threads: stop_service joins them on every orderly shutdown; a service someone forgot to
    # stop (a test whose setup failed half-way) must not keep its process alive forever.
    worker_threads = [
        threading.Thread(target=guarded(worker.run, f"worker {worker.group_id}", stop),
                         name=f"worker-{worker.group_id}", daemon=True)
        for worker in parts.workers
    ]
    # Loops (a generator's batcher, the learner's update loop) serve the workers' last batch, so they
    # run until the workers are done: a SIGTERM drains and commits instead of failing in-flight work.
    loop_threads = [threading.Thread(target=guarded(loop, f"loop {i}", loops_stop), name=f"loop-{i}", daemon=True)
                    for i, loop in enumerate(parts.loops)]
    for thread in worker_threads + loop_threads:
        thread.start()
    return RunningService(server, worker_threads, loop_threads, stop, loops_stop, failures)


def stop_service(parts: ServiceParts, running: RunningService, grace_s: float = 5.0) -> None:
    running.stop.set()
    for callback in parts.on_stopping:
        callback()
    running.server.stop(grace_s)
    for thread in running.worker_threads:
        thread.join()
    running.loops_stop.set()
    for thread in running.loop_threads:
        thread.join()
    for callback in parts.on_stop:
        callback()
    log.info("%s stopped", parts.name)


def service_main(settings_type: type[Settings], build: Callable[[Settings], ServiceParts], prog: str,
                 description: str | None, argv: Sequence[str] | None = None) -> int:
    """A service's ``main``: settings from env and flags, logging, then :func:`run_service`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_settings_flags(parser, settings_type)
    settings, _args = parse_settings(parser, settings_type, argv)
    setup_logging(settings.log_level, debug_rollout=settings.debug_rollout)
    try:
        parts = build(settings)
    except ServiceConfigError as exc:  # ModelNotConfiguredError, ModelLoadError, ...
        # A deployment mistake, not a crash: say which setting to give, without a traceback.
        log.error("%s: %s", prog, exc)
        return 2
    return run_service(parts)


def run_service(parts: ServiceParts) -> int:
    """Run until SIGTERM/SIGINT (or a crashed worker); returns the process exit code."""
    stop = stop_on_signals()
    running = start_service(parts, stop)
    stop.wait()
    stop_service(parts, running)
    return 1 if running.failures else 0
