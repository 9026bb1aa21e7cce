"""Local infrastructure: ``strata infra up | down | status``.

Starts a single-node Kafka and a Redis for local work and tests, unless the settings point at
existing clusters (``STRATA_KAFKA_BOOTSTRAP``, ``STRATA_REDIS_URL``), in which case nothing is
started and only reachability is checked. ``up`` is idempotent, waits until both answer and creates
the topics; ``down`` stops only what this state dir started and keeps the data. Every probe logs in
as the settings say (docs/security.md); addresses are shown with passwords masked.
"""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from strata import redis_client
from strata.bus.admin import ensure_topics
from strata.config import StrataSettings
from strata.epoch import ensure_marker
from strata_tools.infra import kafka_broker, redis_server
from strata_tools.infra.process import InfraError

__all__ = ["ComponentStatus", "InfraError", "down", "status", "up"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    address: str        # passwords masked: this is printed
    managed: bool       # started by Strata from this state dir (False: an external cluster)
    pid: int | None
    healthy: bool
    auth: str = "none"  # how clients log in: "none", or e.g. "SASL_PLAINTEXT/PLAIN", "password"

    @property
    def state(self) -> str:
        if self.healthy:
            return "up"
        if self.managed and self.pid is not None:
            return "no answer"  # running, but refuses our login or is still starting
        return "down" if self.managed else "unreachable"


@contextmanager
def _lock(settings: StrataSettings) -> Iterator[None]:
    """Serialise up/down of one state dir (parallel test workers, two terminals)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    with open(settings.state_dir / "infra.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


SHAPE_FIELDS = ("kafka_brokers", "redis_replicas")


def _shape_file(settings: StrataSettings) -> Path:
    return settings.state_dir / "infra-shape.json"


def recorded_shape(settings: StrataSettings) -> dict[str, int]:
    """How many brokers and Redis replicas the last ``up`` of this state dir started ({} if none)."""
    try:
        shape = json.loads(_shape_file(settings).read_text())
    except (OSError, ValueError):
        return {}
    return {key: int(shape[key]) for key in SHAPE_FIELDS if key in shape}


def _check_shape(settings: StrataSettings) -> None:
    """Refuse to start a cluster of another shape over one that still runs: its ports and quorum differ."""
    shape = recorded_shape(settings)
    wanted = {key: getattr(settings, key) for key in SHAPE_FIELDS}
    if not shape or shape == wanted:
        return
    stopped_by = settings.model_copy(update=shape)
    if any(pid is not None for pid in kafka_broker.running_pids(stopped_by).values()) or \
            redis_server.running_pid(stopped_by) is not None:
        raise InfraError(
            f"this state dir runs {shape['kafka_brokers']} Kafka broker(s) and {shape['redis_replicas']} Redis "
            f"replica(s), not {wanted['kafka_brokers']} and {wanted['redis_replicas']}: stop them first "
            "(`strata infra down`), or set STRATA_KAFKA_BROKERS / STRATA_REDIS_REPLICAS as they were"
        )


def up(settings: StrataSettings, create_topics: bool = True) -> list[ComponentStatus]:
    """Start what is managed and missing, wait until everything answers, create topics."""
    with _lock(settings):
        _check_shape(settings)
        _shape_file(settings).write_text(json.dumps({key: getattr(settings, key) for key in SHAPE_FIELDS}) + "\n")
        if settings.redis_managed:
            redis_server.start(settings)
        elif not redis_server.answers(settings.redis_address):
            raise InfraError(f"Redis at {settings.redis_address_masked} (STRATA_REDIS_URL) does not answer")
        if settings.kafka_managed:
            kafka_broker.start(settings)
        elif not kafka_broker.answers(settings):
            raise InfraError(f"Kafka at {settings.kafka_address} (STRATA_KAFKA_BOOTSTRAP) does not answer")
        if create_topics:
            ensure_topics(settings, settings.topic_partitions, replication_factor=settings.replication_factor,
                          min_insync_replicas=settings.min_insync_replicas)
        _mark_epoch(settings)
    return status(settings)


def _mark_epoch(settings: StrataSettings) -> None:
    """The epoch marker (``strata.epoch``), so that a Redis that comes back empty later is recognised."""
    client = redis_client.connect(settings.redis_address, socket_timeout=5, socket_connect_timeout=5)
    try:
        marker, created = ensure_marker(client, "strata infra up")
        if created:
            log.info("Redis epoch marker %s written", marker.id)
    except (redis.RedisError, ValueError) as exc:
        log.warning("Redis epoch marker not written: %s", exc)
    finally:
        client.close()


def down(settings: StrataSettings, purge: bool = False) -> list[str]:
    """Stop what this state dir started; returns the names stopped. ``purge`` also deletes data."""
    stopped: list[str] = []
    with _lock(settings):
        # Whatever the last `up` started goes, even when these settings name fewer brokers or replicas.
        shape = recorded_shape(settings)
        settings = settings.model_copy(update={key: max(getattr(settings, key), shape.get(key, 0))
                                               for key in SHAPE_FIELDS})
        # Each goes whatever the other did: a broker that fails to stop must not leave Redis running.
        failures: list[Exception] = []
        for name, managed, stop in (("kafka", settings.kafka_managed, kafka_broker.stop),
                                    ("redis", settings.redis_managed, redis_server.stop)):
            try:
                if managed and stop(settings):
                    stopped.append(name)
            except Exception as exc:  # re-raised below, once the other one is stopped too
                log.error("stopping %s failed: %s", name, exc)
                failures.append(exc)
        if failures:
            raise failures[0]
        if purge:
            for sub in ("kafka", "redis"):
                shutil.rmtree(settings.state_dir / sub, ignore_errors=True)
            _shape_file(settings).unlink(missing_ok=True)
            log.info("purged Kafka and Redis data under %s", settings.state_dir)
    return stopped


def status(settings: StrataSettings) -> list[ComponentStatus]:
    """One row per Kafka cluster and Redis (a local cluster: one per broker, replica and Sentinel too)."""
    shape = recorded_shape(settings)
    settings = settings.model_copy(update={key: value for key, value in shape.items()
                                           if key not in settings.model_fields_set})
    kafka_auth = settings.kafka_security_protocol
    if kafka_auth.startswith("SASL_"):
        kafka_auth += f"/{settings.kafka_sasl_mechanism}"
    kafka_auth = "none" if kafka_auth == "PLAINTEXT" else kafka_auth
    redis_auth = "password" if settings.redis_auth else "none"
    if settings.redis_address.startswith("rediss://"):
        redis_auth = "TLS" if redis_auth == "none" else "TLS+password"
    rows = []
    if settings.kafka_managed and settings.kafka_brokers > 1:
        for node, pid in kafka_broker.running_pids(settings).items():
            target = kafka_broker.node_target(settings, node)
            rows.append(ComponentStatus(f"kafka-{node}", target.kafka_address, True, pid,
                                        pid is not None and kafka_broker.answers(target), kafka_auth))
    else:
        kafka_pid = kafka_broker.running_pid(settings) if settings.kafka_managed else None
        kafka_up = (kafka_pid is not None or not settings.kafka_managed) and kafka_broker.answers(settings)
        rows.append(ComponentStatus("kafka", settings.kafka_address, settings.kafka_managed, kafka_pid, kafka_up,
                                    kafka_auth))
    redis_pid = redis_server.running_pid(settings) if settings.redis_managed else None
    rows.append(ComponentStatus("redis", settings.redis_address_masked, settings.redis_managed, redis_pid,
                                (redis_pid is not None or not settings.redis_managed)
                                and redis_server.answers(settings.redis_address),
                                redis_auth))
    if settings.redis_managed and settings.redis_replicas:
        for node in redis_server.redis_nodes(settings)[1:]:
            pid = redis_server.running_pid(settings, node)
            url = redis_server.node_url(settings, node)
            rows.append(ComponentStatus(node.name, f"127.0.0.1:{node.port}", True, pid,
                                        pid is not None and redis_server.answers(url),
                                        "none" if node.role == "sentinel" else redis_auth))
    return rows
