"""``python -m svc_annotation``: the human annotation desk (R3, R18, R20).

    python -m svc_annotation --grpc-port 50057 --web-port 8057 --gold-items-path gold.jsonl

gRPC on ``grpc_port``, the annotators' web page on ``web_port`` (svc_annotation/web.py; 0: none).
Every ``AnnotationSettings`` field is a flag (and a ``STRATA_*`` variable); see docs/annotation.md.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from strata.bus import Publisher, Worker, topics
from strata.content_store import ContentStore
from strata.rpc import ServiceBinding, token_table
from strata.rpc_auth import CallerIdentity
from strata.service import ServiceParts, service_main
from strata.v1 import annotation_pb2_grpc
from svc_annotation.config import AnnotationSettings
from svc_annotation.core import GoldItem, parse_gold
from svc_annotation.drift_book import DriftBook
from svc_annotation.servicer import SERVICE_NAME, AnnotationServicer
from svc_annotation.store import AnnotationStore
from svc_annotation.web import WebServer, create_app
from svc_annotation.worker import AnnotationWorker, DeskLoop

log = logging.getLogger(__name__)


def read_gold(path: Path) -> list[GoldItem]:
    """The gold file: one ``{"prompt", "response", "score"}`` per line. Errors name the line, never
    its texts."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"gold_items_path {path}: {exc.strerror}") from exc
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        items.append(parse_gold(value, f"{path}:{number}"))
    return items


def build(settings: AnnotationSettings, clock: Callable[[], float] = time.time) -> ServiceParts:
    """Everything the desk runs; ``clock`` (epoch seconds) is injectable so tests move time."""
    gold = read_gold(settings.gold_items_path) if settings.gold_items_path is not None else []
    # Short timeouts and one immediate retry (a stale pooled connection after a Redis restart).
    client = redis.Redis.from_url(settings.redis_address, socket_timeout=settings.redis_timeout_s,
                                  socket_connect_timeout=settings.redis_timeout_s, retry=Retry(NoBackoff(), 1))
    content = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    store = AnnotationStore(client, content, settings.redis_prefix, settings.rules(), settings.item_retention_s, clock)
    publisher = Publisher(settings, client_id="svc-annotation")
    handler = AnnotationWorker(store, content)
    worker = Worker(settings, settings.group_id, publisher=publisher,
                    batch_handlers={topics.ANNOTATIONS_REQUESTED: handler.handle_batch})
    drift = DriftBook(client, settings.redis_prefix)
    loop = DeskLoop(store, publisher, client, f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
                    settings.loop_interval_s, settings.loop_batch, settings.publisher_lease_s, gold,
                    gold_refresh_s=settings.content_ttl_s / 2, drift=drift)
    tokens = token_table(settings)
    servicer = AnnotationServicer(store, CallerIdentity(tokens), drift)
    binding = ServiceBinding(annotation_pb2_grpc.add_AnnotationServicer_to_server, servicer, SERVICE_NAME)
    loops, on_stop = [loop.run], [publisher.close, client.close]
    if settings.web_port:
        # The web page logs annotators in with the gRPC edge's tokens and serves HTTPS with its certificate.
        tls = None
        if settings.grpc_tls_cert is not None and settings.grpc_tls_key is not None:
            tls = (str(settings.grpc_tls_cert), str(settings.grpc_tls_key))
        secret = settings.web_secret_key.get_secret_value() if settings.web_secret_key else None
        app = create_app(store, tokens, settings.leads(), secret, secure_cookies=tls is not None, drift=drift)
        web = WebServer(app, settings.web_bind_host, settings.web_port, tls)
        loops.append(web.run)
        on_stop.insert(0, web.close)
        if tokens is None:
            log.warning("svc_annotation: no grpc_tokens_file, so nobody can log in to the web page %s", web.url)
    return ServiceParts("svc_annotation", settings, [binding], settings.grpc_port, workers=[worker],
                        loops=loops, on_stop=on_stop)


def main(argv: Sequence[str] | None = None) -> int:
    return service_main(AnnotationSettings, build, "python -m svc_annotation", __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
