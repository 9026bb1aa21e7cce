"""Logging and Prometheus metrics shared by all Strata processes.

Rollout logging is hash-only (R14): texts are never formatted into INFO logs. Wrap any prompt or
response that might reach a log call in :class:`Sensitive`; it renders as its hash and length, and
as the full text only when debug-rollout mode is on *and* the record is at DEBUG level.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server

from strata.hashing import content_hash

_debug_rollout = False


class Sensitive:
    """A prompt or response on its way to a log line: shows ``sha256:<12 hex>(<n> chars)``."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return f"sha256:{content_hash(self.text)[:12]}({len(self.text)} chars)"

    __repr__ = __str__


class _DebugRolloutFilter(logging.Filter):
    """Reveal Sensitive texts only for DEBUG records in debug-rollout mode."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _debug_rollout and record.levelno <= logging.DEBUG and record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(a.text if isinstance(a, Sensitive) else a for a in args)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


class CurrentStderrHandler(logging.StreamHandler):
    """A stream handler on whatever ``sys.stderr`` is when a record is emitted, not when the handler
    was made (as ``logging.lastResort`` does): a test runner swaps stderr per test and closes the old
    one, and service threads that log after that would otherwise hit "I/O operation on closed file"."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__/setStream assign it; always follow sys.stderr
        pass


def setup_logging(level: str | int = "INFO", json_lines: bool = False, debug_rollout: bool = False) -> None:
    """Configure the root logger once, in a process's ``main()``."""
    global _debug_rollout
    _debug_rollout = debug_rollout
    handler = CurrentStderrHandler()
    handler.addFilter(_DebugRolloutFilter())
    handler.setFormatter(
        JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if isinstance(level, int) else level.upper())
    # kafka-python is chatty at INFO (every connection and rebalance step).
    logging.getLogger("kafka").setLevel(max(root.level, logging.WARNING))
    if not _stderr_is_terminal():
        quiet_progress_bars()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def quiet_progress_bars() -> None:
    """No third-party progress bars or per-model weight-load reports where no person watches a terminal (a
    service's log file, CI, a pipe): Hugging Face's bars ("Loading weights", read from the environment when
    it is imported, switched off directly when already imported) and transformers' load report of unused
    or missing weights, which our zoo models print by design (a reward head on a causal LM's weights).
    Our own bars stay: on a pipe they draw at the CLI's pace (``strata_tools.cli``: every 30 s)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    logging.getLogger("transformers.utils.loading_report").setLevel(logging.ERROR)


@contextmanager
def quiet_kafka_logs(verbose: bool = False) -> Iterator[None]:
    """kafka-python's own log lines silenced for a block whose failures the caller reports itself (a tool
    that names the unreachable broker once, rather than a retry's every ERROR); ``verbose`` keeps them."""
    kafka_log = logging.getLogger("kafka")
    level = kafka_log.level
    if not verbose:
        kafka_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        kafka_log.setLevel(level)


def start_metrics_server(port: int, registry: CollectorRegistry = REGISTRY, host: str = "127.0.0.1") -> int:
    """Serve ``/metrics`` on ``host:port`` (0 picks a free port); returns the bound port."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_port)


# Bus metrics: shared by every worker and publisher of a process.
BUS_PUBLISHED = Counter("strata_bus_published_total", "Events published", ["topic"])
BUS_CONSUMED = Counter("strata_bus_consumed_total", "Events handled successfully", ["topic", "group"])
BUS_RETRIES = Counter("strata_bus_retries_total", "Handler failures that will be retried", ["topic", "group"])
BUS_DEAD_LETTERED = Counter(
    "strata_bus_dead_lettered_total", "Events sent to the dead-letter topic", ["topic", "group", "stage"]
)
BUS_HANDLER_SECONDS = Histogram(
    "strata_bus_handler_seconds", "Handler wall time per event", ["topic", "group"]
)


class Stopwatch:
    """``with Stopwatch() as sw: ...; sw.seconds``"""

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start
