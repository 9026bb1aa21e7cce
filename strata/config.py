"""Typed settings shared by every Strata process.

One frozen settings object per process, read from ``STRATA_*`` environment variables (and flags,
passed as keyword arguments, which win over the environment). Each service subclasses
:class:`StrataSettings` with its own fields, so ``STRATA_KAFKA_BOOTSTRAP`` means the same thing
everywhere. Settings are logged at start and stored with every artifact (see ``as_log_dict``).
"""

from __future__ import annotations

import argparse
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "strata"


S = TypeVar("S", bound=BaseSettings)
ENV_PREFIX = "STRATA_"  # every setting is read from STRATA_<FIELD>

_URL_PASSWORD = re.compile(r"(//[^:/@\s]*:)[^@/\s]+@")


def mask_url_password(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", url)


def _mask_secrets(value: Any) -> Any:
    if isinstance(value, SecretStr):
        return "***" if value.get_secret_value() else ""
    return mask_url_password(value) if isinstance(value, str) else value


class StrataSettings(BaseSettings):
    """Infrastructure addresses, local-infra ports and bus behaviour."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    # Addresses. Unset means "the local single-node Kafka / Redis that `strata infra up` manages";
    # set them to point at existing clusters, and then nothing is started locally.
    kafka_bootstrap: str | None = Field(None, description="host:port[,host:port] of an existing Kafka")
    redis_url: str | None = Field(
        None, description="redis[s]://[user:password@]host:port/db[?ssl_ca_certs=PEM] of an existing Redis"
    )

    # Kafka security (docs/security.md), for every client; `strata infra up` starts the local broker
    # with SASL/PLAIN when the SASL settings are set.
    kafka_security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"] = Field(
        "PLAINTEXT", description="PLAINTEXT | SASL_PLAINTEXT | SSL | SASL_SSL (SASL_*: username and password)"
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="SASL mechanism: PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 (the local broker: PLAIN)"
    )
    kafka_sasl_username: str | None = Field(None, description="SASL user of every Kafka client")
    kafka_sasl_password: SecretStr | None = Field(None, description="SASL password of kafka_sasl_username")
    kafka_ssl_cafile: Path | None = Field(None, description="PEM CA that signed the brokers' certificates")
    kafka_ssl_certfile: Path | None = Field(None, description="PEM client certificate (brokers that want one)")
    kafka_ssl_keyfile: Path | None = Field(None, description="PEM private key of kafka_ssl_certfile")
    # Redis credentials: for the managed Redis only (`strata infra up` creates the user, and
    # redis_address carries them). An external Redis takes its user, password and TLS in redis_url.
    redis_username: str | None = Field(
        None, description="local or Sentinel-found Redis: ACL user (unset: requirepass only)"
    )
    redis_password: SecretStr | None = Field(
        None, description="local or Sentinel-found Redis: password; set, Redis needs it"
    )
    # Redis Sentinel (docs/deploy.md, "Beyond one host"): clients ask these Sentinels for the current
    # primary and follow it through a failover. redis_username / redis_password log in to the data nodes.
    redis_sentinels: str | None = Field(
        None, description="host:port[,host:port] of the Sentinels of an existing Redis (instead of redis_url)"
    )
    redis_sentinel_primary: str = Field("strata", description="the name the Sentinels monitor the primary under")
    redis_wait_replicas: int = Field(
        0, ge=0, description="after writing a claim key, wait until this many replicas have it (Redis WAIT), so "
        "that a failover cannot lose it; 0: do not wait (one Redis)"
    )
    redis_wait_timeout_ms: int = Field(200, ge=1, description="the longest a claim waits for its replicas")

    # Local infrastructure (used only when the addresses above are unset).
    state_dir: Path = Field(Path(".strata"), description="runtime state: Kafka log dir, Redis data, pids, logs")
    cache_dir: Path = Field(
        default_factory=default_cache_dir, description="Kafka jars, model zoo (outside the checkout)"
    )
    zoo_preset: str = Field(
        "default", description="which built zoo a service uses when no model is configured: default | ci"
    )
    kafka_port: int = Field(19092, ge=1, le=65535)
    kafka_controller_port: int = Field(19093, ge=1, le=65535)
    kafka_heap: str = Field("512m", description="-Xmx of the local broker")
    kafka_brokers: int = Field(
        1, ge=1, le=9, description="local Kafka: brokers (KRaft, each also a controller); broker i listens on "
        "kafka_port + 2i and kafka_controller_port + 2i"
    )
    redis_port: int = Field(16379, ge=1, le=65535)
    redis_replicas: int = Field(
        0, ge=0, le=4, description="local Redis: replicas of the primary, watched by three Sentinels that fail over "
        "(ports redis_port + 1 ...: replicas, then the Sentinels); 0: one Redis, no Sentinel"
    )
    infra_start_timeout_s: float = Field(90.0, gt=0)

    # Topics.
    topic_partitions: int = Field(6, ge=1, description="partitions per topic: the most replicas of one stage")
    topic_replication_factor: int | None = Field(
        None, ge=1, description="copies of each topic's partitions; unset: 3 on a local cluster of 3+ brokers, else 1"
    )
    topic_min_insync_replicas: int | None = Field(
        None, ge=1, description="copies that must have an event before acks=all returns; unset: 2 when "
        "replicated 3+ times, else 1"
    )

    # Consumers. kafka-python's defaults (45 s session, 300 s poll interval) let a dead member hold
    # its partitions for minutes; these are tighter so a crashed worker's partitions move quickly.
    consumer_session_timeout_ms: int = Field(10_000, ge=1_000)
    consumer_heartbeat_interval_ms: int = Field(3_000, ge=100)
    consumer_max_poll_interval_ms: int = Field(120_000, ge=1_000)
    consumer_max_poll_records: int = Field(64, ge=1)
    # Delivery: a message whose handler keeps failing goes to <topic>.dlq after this many attempts.
    max_delivery_attempts: int = Field(5, ge=1)
    retry_backoff_initial_s: float = Field(0.2, gt=0)
    retry_backoff_max_s: float = Field(10.0, gt=0)

    # Content store.
    content_ttl_s: int = Field(7 * 24 * 3600, ge=1, description="lifetime of texts and token ids")
    content_max_bytes: int = Field(1 << 20, ge=1, description="largest text or token array accepted")

    log_level: str = Field("INFO")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus port; unset: none")
    metrics_bind_host: str = Field(
        "127.0.0.1", description="address /metrics listens on (0.0.0.0 where Prometheus scrapes from elsewhere)"
    )

    # gRPC edge (docs/security.md). Servers use the grpc_tls_cert/key and tokens-file settings;
    # clients (strata submit, the stack's health checks, benches) the grpc_tls_ca and token ones.
    grpc_bind_host: str = Field(
        "127.0.0.1", description="address gRPC servers listen on; 0.0.0.0 for every interface (compose)"
    )
    grpc_reflection: bool = Field(True, description="serve gRPC reflection (grpcurl without .proto files)")
    grpc_max_workers: int = Field(
        16, ge=2, description="threads for unary calls and health; streams get their own on top (max_watch_streams)"
    )
    grpc_max_receive_bytes: int = Field(
        4 * 1024 * 1024, ge=64 * 1024, description="largest request message a server parses"
    )
    grpc_tls_cert: Path | None = Field(None, description="server: PEM certificate chain; with grpc_tls_key, TLS on")
    grpc_tls_key: Path | None = Field(None, description="server: PEM private key of grpc_tls_cert")
    grpc_tls_client_ca: Path | None = Field(
        None, description="server: require client certificates signed by this PEM CA (mutual TLS)"
    )
    grpc_tokens_file: Path | None = Field(
        None,
        description="server: file of '<client> <token>' lines (token or sha256:<hex>); set, every call but health "
        "needs 'authorization: Bearer <token>'",
    )
    grpc_auth_health: bool = Field(
        False, description="server: the health service needs a token too (off: probes and load balancers need none)"
    )
    grpc_tls_ca: Path | None = Field(None, description="client: PEM CA that signed the servers' certificates; TLS on")
    grpc_tls_client_cert: Path | None = Field(None, description="client: PEM certificate for mutual TLS")
    grpc_tls_client_key: Path | None = Field(None, description="client: PEM private key for mutual TLS")
    grpc_tls_server_name: str | None = Field(
        None, description="client: name the server's certificate must carry (default: the target's host)"
    )
    grpc_token: SecretStr | None = Field(None, description="client: bearer token sent with every call")
    debug_rollout: bool = Field(
        False, description="keep full samples in a separate store that never feeds training (strata.debug_store)"
    )

    @field_validator("kafka_bootstrap", "redis_url", "redis_sentinels", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        # STRATA_REDIS_URL= (a compose override clearing an address) means "not set", not "".
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _check_kafka_security(self) -> StrataSettings:
        sasl = self.kafka_security_protocol.startswith("SASL_")
        has_credentials = self.kafka_sasl_username is not None or self.kafka_sasl_password is not None
        if sasl and (not self.kafka_sasl_username or not self.kafka_sasl_password):
            raise ValueError(f"kafka_security_protocol {self.kafka_security_protocol} needs kafka_sasl_username "
                             "and kafka_sasl_password")
        if has_credentials and not sasl:
            raise ValueError("kafka_sasl_username / kafka_sasl_password are set but kafka_security_protocol is "
                             f"{self.kafka_security_protocol}: set it to SASL_PLAINTEXT (or SASL_SSL)")
        ssl_files = (self.kafka_ssl_cafile, self.kafka_ssl_certfile, self.kafka_ssl_keyfile)
        if any(f is not None for f in ssl_files) and not self.kafka_security_protocol.endswith("SSL"):
            raise ValueError("kafka_ssl_* files need kafka_security_protocol SSL or SASL_SSL")
        if (self.kafka_ssl_certfile is None) != (self.kafka_ssl_keyfile is None):
            raise ValueError("kafka_ssl_certfile and kafka_ssl_keyfile go together: set both or neither")
        if self.kafka_managed and self.kafka_security_protocol.endswith("SSL"):
            # The local broker has no certificates; TLS is for a cluster set up with them.
            raise ValueError(f"kafka_security_protocol {self.kafka_security_protocol} needs kafka_bootstrap: the "
                             "local broker of `strata infra up` speaks PLAINTEXT or SASL_PLAINTEXT")
        if self.kafka_managed and sasl and self.kafka_sasl_mechanism != "PLAIN":
            raise ValueError("the local broker of `strata infra up` does SASL/PLAIN only: set "
                             "kafka_sasl_mechanism PLAIN, or kafka_bootstrap to a cluster with SCRAM users")
        if self.redis_username is not None and self.redis_password is None:
            raise ValueError("redis_username needs redis_password")
        if self.redis_sentinels is not None and self.redis_url is not None:
            raise ValueError("redis_sentinels and redis_url both name a Redis: set one")
        if self.redis_replicas and not self.redis_managed:
            raise ValueError("redis_replicas is for the local Redis: an external one has its own replicas")
        if self.kafka_brokers > 1 and not self.kafka_managed:
            raise ValueError("kafka_brokers is for the local Kafka: kafka_bootstrap names an existing cluster")
        if self.kafka_managed and self.replication_factor > self.kafka_brokers:
            raise ValueError(f"topic_replication_factor {self.replication_factor} needs as many brokers; the local "
                             f"Kafka has kafka_brokers={self.kafka_brokers}")
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(f"topic_min_insync_replicas {self.min_insync_replicas} is more than the "
                             f"{self.replication_factor} copies (topic_replication_factor)")
        return self

    @model_validator(mode="after")
    def _check_grpc_tls(self) -> StrataSettings:
        if (self.grpc_tls_cert is None) != (self.grpc_tls_key is None):
            raise ValueError("grpc_tls_cert and grpc_tls_key go together: set both or neither")
        if (self.grpc_tls_client_cert is None) != (self.grpc_tls_client_key is None):
            raise ValueError("grpc_tls_client_cert and grpc_tls_client_key go together: set both or neither")
        if self.grpc_tls_client_ca is not None and self.grpc_tls_cert is None:
            raise ValueError("grpc_tls_client_ca (mutual TLS) needs grpc_tls_cert and grpc_tls_key")
        return self

    @property
    def kafka_managed(self) -> bool:
        """True when Strata starts Kafka itself (no external bootstrap configured)."""
        return self.kafka_bootstrap is None

    @property
    def redis_managed(self) -> bool:
        return self.redis_url is None and self.redis_sentinels is None

    @property
    def replication_factor(self) -> int:
        """Copies of every Strata topic (``topic_replication_factor``, else by the local broker count)."""
        if self.topic_replication_factor is not None:
            return self.topic_replication_factor
        return min(3, self.kafka_brokers) if self.kafka_managed and self.kafka_brokers >= 3 else 1

    @property
    def min_insync_replicas(self) -> int:
        if self.topic_min_insync_replicas is not None:
            return self.topic_min_insync_replicas
        return 2 if self.replication_factor >= 3 else 1

    def kafka_node_ports(self) -> list[tuple[int, int]]:
        """(client port, controller port) of each local broker, node 1 first."""
        return [(self.kafka_port + 2 * i, self.kafka_controller_port + 2 * i) for i in range(self.kafka_brokers)]

    def redis_replica_ports(self) -> list[int]:
        return [self.redis_port + 1 + i for i in range(self.redis_replicas)]

    def redis_sentinel_ports(self) -> list[int]:
        """The local Sentinels' ports (three when the local Redis has replicas, else none)."""
        first = self.redis_port + 1 + self.redis_replicas
        return [first + i for i in range(3)] if self.redis_replicas else []

    @property
    def kafka_address(self) -> str:
        if self.kafka_bootstrap:
            return self.kafka_bootstrap
        return ",".join(f"127.0.0.1:{port}" for port, _ in self.kafka_node_ports())

    @property
    def redis_auth(self) -> bool:
        """True when Redis clients log in: the managed Redis has a password, or redis_url has credentials."""
        if self.redis_url is not None:
            url = urlsplit(self.redis_url)
            return bool(url.username or url.password)
        return self.redis_password is not None

    @property
    def redis_address(self) -> str:
        """The Redis URL clients use; for the managed Redis it carries the credentials. Never log it:
        ``redis_address_masked`` is for messages."""
        if self.redis_url is not None:
            return self.redis_url
        if self.redis_sentinels is not None or self.redis_replicas:
            from strata.redis_client import sentinel_url

            sentinels = self.redis_sentinels or ",".join(f"127.0.0.1:{p}" for p in self.redis_sentinel_ports())
            password = self.redis_password.get_secret_value() if self.redis_password is not None else None
            return sentinel_url(sentinels, self.redis_sentinel_primary, self.redis_username, password)
        credentials = ""
        if self.redis_password is not None:
            # Quoted: a password may hold ":", "@" or "/"; redis-py's from_url unquotes both parts.
            credentials = f"{quote(self.redis_username or '', safe='')}:"
            credentials += f"{quote(self.redis_password.get_secret_value(), safe='')}@"
        return f"redis://{credentials}127.0.0.1:{self.redis_port}/0"

    @property
    def redis_address_masked(self) -> str:
        """``redis_address`` with its password as ``***``: for logs, errors and status lines."""
        return mask_url_password(self.redis_address)

    def as_log_dict(self) -> dict[str, Any]:
        """Resolved settings, JSON-friendly, for the start-up log line and artifact metadata.

        Passwords in URLs (``redis://user:secret@host``) and secret fields (``SecretStr``) are
        masked as ``***``: this dict lands in logs and in every checkpoint.
        """
        return {key: _mask_secrets(str(value) if isinstance(value, Path) else value)
                for key, value in self.model_dump().items()}


# -- flags --------------------------------------------------------------------------------------------

_FLAG_TYPES = (str, int, float, Path)


def _flag_type(annotation: Any) -> Any:
    """The argparse type of a settings field (``int | None`` -> ``int``); None when not flaggable."""
    if annotation in (*_FLAG_TYPES, bool):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and args[0] in (*_FLAG_TYPES, bool):
            return args[0]
    if origin is typing.Literal:
        return type(typing.get_args(annotation)[0])
    return None


def flag_name(field: str) -> str:
    """The command-line flag of a settings field: ``grpc_port`` -> ``--grpc-port``."""
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    """The environment variable of a settings field: ``grpc_port`` -> ``STRATA_GRPC_PORT``."""
    return f"{ENV_PREFIX}{field.upper()}"


def add_settings_flags(parser: Any, settings_type: type[BaseSettings]) -> None:
    """Add ``--field-name`` for every simple field of ``settings_type`` (flags win over env vars).

    Defaults are left as None so that an absent flag does not override the environment.
    """
    for name, field in settings_type.model_fields.items():
        flag_type = _flag_type(field.annotation)
        if flag_type is None:
            continue
        flag = flag_name(name)
        env = env_name(name)
        help_text = f"{field.description or name} (env {env}; default {field.get_default(call_default_factory=True)!s})"
        if flag_type is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=flag_type, default=None, help=help_text)


def settings_from_flags(settings_type: type[S], args: Any) -> S:
    """Settings from the environment, overridden by the flags that were given.

    Raises ``SettingsError`` with one line per bad value, naming its flag and env var.
    """
    given = {
        name: getattr(args, name)
        for name in settings_type.model_fields
        if getattr(args, name, None) is not None
    }
    try:
        return settings_type(**given)
    except ValidationError as exc:
        raise SettingsError(describe_settings_errors(exc, given)) from exc


def parse_settings(parser: Any, settings_type: type[S], argv: Any = None) -> tuple[S, Any]:
    """A service entry point's settings and parsed args; bad values end the program as a bad flag
    does (usage, one line per value, exit status 2), not with a validation traceback."""
    args = parser.parse_args(argv)
    try:
        return settings_from_flags(settings_type, args), args
    except SettingsError as exc:
        parser.error(f"bad settings:\n{exc}")
        raise  # parser.error exits; this keeps type checkers content


class SettingsError(ValueError):
    """Settings that do not validate; the message names each flag / env var and what is wrong."""


def describe_settings_errors(exc: ValidationError, from_flags: Mapping[str, Any] | None = None) -> str:
    """``exc`` as lines like ``--tier (env STRATA_TIER) = 3: Input should be 1 or 2``."""
    flagged = from_flags or {}
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "settings"
        flag, env = flag_name(field), env_name(field)
        where, also = (flag, f" (env {env})") if field in flagged else (env, f" (flag {flag})")
        value = f" = {error['input']!r}" if "input" in error and not isinstance(error["input"], dict) else ""
        lines.append(f"{where}{also}{value}: {error['msg']}")
    return "\n".join(lines)
