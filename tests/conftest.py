"""Session fixtures: the real Kafka and Redis every integration test runs against.

Order of preference:
1. ``STRATA_KAFKA_BOOTSTRAP`` / ``STRATA_REDIS_URL`` set: use those clusters, start nothing;
2. ``STRATA_TEST_INFRA=testcontainers`` and a Docker engine: Kafka and Redis containers;
3. otherwise: ``strata infra up`` on free ports with a throw-away state dir (Maven jars and
   Debian's redis-server), stopped at the end of the session.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from strata.bus.admin import ensure_topics
from strata.bus.topics import Topic
from strata.config import StrataSettings
from strata.v1 import events_pb2
from strata_tools.infra import down, up
from strata_tools.infra.process import free_port

if TYPE_CHECKING:
    from strata_tools.zoo.build import ZooPaths


# The session's Kafka and Redis settings, wherever they run. Tests restart consumers often: a dead
# member should not hold partitions for long, and retries should not wait.
TEST_TUNING: dict[str, Any] = {
    "topic_partitions": 3, "consumer_session_timeout_ms": 6_000, "consumer_heartbeat_interval_ms": 1_000,
    "retry_backoff_initial_s": 0.05, "retry_backoff_max_s": 0.2, "max_delivery_attempts": 3,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that reaches the session's Kafka and Redis as ``integration``, so that
    `make test-fast` (``-m 'not integration and not slow'``) never starts them, whatever the file says."""
    for item in items:
        if "infra" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


def _processes_under(path: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose command line names ``path`` (Kafka, Redis,
    Sentinels and services a fixture started with a state dir there)."""
    from strata_tools.infra.process import process_cmdline

    marker = str(path)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            cmdline = process_cmdline(int(entry.name))
            if marker in cmdline:
                found.append((int(entry.name), cmdline))
    return found


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every process a fixture started is stopped by its teardown: one left behind fails the session
    (after it is killed, so that it does not outlive CI), named with its command line."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or not Path("/proc").is_dir():
        return
    try:
        basetemp = factory.getbasetemp()
    except (OSError, ValueError):
        return
    leaked = _processes_under(basetemp)
    if not leaked:
        return
    from strata_tools.infra.process import kill_pid

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
    for pid, cmdline in leaked:
        kill_pid(pid)
        if reporter is not None:
            reporter.write_line(f"LEFT RUNNING by a test fixture, now killed: pid {pid}: {cmdline[:300]}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _testcontainers_settings(stack: list) -> StrataSettings:
    """Kafka (one KRaft node) and Redis in containers, from the images compose.yaml runs
    (``STRATA_TEST_KAFKA_IMAGE``, ``STRATA_TEST_REDIS_IMAGE``): the official ones, or the stand-ins
    ``deploy/images/build.sh`` tags under their names. Both Kafka images read the broker's settings
    from KAFKA_* variables, so the container is configured that way rather than by testcontainers'
    Kafka module, which scripts Confluent's image."""
    from testcontainers.community.redis import RedisContainer
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    # Published at the same number on the host: the broker advertises the address its clients dial.
    port = free_port()
    kafka = (DockerContainer(os.environ.get("STRATA_TEST_KAFKA_IMAGE", "apache/kafka:4.1.1"))
             .with_bind_ports(port, port)
             .waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(120)))
    for name, value in {
        "NODE_ID": "1", "PROCESS_ROLES": "broker,controller", "CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "LISTENERS": f"PLAINTEXT://:{port},CONTROLLER://:9093",
        "ADVERTISED_LISTENERS": f"PLAINTEXT://localhost:{port}",
        "LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "CONTROLLER_QUORUM_VOTERS": "1@localhost:9093", "OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1", "TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "GROUP_INITIAL_REBALANCE_DELAY_MS": "0", "AUTO_CREATE_TOPICS_ENABLE": "false",
    }.items():
        kafka.with_env(f"KAFKA_{name}", value)
    redis_container = RedisContainer(os.environ.get("STRATA_TEST_REDIS_IMAGE", "redis:7"))
    stack += [kafka, redis_container]  # stopped by the fixture, even when one fails to start
    kafka.start()
    redis_container.start()
    host = redis_container.get_container_host_ip()
    return StrataSettings(kafka_bootstrap=f"localhost:{port}",
                          redis_url=f"redis://{host}:{redis_container.get_exposed_port(6379)}/0", **TEST_TUNING)


@pytest.fixture(scope="session")
def infra(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StrataSettings]:
    """Settings pointing at a running Kafka and Redis, with Strata's topics created."""
    configured = StrataSettings()
    if not configured.kafka_managed and not configured.redis_managed:
        up(configured)
        yield configured
        return
    if os.environ.get("STRATA_TEST_INFRA") == "testcontainers":
        containers: list = []
        try:
            settings = _testcontainers_settings(containers)
            up(settings)
            yield settings
        finally:
            for container in containers:
                if container.get_wrapped_container() is not None:  # started (or tried to)
                    container.stop()
        return
    state_dir = Path(tmp_path_factory.mktemp("strata-state"))
    settings = StrataSettings(
        state_dir=state_dir,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        redis_port=free_port(),
        **TEST_TUNING,
    )
    up(settings)
    try:
        yield settings
    finally:
        down(settings, purge=True)


@pytest.fixture
def redis_client(infra: StrataSettings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(infra.redis_address)
    yield client
    client.close()


@pytest.fixture
def fresh_topic(infra: StrataSettings) -> Topic[events_pb2.PromptRouted]:
    """A topic of PromptRouted events used by one test only (and its .dlq twin)."""
    topic = Topic(f"test.{uuid.uuid4().hex[:10]}", events_pb2.PromptRouted)
    ensure_topics(infra, infra.topic_partitions, topics=[topic])
    return topic


@pytest.fixture(scope="session")
def zoo() -> ZooPaths:
    """The model zoo's small ``ci`` preset (built once into the cache, then reused)."""
    from strata_tools.zoo.build import ZooSettings, ensure_zoo

    preset = os.environ.get("STRATA_TEST_ZOO_PRESET", "ci")
    return ensure_zoo(ZooSettings(zoo_preset=preset), progress=False)
