"""`strata infra up` with authentication on: a throw-away SASL/PLAIN Kafka and a Redis with an ACL
user, on free ports. The right credentials work for every client; none or wrong ones are refused."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaTimeoutError
from redis.backoff import NoBackoff
from redis.retry import Retry

from strata.bus import Publisher
from strata.bus.admin import ensure_topics
from strata.bus.security import kafka_connection
from strata.bus.topics import Topic
from strata.config import StrataSettings
from strata.content_store import ContentStore
from strata.hashing import content_hash
from strata.v1 import events_pb2
from strata_tools.cli.main import main as strata_main
from strata_tools.infra import down, redis_server, status, up
from strata_tools.infra.kafka_broker import KafkaPaths
from strata_tools.infra.process import InfraError, free_port, process_cmdline, wait_until

pytestmark = pytest.mark.integration

# Quotes, a backslash, a space and non-ASCII: each escaping layer (JAAS, server.properties,
# redis.conf, the Redis URL) must carry them through unchanged.
KAFKA_PASSWORD = 'k "pa\\ss" é-1'
REDIS_PASSWORD = 'r:p@ss/"w\\rd" é'
# Refused clients give up after this; the broker closes their connection at once, but kafka-python
# retries the bootstrap until its timeout.
REFUSED_BOOTSTRAP_MS = 3_000


def _auth_settings(state_dir: Path, **overrides: object) -> StrataSettings:
    # Every field that the environment could also set (make test-auth sets some) is explicit.
    fields: dict = {
        "state_dir": state_dir, "kafka_bootstrap": None, "redis_url": None,
        "kafka_port": free_port(), "kafka_controller_port": free_port(), "redis_port": free_port(),
        "topic_partitions": 1, "kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN",
        "kafka_sasl_username": "strata-test", "kafka_sasl_password": KAFKA_PASSWORD,
        "redis_username": "strata-test", "redis_password": REDIS_PASSWORD,
    }
    return StrataSettings(**{**fields, **overrides})


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StrataSettings]:
    settings = _auth_settings(tmp_path_factory.mktemp("strata-auth"))
    try:
        up(settings, create_topics=False)
        yield settings
    finally:
        down(settings, purge=True)


@pytest.fixture
def topic(secured: StrataSettings) -> Topic[events_pb2.PromptRouted]:
    created = Topic(f"test.auth.{uuid.uuid4().hex[:8]}", events_pb2.PromptRouted)
    ensure_topics(secured, 1, topics=[created])
    return created


def test_the_right_credentials_produce_and_consume(secured: StrataSettings, topic: Topic) -> None:
    message = events_pb2.PromptRouted(prompt_hash=content_hash(f"auth {uuid.uuid4()}"))
    publisher = Publisher(secured, client_id="test-auth")
    try:
        publisher.publish_and_wait(topic, message)  # acks=all: the broker's own replication path works too
    finally:
        publisher.close()
    consumer = KafkaConsumer(topic.name, **kafka_connection(secured), auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=30_000)
    try:
        record = next(iter(consumer))
    finally:
        consumer.close()
    assert events_pb2.PromptRouted.FromString(record.value) == message


def _broker_logged(settings: StrataSettings, text: str, timeout_s: float = 10.0) -> bool:
    """Whether the broker's log shows ``text`` (it is written a moment after the event)."""
    log_file = KafkaPaths.of(settings).logs / "server.log"
    try:
        wait_until(lambda: text in log_file.read_text(errors="replace"), timeout_s, "broker log")
    except InfraError:
        return False
    return True


def test_kafka_refuses_a_client_without_credentials(secured: StrataSettings) -> None:
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(bootstrap_servers=secured.kafka_address, bootstrap_timeout_ms=REFUSED_BOOTSTRAP_MS)
    # A PLAINTEXT client's first request arrives where the broker wants a SASL handshake: dropped.
    assert _broker_logged(secured, "during SASL handshake")


def test_kafka_refuses_a_wrong_password(secured: StrataSettings) -> None:
    wrong = {**kafka_connection(secured), "sasl_plain_password": "not-the-password"}
    # kafka-python retries a refused login until its bootstrap times out; the broker says why.
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaAdminClient(**wrong, bootstrap_timeout_ms=REFUSED_BOOTSTRAP_MS)
    assert _broker_logged(secured, "Failed authentication with /127.0.0.1")
    assert _broker_logged(secured, "Invalid username or password")


def test_redis_needs_the_acl_user(secured: StrataSettings) -> None:
    store = ContentStore.from_url(secured.redis_address, secured.content_ttl_s, secured.content_max_bytes)
    text = f"secured {uuid.uuid4()}"
    assert store.get_text(store.put(text)) == text

    # No retries: redis-py retries an AuthenticationError (a ConnectionError) with backoff by default.
    once = {"host": "127.0.0.1", "port": secured.redis_port, "retry": Retry(NoBackoff(), 0)}
    anonymous = redis.Redis(**once)
    wrong = redis.Redis(**once, username="strata-test", password="nope")
    default_user = redis.Redis(**once, password=REDIS_PASSWORD)
    try:
        with pytest.raises(redis.AuthenticationError):
            anonymous.set("strata:auth:probe", b"1")
        with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"):
            wrong.ping()
        with pytest.raises(redis.AuthenticationError):
            default_user.ping()  # the default user is off: the password alone logs nobody in
    finally:
        for client in (anonymous, wrong, default_user):
            client.close()


def test_secrets_stay_off_command_lines_and_in_owner_only_files(secured: StrataSettings) -> None:
    rows = {row.name: row for row in status(secured)}
    for name in ("kafka", "redis"):
        cmdline = process_cmdline(rows[name].pid or 0)
        assert cmdline and KAFKA_PASSWORD not in cmdline and REDIS_PASSWORD not in cmdline
    for path in (KafkaPaths.of(secured).properties, redis_server.RedisPaths.of(secured).auth_conf):
        assert path.stat().st_mode & 0o077 == 0, f"{path} is readable by others"


def test_status_says_auth_is_on_and_prints_no_secret(
    secured: StrataSettings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in {
        "STATE_DIR": secured.state_dir, "KAFKA_PORT": secured.kafka_port, "REDIS_PORT": secured.redis_port,
        "KAFKA_CONTROLLER_PORT": secured.kafka_controller_port, "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KAFKA_SASL_MECHANISM": "PLAIN", "KAFKA_SASL_USERNAME": "strata-test",
        "KAFKA_SASL_PASSWORD": KAFKA_PASSWORD, "REDIS_USERNAME": "strata-test", "REDIS_PASSWORD": REDIS_PASSWORD,
    }.items():
        monkeypatch.setenv(f"STRATA_{name}", str(value))
    for name in ("STRATA_KAFKA_BOOTSTRAP", "STRATA_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    assert strata_main(["infra", "status"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert " up " in lines["kafka"] and "SASL_PLAINTEXT/PLAIN" in lines["kafka"]
    assert " up " in lines["redis"] and " password " in lines["redis"]
    assert f"redis://strata-test:***@127.0.0.1:{secured.redis_port}/0" in lines["redis"]
    assert "pa\\ss" not in out and "r:p@ss" not in out and "%22" not in out


def test_status_without_the_credentials_says_no_answer(secured: StrataSettings) -> None:
    anonymous = secured.model_copy(update={
        "kafka_security_protocol": "PLAINTEXT", "kafka_sasl_username": None, "kafka_sasl_password": None,
        "redis_username": None, "redis_password": None,
    })
    assert [(row.name, row.state) for row in status(anonymous)] == [("kafka", "no answer"), ("redis", "no answer")]


def test_redis_requirepass_without_a_username(tmp_path: Path) -> None:
    settings = _auth_settings(tmp_path, redis_username=None, redis_password="only-a-password")
    redis_server.start(settings)
    try:
        assert redis_server.answers(settings.redis_address)
        assert not redis_server.answers(f"redis://127.0.0.1:{settings.redis_port}/0")
        assert not redis_server.answers(f"redis://:wrong@127.0.0.1:{settings.redis_port}/0")
    finally:
        redis_server.stop(settings)


def _tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed (it makes the test certificates)")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
        "-subj", "/CN=strata-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
        "-subj", "/CN=127.0.0.1")
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "1", "-extfile", "san.cnf")
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"


def test_external_tls_redis_with_an_acl_user_in_the_url(tmp_path: Path) -> None:
    # What docs/security.md tells an operator to write: rediss://user:password@host:port/db?ssl_ca_certs=...
    ca, cert, key = _tls_files(tmp_path)
    port = free_port()
    (tmp_path / "acl.conf").write_text('user app on ">app-pw" ~* &* +@all\nuser default off\n')
    server = subprocess.Popen(
        ["redis-server", str(tmp_path / "acl.conf"), "--port", "0", "--tls-port", str(port),
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no",
         "--bind", "127.0.0.1", "--dir", str(tmp_path), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        settings = StrataSettings(kafka_bootstrap="127.0.0.1:1", kafka_security_protocol="PLAINTEXT",
                                  kafka_sasl_username=None, kafka_sasl_password=None, redis_url=f"rediss://app:app-pw@127.0.0.1:{port}/0?ssl_ca_certs={ca}")
        wait_until(lambda: redis_server.answers(settings.redis_address), 10, "TLS Redis")
        redis_row = status(settings)[1]
        assert redis_row.healthy and redis_row.auth == "TLS+password"
        assert redis_row.address == f"rediss://app:***@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        # The CA is what makes the server's certificate trusted; without it the handshake fails.
        assert not redis_server.answers(f"rediss://app:app-pw@127.0.0.1:{port}/0")
    finally:
        server.terminate()
        server.wait(10)
