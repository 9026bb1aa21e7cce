"""Entry point of the ``strata`` console script.

Each command group is a module exposing ``register(subparsers)``, which adds its parser and sets
``func`` (taking the parsed namespace, returning an exit code). Errors meant for the user are raised
as :class:`CliError` and printed as one line, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from strata import __version__
from strata.errors import CliError
from strata.jsonl import read_jsonl  # noqa: F401  (commands import it from here)
from strata.telemetry import setup_logging

# Command-group modules, in help order. A module that fails to import (e.g. a missing optional
# dependency) must not take the whole CLI down, so they are imported lazily here.
COMMAND_MODULES: tuple[str, ...] = (
    "strata.cli.infra_cmd",
    "strata.cli.demo_cmd",
    "strata.cli.report_cmd",
    "strata.cli.stack_cmd",
    "strata.cli.health_cmd",
    "strata.cli.submit_cmd",
    "strata.cli.train_cmd",
    "strata.cli.models_cmd",
    "strata.cli.bench_cmd",
    "strata.cli.diagnose_cmd",
    "strata.cli.rm_cmd",
    "strata.cli.calibrate_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata", description="Strata: tiered rollout for RLHF/PPO training."
    )
    parser.add_argument("--version", action="version", version=f"strata {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # group not built yet in this checkout
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"strata: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("strata: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # Run the imported module's main: commands raise strata.cli.main.CliError, which would be a
    # different class from this __main__ module's.
    from strata.cli.main import main as _main

    sys.exit(_main())
