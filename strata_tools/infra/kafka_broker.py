"""A local single-node Kafka (KRaft, combined broker + controller) from Maven Central jars.

The broker's runtime jars are fetched once with ``mvn dependency:copy-dependencies`` from the pom
shipped in ``strata_tools/infra/data/pom.xml`` into ``<cache_dir>/kafka/<version>/libs`` (outside the
checkout, shared by every clone), storage is formatted once with ``kafka.tools.StorageTool``, and
the broker runs as ``kafka.Kafka`` with a generated ``server.properties``. Data lives under
``<state_dir>/kafka/data`` and survives ``down``/``up``.

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
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from strata.bus.security import KafkaTarget, kafka_connection
from strata.config import StrataSettings
from strata_tools.infra.process import (
    InfraError,
    ensure_tool,
    owned_pid,
    port_open,
    start_detached,
    stop_pid,
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
    def of(cls, settings: StrataSettings) -> KafkaPaths:
        home = settings.state_dir.resolve() / "kafka"
        return cls(
            libs=settings.cache_dir.expanduser().resolve() / "kafka" / kafka_version() / "libs",
            home=home, data=home / "data", logs=home / "logs", properties=home / "server.properties",
            pid_file=home / "kafka.pid", stdout=home / "kafka.out", cluster_id_file=home / "cluster.id",
        )


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


def write_properties(settings: StrataSettings, paths: KafkaPaths) -> None:
    port, controller = settings.kafka_port, settings.kafka_controller_port
    # The settings validator leaves the managed broker PLAINTEXT or SASL_PLAINTEXT.
    listener = settings.kafka_security_protocol
    lines = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        "listeners": f"{listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
        "advertised.listeners": f"{listener}://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": listener,
        **(_sasl_lines(settings) if listener == "SASL_PLAINTEXT" else {}),
        "log.dirs": str(paths.data),
        "num.partitions": str(settings.topic_partitions),
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
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


def running_pid(settings: StrataSettings) -> int | None:
    paths = KafkaPaths.of(settings)
    return owned_pid(paths.pid_file, str(paths.properties))


def start(settings: StrataSettings) -> int:
    """Start the broker if it is not running; returns its pid once it answers."""
    paths = KafkaPaths.of(settings)
    pid = running_pid(settings)
    if pid is None:
        for name, port in (("Kafka", settings.kafka_port), ("Kafka controller", settings.kafka_controller_port)):
            if port_open("127.0.0.1", port):
                raise InfraError(
                    f"port {port} ({name}) is taken by another process. Free it, choose other ports "
                    "(STRATA_KAFKA_PORT / STRATA_KAFKA_CONTROLLER_PORT), or point STRATA_KAFKA_BOOTSTRAP "
                    "at that cluster."
                )
        fetch_jars(paths)
        write_properties(settings, paths)
        format_storage(paths)
        paths.logs.mkdir(parents=True, exist_ok=True)
        argv = [
            _java(), f"-Xmx{settings.kafka_heap}", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={_data_file('log4j2.properties')}", f"-Dkafka.logs.dir={paths.logs}",
            "-cp", _classpath(paths), _MAIN_CLASS, str(paths.properties),
        ]
        pid = start_detached(argv, paths.stdout, paths.pid_file, env=dict(os.environ))
        log.info("started Kafka %s (pid %d) on 127.0.0.1:%d", kafka_version(), pid, settings.kafka_port)

    wait_serving(pid, "Kafka", "the broker", paths.logs / "server.log", lambda: answers(settings),
                 settings.infra_start_timeout_s)
    return pid


def stop(settings: StrataSettings, timeout_s: float = 60.0) -> bool:
    """Stop the broker this state dir started (controlled shutdown). False when none was running."""
    paths = KafkaPaths.of(settings)
    pid = running_pid(settings)
    if pid is None:
        paths.pid_file.unlink(missing_ok=True)
        return False
    graceful = stop_pid(pid, timeout_s)
    paths.pid_file.unlink(missing_ok=True)
    log.info("stopped Kafka (pid %d)%s", pid, "" if graceful else " with SIGKILL after the grace period")
    return True


def answers(cluster: KafkaTarget, timeout_s: float = 5.0) -> bool:
    """True when the cluster answers a metadata request (logging in as the settings say)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

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
