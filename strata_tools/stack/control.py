"""``strata up | down | status | logs`` over the supervisor's state file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata import redis_client, rpc
from strata.audit import HUMAN_AUDIT, STRONG_AUDIT, describe_judges, read_versions
from strata.bus.admin import consumer_lags
from strata.config import StrataSettings
from strata.telemetry import quiet_kafka_logs
from strata_tools.infra.process import InfraError, owned_pid, process_alive, start_detached, stop_pid
from strata_tools.stack.spec import ServiceSpec, default_services
from strata_tools.stack.supervisor import log_dir, state_file
from strata_tools.trace import read_events, trace

_SUPERVISOR_MODULE = "strata_tools.stack.supervisor"


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    pid: int | None
    port: int
    state: str            # supervisor's view: running | backoff | stopped | -
    healthy: bool         # gRPC health check says SERVING
    restarts: int
    lag: int | None       # consumer lag summed over the service's groups (None: unknown)
    hung_kills: int = 0   # restarts because it stopped answering its health checks
    lag_error: str | None = None  # why no lag could be read, when Kafka's answer failed


def _pid_file(settings: StrataSettings) -> Path:
    return settings.state_dir / "supervisor.pid"


def supervisor_pid(settings: StrataSettings) -> int | None:
    return owned_pid(_pid_file(settings), _SUPERVISOR_MODULE)


def health(port: int, timeout_s: float = 1.0) -> bool:
    try:
        with rpc.channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def start(settings: StrataSettings, services: list[ServiceSpec], service_args: dict[str, list[str]],
          timeout_s: float, progress: Callable[[str], object] = print) -> None:
    """Start the supervisor (if not running) and wait until every service answers its health check."""
    if supervisor_pid(settings) is None:
        argv = [sys.executable, "-m", _SUPERVISOR_MODULE, "--state-dir", str(settings.state_dir.resolve()),
                "--only", ",".join(s.name for s in services), "--service-args", json.dumps(service_args)]
        log_dir(settings.state_dir).mkdir(parents=True, exist_ok=True)
        pid = start_detached(argv, log_dir(settings.state_dir) / "supervisor.log", _pid_file(settings))
        progress(f"supervisor started (pid {pid}); service logs in {log_dir(settings.state_dir)}/")
    deadline = time.monotonic() + timeout_s
    pending = {s.name: s.port for s in services}
    supervisor_log = log_dir(settings.state_dir) / "supervisor.log"
    while pending:
        for name, port in list(pending.items()):
            if health(port):
                progress(f"  {name:<13} healthy on :{port}")
                del pending[name]
        if not pending:
            break
        pid = supervisor_pid(settings)
        if pid is None or not process_alive(pid):
            raise InfraError(f"the supervisor exited; see {supervisor_log}")
        if looping := crash_looping(state_file(settings.state_dir), pid, set(pending)):
            name = looping[0]
            raise InfraError(f"{name} keeps exiting before it is healthy: {last_error(settings.state_dir, name)} "
                             f"(the supervisor restarts it; `strata logs {name}` has the rest, `strata down` stops it)")
        if time.monotonic() > deadline:
            raise InfraError(f"not healthy after {timeout_s:.0f} s: {', '.join(pending)}; "
                             f"see the logs in {log_dir(settings.state_dir)}/ (strata logs <service>)")
        time.sleep(1.0)


CRASH_LOOP_EXITS = 2  # quick exits in a row (the supervisor's count) of a service that is not starting


def crash_looping(stack_state: Path, supervisor: int, names: set[str]) -> list[str]:
    """The services among ``names`` that supervisor ``supervisor`` saw exit ``CRASH_LOOP_EXITS`` times in a row
    soon after starting (its ``failures_in_a_row`` in ``stack.json``; a file another supervisor left counts
    for nothing)."""
    try:
        state = json.loads(stack_state.read_text())
        if state["supervisor_pid"] != supervisor:
            return []
        services = state["services"]
    except (OSError, ValueError, KeyError):
        return []
    return sorted(n for n in names if services.get(n, {}).get("failures_in_a_row", 0) >= CRASH_LOOP_EXITS)


def last_error(state_dir: Path, name: str) -> str:
    """The last line of a service's log that names an error (its traceback's last line), else its last line."""
    try:
        lines = [line.strip() for line in (log_dir(state_dir) / f"{name}.log").read_text(
            encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log yet"
    errors = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception"))]
    return (errors or lines or ["an empty log"])[-1][:500]


def stop(settings: StrataSettings, timeout_s: float = 90.0) -> bool:
    pid = supervisor_pid(settings)
    if pid is None:
        return False
    stop_pid(pid, timeout_s)
    _pid_file(settings).unlink(missing_ok=True)
    return True


def _lags(settings: StrataSettings, groups: set[str]) -> tuple[dict[str, int], str | None]:
    """(group -> events not yet committed over all its topics, why none could be read): the error is
    said once, by `strata status`, rather than in kafka-python's line per failed connection."""
    try:
        with quiet_kafka_logs():
            per_topic = consumer_lags(settings, sorted(groups), "strata-status", timeout_ms=5000)
    except Exception as exc:  # a status line without lags, and the reason, beats no status line
        return {}, f"{type(exc).__name__}: {exc}"
    lags: dict[str, int] = {}
    for (group, _topic), lag in per_topic.items():
        lags[group] = lags.get(group, 0) + lag
    return lags, None


def status(settings: StrataSettings, services: list[ServiceSpec] | None = None) -> list[ServiceStatus]:
    services = services or default_services()
    try:
        state = json.loads(state_file(settings.state_dir).read_text())["services"]
    except (OSError, ValueError, KeyError):
        state = {}
    running = supervisor_pid(settings) is not None
    lags, lag_error = _lags(settings, {g for s in services for g in s.consumer_groups})
    rows = []
    for spec in services:
        st = state.get(spec.name, {}) if running else {}
        group_lags = [lags[g] for g in spec.consumer_groups if g in lags]
        rows.append(ServiceStatus(spec.name, st.get("pid"), spec.port, st.get("state", "-"), health(spec.port),
                                  int(st.get("restarts", 0)), sum(group_lags) if group_lags else None,
                                  int(st.get("hung_kills", 0)), lag_error))
    return rows


def logs(settings: StrataSettings, service: str | None, lines: int, follow: bool) -> int:
    directory = log_dir(settings.state_dir)
    files = [directory / f"{service}.log"] if service else sorted(directory.glob("*.log"))
    missing = [f for f in files if not f.exists()]
    if missing:
        raise InfraError(f"no log at {missing[0]} (known: {', '.join(p.stem for p in directory.glob('*.log'))})")
    argv = ["tail", "-n", str(lines), *(["-F"] if follow else []), *map(str, files)]
    return subprocess.call(argv)


def critical_path_line(settings: StrataSettings, newest_events: int = 5000) -> str:
    """The critical path of the stack's recent PPO updates (``strata_tools.trace``), from the newest events
    Kafka holds; one line, or why there is none."""
    try:
        with quiet_kafka_logs():
            return trace(*read_events(settings, newest=newest_events, idle_timeout_s=5.0)).line()
    except Exception as exc:  # status must print the rest: one line naming what failed
        return (f"critical path: unknown: reading events from Kafka at {settings.kafka_address} failed "
                f"({type(exc).__name__}: {exc})")


def live_audit_lines(settings: StrataSettings) -> list[str]:
    """How Level-1 answers escalate, and the reward service's live audit (hacking gap, catch, false pass, the
    alarm), as report lines read from Redis with the thresholds the reward service wrote there (else
    ``STRATA_HACKING_*`` from this environment, as the service would read them)."""
    from svc_reward import audit_store, defence
    from svc_reward.config import RewardSettings

    reward = RewardSettings()
    try:
        client = redis_client.connect(settings.redis_address, socket_timeout=5, socket_connect_timeout=3)
        by_judge = {judge: read_versions(client, judge) for judge in (STRONG_AUDIT, HUMAN_AUDIT)}
        state, decisions = audit_store.read_defence(client), audit_store.read_decisions(client)
        pending = audit_store.redistil_request(client) is not None
        served = audit_store.read_thresholds(client) or audit_store.ServedThresholds(
            reward.hacking_min_audits, reward.hacking_gap_bound, reward.hacking_defence)
        escalation = audit_store.read_escalation(client)
    except redis.RedisError as exc:
        return [f"live audit: Redis at {settings.redis_address} did not answer ({type(exc).__name__}: {exc})"]
    said = ([] if escalation is None
            else [f"escalation ({escalation['rm_version']}, the light RM in service): {escalation['line']}"])
    return (said + describe_judges(by_judge, served.gap_bound, served.min_audits)
            + defence.describe(state, decisions, served.defence, pending))
