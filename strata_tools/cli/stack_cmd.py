"""``strata up | down | status | logs``: the whole stack as local processes."""

from __future__ import annotations

import argparse
import time

from strata.config import StrataSettings
from strata.errors import CliError
from strata_tools.infra import InfraError
from strata_tools.infra import down as infra_down
from strata_tools.infra import up as infra_up
from strata_tools.stack import control
from strata_tools.stack.spec import ServiceSpec, default_services


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser("up", help="start Kafka, Redis and every service (local processes)")
    up.add_argument("--only", default="", help="comma-separated services (default: all)")
    up.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for health checks")
    up.set_defaults(func=_up)
    down = subparsers.add_parser("down", help="stop every service cleanly (SIGTERM, drain, commit)")
    down.add_argument("--infra", action="store_true", help="also stop the local Kafka and Redis")
    down.set_defaults(func=_down)
    subparsers.add_parser("status", help="service, pid, port, health, consumer lag").set_defaults(func=_status)
    logs = subparsers.add_parser("logs", help="service logs (under <state_dir>/logs/)")
    logs.add_argument("service", nargs="?", help="one service (default: all)")
    logs.add_argument("-n", "--lines", type=int, default=40)
    logs.add_argument("-f", "--follow", action="store_true")
    logs.set_defaults(func=_logs)


def _services(only: str) -> list[ServiceSpec]:
    services = default_services()
    if only:
        wanted = {name.strip() for name in only.split(",") if name.strip()}
        unknown = wanted - {s.name for s in services}
        if unknown:
            raise CliError(f"unknown service(s) {sorted(unknown)}; known: {', '.join(s.name for s in services)}")
        services = [s for s in services if s.name in wanted]
    return services


def _up(args: argparse.Namespace) -> int:
    settings = StrataSettings()
    services = _services(args.only)
    started = time.monotonic()
    try:
        print("infrastructure:", flush=True)
        for row in infra_up(settings):
            print(f"  {row.name:<6} {row.state:<4} {row.address}")
        try:
            from strata_tools.zoo.build import ensure_zoo
        except ImportError:
            ensure_zoo = None
        if ensure_zoo is not None:
            print("model zoo: checking (built once, then reused) ...", flush=True)
            ensure_zoo(settings)
        print("services:", flush=True)
        control.start(settings, services, {}, args.timeout, progress=lambda line: print(line, flush=True))
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    print(f"stack up in {time.monotonic() - started:.0f} s; `strata status` shows it, `strata down` stops it")
    return 0


def _down(args: argparse.Namespace) -> int:
    settings = StrataSettings()
    print("services: " + ("stopped (drained and committed)" if control.stop(settings) else "none running"))
    if args.infra:
        stopped = infra_down(settings)
        print(f"infrastructure: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    settings = StrataSettings()
    rows = control.status(settings)
    print(f"{'service':<14} {'pid':>7} {'port':>6} {'state':<9} {'health':<8} {'restarts':>8} {'hung':>5} {'lag':>6}")
    for row in rows:
        print(f"{row.name:<14} {row.pid or '-'!s:>7} {row.port:>6} {row.state:<9} "
              f"{'SERVING' if row.healthy else 'down':<8} {row.restarts:>8} {row.hung_kills:>5} "
              f"{'-' if row.lag is None else row.lag:>6}")
    errors = {r.lag_error for r in rows if r.lag_error}
    if errors:
        print(f"lag: unknown: reading consumer offsets from Kafka at {settings.kafka_address} failed "
              f"({'; '.join(sorted(errors))}); `strata infra status` checks Kafka and Redis")
    elif all(r.lag is None for r in rows):
        print("lag: unknown (no consumer group has committed yet)")
    if not errors:  # Kafka answered: the recent updates' critical path (issue 63)
        print(control.critical_path_line(settings))
    for line in control.live_audit_lines(settings):
        print(line)
    return 0 if all(r.healthy for r in rows) else 1


def _logs(args: argparse.Namespace) -> int:
    try:
        return control.logs(StrataSettings(), args.service, args.lines, args.follow)
    except InfraError as exc:
        raise CliError(str(exc)) from exc
