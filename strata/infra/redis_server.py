"""A local Redis (Debian's ``redis-server``) with append-only persistence under the state dir."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import redis

from strata.config import StrataSettings
from strata.infra.process import (
    InfraError,
    ensure_tool,
    owned_pid,
    port_open,
    start_detached,
    stop_pid,
    wait_serving,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisPaths:
    home: Path
    pid_file: Path
    log_file: Path

    @classmethod
    def of(cls, settings: StrataSettings) -> RedisPaths:
        home = settings.state_dir.resolve() / "redis"
        return cls(home=home, pid_file=home / "redis.pid", log_file=home / "redis.log")


def running_pid(settings: StrataSettings) -> int | None:
    # The state dir on the command line identifies our server (set-proc-title off keeps argv).
    paths = RedisPaths.of(settings)
    return owned_pid(paths.pid_file, f"--dir {paths.home} ")


def start(settings: StrataSettings) -> int:
    paths = RedisPaths.of(settings)
    pid = running_pid(settings)
    if pid is None:
        if port_open("127.0.0.1", settings.redis_port):
            raise InfraError(
                f"port {settings.redis_port} (Redis) is taken by another process. Free it, choose another "
                "port (STRATA_REDIS_PORT), or point STRATA_REDIS_URL at that server."
            )
        server = ensure_tool("redis-server", "redis-server", "the content store and scheduler state",
                             "Install it (apt-get install redis-server), or set STRATA_REDIS_URL.")
        paths.home.mkdir(parents=True, exist_ok=True)
        argv = [
            server, "--bind", "127.0.0.1", "--port", str(settings.redis_port), "--dir", str(paths.home),
            "--daemonize", "no", "--appendonly", "yes", "--appendfsync", "everysec",
            "--save", "300 1", "--logfile", str(paths.log_file), "--set-proc-title", "no",
        ]
        pid = start_detached(argv, paths.home / "redis.out", paths.pid_file)
        log.info("started Redis (pid %d) on 127.0.0.1:%d", pid, settings.redis_port)

    wait_serving(pid, "Redis", "redis-server", paths.log_file, lambda: answers(settings.redis_address),
                 settings.infra_start_timeout_s)
    return pid


def stop(settings: StrataSettings, timeout_s: float = 30.0) -> bool:
    paths = RedisPaths.of(settings)
    pid = running_pid(settings)
    if pid is None:
        paths.pid_file.unlink(missing_ok=True)
        return False
    stop_pid(pid, timeout_s)  # SIGTERM: Redis flushes the append-only file and exits
    paths.pid_file.unlink(missing_ok=True)
    log.info("stopped Redis (pid %d)", pid)
    return True


def answers(url: str) -> bool:
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError):
        return False
