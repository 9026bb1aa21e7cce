"""A local Kafka (KRaft, each node a combined broker + controller) from Maven Central jars.

The broker's runtime jars are fetched once with ``mvn dependency:copy-dependencies`` from the pom
shipped in ``strata_tools/infra/data/pom.xml`` into ``<cache_dir>/kafka/<version>/libs`` (outside the
checkout, shared by every clone), storage is formatted once with ``kafka.tools.StorageTool``, and
the broker runs as ``kafka.Kafka`` with a generated ``server.properties``. Data lives under
``<state_dir>/kafka/data`` and survives ``down``/``up``.

With ``kafka_brokers`` > 1 there are that many nodes, one process each, all voters of one KRaft
quorum: node 1 keeps the single broker's paths, node *n* lives under ``<state_dir>/kafka/node-<n>``,
and node *i* (from 0) listens on ``kafka_port + 2i`` and ``kafka_controller_port + 2i``. Internal
topics are replicated ``min(3, brokers)`` times; Strata's own topics as ``topic_replication_factor``
says (``strata.bus.admin.ensure_topics``).

With ``kafka_security_protocol`` SASL_PLAINTEXT the client listener wants SASL/PLAIN and knows one
user, the settings' ``kafka_sasl_username``; the broker's own inter-broker connections log in as
that user too. The controller listener stays PLAINTEXT on loopback: only the broker process talks
to it. ``server.properties`` then holds the password and is written readable by its owner only.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import subprocess
import tempfile
import uuid
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from strata.bus.security import KafkaTarget, kafka_connection
from strata.config import StrataSettings
from strata_tools.infra.process import (
    InfraError,
    ensure_tool,
    halt,
    owned_pid,
    port_open,
    start_detached,
    wait_serving,
)

log = logging.getLogger(__name__)

_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
_MAIN_CLASS = "kafka.Kafka"
# The PLAIN login module takes users as option names (user_<name>="<password>"): a plain word.
_SASL_USERNAME = re.compile(r"[A-Za-z0-9._-]+")


def _data_file(name: str) -> Path:
    return Path(str(resources.files("strata_tools.infra") / "data" / name))


def kafka_version() -> str:
    """The Kafka version pinned in the shipped pom."""
    root = ET.parse(_data_file("pom.xml")).getroot()
    node = root.find("m:properties/m:kafka.version", _POM_NS)
    if node is None or not node.text:
        raise InfraError("strata_tools/infra/data/pom.xml has no <kafka.version> property")
    return node.text.strip()


@dataclass(frozen=True)
class KafkaPaths:
    libs: Path
    home: Path          # <state_dir>/kafka
    data: Path
    logs: Path
    properties: Path
    pid_file: Path
    stdout: Path
    cluster_id_file: Path

    @classmethod
    def of(cls, settings: StrataSettings, node: int = 1) -> KafkaPaths:
        root = settings.state_dir.resolve() / "kafka"
        home = root if node == 1 else root / f"node-{node}"
        return cls(
            libs=settings.cache_dir.expanduser().resolve() / "kafka" / kafka_version() / "libs",
            home=home, data=home / "data", logs=home / "logs", properties=home / "server.properties",
            # One cluster id for every node: they format their storage as members of one cluster.
            pid_file=home / "kafka.pid", stdout=home / "kafka.out", cluster_id_file=root / "cluster.id",
        )


def nodes(settings: StrataSettings) -> list[int]:
    """The local brokers' node ids, 1 first."""
    return list(range(1, settings.kafka_brokers + 1))


def fetch_jars(paths: KafkaPaths) -> None:
    """Copy the broker's runtime jars from Maven Central into the cache (once)."""
    if paths.libs.is_dir() and any(paths.libs.glob("kafka_2.13-*.jar")):
        return
    mvn = ensure_tool("mvn", "maven", "fetches Kafka's jars from Maven Central",
                      "Install Maven (apt-get install maven), or set STRATA_KAFKA_BOOTSTRAP to an existing Kafka.")
    paths.libs.parent.mkdir(parents=True, exist_ok=True)
    log.info("fetching Kafka %s jars from Maven Central into %s", kafka_version(), paths.libs)
    # Into a temporary sibling first, renamed at the end: a half-fetched directory is never used.
    staging = Path(tempfile.mkdtemp(prefix="libs.", dir=paths.libs.parent))
    try:
        result = subprocess.run(
            [mvn, "-q", "-B", "-f", str(_data_file("pom.xml")), "dependency:copy-dependencies",
             f"-DoutputDirectory={staging}", "-DincludeScope=runtime"],
            capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise InfraError(f"mvn could not fetch Kafka's jars:\n{(result.stdout + result.stderr)[-1500:]}")
        staging.rename(paths.libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _classpath(paths: KafkaPaths) -> str:
    return f"{paths.libs}/*"


def _jaas_quoted(value: str) -> str:
    # JAAS options are double-quoted strings with backslash escapes.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _properties_escaped(value: str) -> str:
    # Kafka loads server.properties as ISO-8859-1 with backslash escapes: escape "\\" and anything
    # outside printable ASCII, so any password reads back as written.
    out = []
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif " " <= ch <= "~":
            out.append(ch)
        else:  # \uXXXX per UTF-16 unit: a character beyond the BMP is two
            units = ch.encode("utf-16-be")
            out.extend(f"\\u{units[i:i + 2].hex()}" for i in range(0, len(units), 2))
    return "".join(out)


def _sasl_lines(settings: StrataSettings) -> dict[str, str]:
    """The SASL/PLAIN listener's properties: one user, the settings' own."""
    username, password = settings.kafka_sasl_username or "", settings.kafka_sasl_password
    if password is None or not _SASL_USERNAME.fullmatch(username):
        raise InfraError("the local Kafka's SASL user must be letters, digits, '.', '_' or '-' "
                         "(STRATA_KAFKA_SASL_USERNAME), with a password (STRATA_KAFKA_SASL_PASSWORD)")
    secret = _jaas_quoted(password.get_secret_value())
    jaas = (f"org.apache.kafka.common.security.plain.PlainLoginModule required "
            f"username={_jaas_quoted(username)} password={secret} user_{username}={secret};")
    return {
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": _properties_escaped(jaas),
    }


def write_properties(settings: StrataSettings, paths: KafkaPaths, node: int = 1) -> None:
    ports = settings.kafka_node_ports()
    port, controller = ports[node - 1]
    voters = ",".join(f"{n}@127.0.0.1:{c}" for n, (_, c) in enumerate(ports, start=1))
    internal_copies = str(min(3, settings.kafka_brokers))
    internal_min_isr = str(min(settings.min_insync_replicas, min(3, settings.kafka_brokers)))
    # The settings validator leaves the managed broker PLAINTEXT or SASL_PLAINTEXT.
    listener = settings.kafka_security_protocol
    lines = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        "controller.quorum.voters": voters,
        "listeners": f"{listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"{listener}://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": listener,
        **(_sasl_lines(settings) if listener == "SASL_PLAINTEXT" else {}),
        "log.dirs": str(paths.data),
        "num.partitions": str(settings.topic_partitions),
        "default.replication.factor": str(settings.replication_factor),
        "min.insync.replicas": str(settings.min_insync_replicas),
        "offsets.topic.replication.factor": internal_copies,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": internal_copies,
        "transaction.state.log.min.isr": internal_min_isr,
        "share.coordinator.state.topic.replication.factor": internal_copies,
        "share.coordinator.state.topic.min.isr": internal_min_isr,
        # A joining consumer starts at once instead of waiting 3 s for more members.
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "log.retention.hours": "168",
    }
    paths.home.mkdir(parents=True, exist_ok=True)
    text = "# Generated by `strata infra up`; edits are overwritten.\n"
    text += "".join(f"{key}={value}\n" for key, value in lines.items())
    # Owner-only from the first byte: with SASL on, the file holds the password.
    fd = os.open(paths.properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file written by an older version may be world-readable
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def _java() -> str:
    return ensure_tool("java", "openjdk-17-jre-headless", "runs the Kafka broker (Java 17+)",
                       "Install a Java 17+ runtime, or set STRATA_KAFKA_BOOTSTRAP to an existing Kafka.")


def format_storage(paths: KafkaPaths) -> None:
    """Format the log dir once; an already formatted dir is left alone (data is kept)."""
    if (paths.data / "meta.properties").exists():
        return
    if paths.cluster_id_file.exists():
        cluster_id = paths.cluster_id_file.read_text().strip()
    else:
        # Kafka cluster ids are 16 random bytes, URL-safe base64 without padding.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        paths.cluster_id_file.write_text(cluster_id + "\n")
    result = subprocess.run(
        [_java(), "-cp", _classpath(paths), f"-Dlog4j2.configurationFile={_data_file('log4j2.properties')}",
         f"-Dkafka.logs.dir={paths.logs}", "kafka.tools.StorageTool", "format",
         # "=" form: a base64 id may start with "-", which argparse would take for an option.
         f"--cluster-id={cluster_id}", "-c", str(paths.properties), "--ignore-formatted"],
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise InfraError(f"formatting Kafka storage failed:\n{(result.stdout + result.stderr)[-1500:]}")


def running_pid(settings: StrataSettings, node: int = 1) -> int | None:
    paths = KafkaPaths.of(settings, node)
    return owned_pid(paths.pid_file, str(paths.properties))


def running_pids(settings: StrataSettings) -> dict[int, int | None]:
    return {node: running_pid(settings, node) for node in nodes(settings)}


def node_target(settings: StrataSettings, node: int) -> StrataSettings:
    """Settings whose bootstrap is ``node`` alone: to ask one broker, not the cluster."""
    port = settings.kafka_node_ports()[node - 1][0]
    return settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{port}"})


def start(settings: StrataSettings) -> int:
    """Start every local broker that is not running; returns node 1's pid once all answer.

    All nodes are launched before any is waited for: a KRaft quorum of three elects a leader (and a
    broker answers) only once a majority of its voters runs."""
    launched = {node: start_node(settings, node, wait=False) for node in nodes(settings)}
    for node, pid in launched.items():
        _wait_node(settings, node, pid)
    return launched[1]


def start_node(settings: StrataSettings, node: int, wait: bool = True) -> int:
    """Start one broker if it is not running (``wait``: until it answers); returns its pid."""
    paths = KafkaPaths.of(settings, node)
    pid = running_pid(settings, node)
    if pid is None:
        port, controller = settings.kafka_node_ports()[node - 1]
        for name, taken in (("Kafka", port), ("Kafka controller", controller)):
            if port_open("127.0.0.1", taken):
                raise InfraError(
                    f"port {taken} ({name}{f' of broker {node}' if settings.kafka_brokers > 1 else ''}) is taken "
                    "by another process. Free it, choose other ports (STRATA_KAFKA_PORT / "
                    "STRATA_KAFKA_CONTROLLER_PORT), or point STRATA_KAFKA_BOOTSTRAP at that cluster."
                )
        fetch_jars(paths)
        write_properties(settings, paths, node)
        format_storage(paths)
        paths.logs.mkdir(parents=True, exist_ok=True)
        argv = [
            _java(), f"-Xmx{settings.kafka_heap}", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={_data_file('log4j2.properties')}", f"-Dkafka.logs.dir={paths.logs}",
            "-cp", _classpath(paths), _MAIN_CLASS, str(paths.properties),
        ]
        pid = start_detached(argv, paths.stdout, paths.pid_file, env=dict(os.environ))
        log.info("started Kafka %s node %d (pid %d) on 127.0.0.1:%d", kafka_version(), node, pid, port)
    if wait:
        _wait_node(settings, node, pid)
    return pid


def _wait_node(settings: StrataSettings, node: int, pid: int) -> None:
    paths = KafkaPaths.of(settings, node)
    target = node_target(settings, node) if settings.kafka_brokers > 1 else settings
    name = "Kafka" if settings.kafka_brokers == 1 else f"Kafka broker {node}"
    wait_serving(pid, name, "the broker", paths.logs / "server.log", lambda: answers(target),
                 settings.infra_start_timeout_s)


def stop(settings: StrataSettings, timeout_s: float = 60.0) -> bool:
    """Stop every broker this state dir started (controlled shutdown). False when none was running."""
    if settings.kafka_brokers == 1:
        return stop_node(settings, 1, timeout_s)
    # All at once: one by one, the last brokers would wait out the grace period for a quorum that
    # the first ones took with them.
    with ThreadPoolExecutor(max_workers=settings.kafka_brokers) as pool:
        stopped = list(pool.map(lambda node: stop_node(settings, node, timeout_s), nodes(settings)))
    return any(stopped)


def stop_node(settings: StrataSettings, node: int, timeout_s: float = 60.0, kill: bool = False) -> bool:
    """Stop one broker (``kill``: SIGKILL at once, as a crash would). False when it was not running."""
    paths = KafkaPaths.of(settings, node)
    pid = running_pid(settings, node)
    if pid is None:
        paths.pid_file.unlink(missing_ok=True)
        return False
    how = halt(pid, paths.pid_file, timeout_s, kill)
    log.info("%s Kafka node %d (pid %d)", how, node, pid)
    return True


def answers(cluster: KafkaTarget, timeout_s: float = 5.0) -> bool:
    """True when the cluster answers a metadata request (logging in as the settings say)."""
    connection = kafka_connection(cluster)
    host, _, port = connection["bootstrap_servers"].split(",")[0].rpartition(":")
    if not port_open(host or "127.0.0.1", int(port)):
        return False
    try:
        # A bounded bootstrap: a broker that refuses the login is retried until this runs out.
        admin = KafkaAdminClient(**connection, client_id="strata-infra-probe",
                                 request_timeout_ms=int(timeout_s * 1000), bootstrap_timeout_ms=int(timeout_s * 1000))
    except (KafkaError, OSError, ValueError):
        return False
    try:
        admin.list_topics()
        return True
    except (KafkaError, OSError):
        return False
    finally:
        admin.close()
