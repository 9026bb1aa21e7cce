"""``strata infra up | down | status``: the local Kafka and Redis."""

from __future__ import annotations

import argparse
import time

from pydantic import ValidationError

from strata.config import StrataSettings, describe_settings_errors
from strata.errors import CliError
from strata_tools.infra import ComponentStatus, InfraError, down, status, up


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "infra", help="local Kafka and Redis",
        description="Start, stop or inspect the local single-node Kafka and Redis. When "
        "STRATA_KAFKA_BOOTSTRAP / STRATA_REDIS_URL point at existing clusters, nothing is started.",
    )
    actions = parser.add_subparsers(dest="infra_action", metavar="ACTION", required=True)
    up_parser = actions.add_parser("up", help="start what is missing and wait until it answers")
    up_parser.add_argument("--no-topics", action="store_true", help="do not create Strata's topics")
    up_parser.add_argument("--brokers", type=int, default=None, metavar="N",
                           help="local Kafka brokers (STRATA_KAFKA_BROKERS; 3: topics replicated 3 times, "
                           "min.insync.replicas 2)")
    up_parser.add_argument("--redis-replicas", type=int, default=None, metavar="N",
                           help="local Redis replicas with three Sentinels (STRATA_REDIS_REPLICAS)")
    up_parser.set_defaults(func=_up)
    down_parser = actions.add_parser("down", help="stop what `up` started (data is kept)")
    down_parser.add_argument("--purge", action="store_true", help="also delete Kafka and Redis data")
    down_parser.set_defaults(func=_down)
    actions.add_parser("status", help="addresses, pids and health").set_defaults(func=_status)


def _print_table(rows: list[ComponentStatus]) -> None:
    # Addresses come masked (no passwords); auth names the mechanism only.
    print(f"{'service':<16} {'state':<12} {'managed':<8} {'pid':<8} {'auth':<20} address")
    for row in rows:
        managed = "local" if row.managed else "external"
        print(f"{row.name:<16} {row.state:<12} {managed:<8} {row.pid or '-'!s:<8} {row.auth:<20} {row.address}")


def _up(args: argparse.Namespace) -> int:
    shape = {key: value for key, value in (("kafka_brokers", args.brokers), ("redis_replicas", args.redis_replicas))
             if value is not None}
    try:
        settings = StrataSettings(**shape)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise CliError(describe_settings_errors(exc)) from exc
    started = time.monotonic()
    try:
        rows = up(settings, create_topics=not args.no_topics)
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    _print_table(rows)
    print(f"ready in {time.monotonic() - started:.1f} s")
    if shape:
        # Every other command and service reads the shape from the environment, as it reads the ports.
        exports = " ".join(f"STRATA_{key.upper()}={value}" for key, value in shape.items())
        print(f"clients of this cluster (services, `strata infra down|status`) need: export {exports}")
    return 0


def _down(args: argparse.Namespace) -> int:
    settings = StrataSettings()
    stopped = down(settings, purge=args.purge)
    print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")
    return 0


def _status(args: argparse.Namespace) -> int:
    rows = status(StrataSettings())
    _print_table(rows)
    return 0 if all(row.healthy for row in rows) else 1
