"""Entry point of the ``strata`` console script.

Each command group is a module exposing ``register(subparsers)``, which adds its parser and sets
``func`` (taking the parsed namespace, returning an exit code). Errors meant for the user are raised
as :class:`CliError` and printed as one line, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
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
    "strata_tools.cli.infra_cmd",
    "strata_tools.cli.demo_cmd",
    "strata_tools.cli.report_cmd",
    "strata_tools.cli.stack_cmd",
    "strata_tools.cli.health_cmd",
    "strata_tools.cli.submit_cmd",
    "strata_tools.cli.train_cmd",
    "strata_tools.cli.models_cmd",
    "strata_tools.cli.probe_cmd",
    "strata_tools.cli.bench_cmd",
    "strata_tools.cli.diagnose_cmd",
    "strata_tools.cli.rm_cmd",
    "strata_tools.cli.calibrate_cmd",
    "strata_tools.cli.encoder_cmd",
    "strata_tools.cli.edge_cmd",
    "strata_tools.cli.dlq_cmd",
    "strata_tools.cli.recover_cmd",
)
# The module that registers each command: `strata <command> ...` imports that module alone, so that
# a quick command (`strata health`, a container's healthcheck) does not pay for the benchmarks'
# imports of torch and transformers (seconds).
MODULE_OF_COMMAND: dict[str, str] = {command: f"strata_tools.cli.{module}" for command, module in {
    "infra": "infra_cmd", "demo": "demo_cmd", "report": "report_cmd", "up": "stack_cmd", "down": "stack_cmd",
    "status": "stack_cmd", "logs": "stack_cmd", "health": "health_cmd", "submit": "submit_cmd", "train": "train_cmd",
    "models": "models_cmd", "bench": "bench_cmd", "diagnose": "diagnose_cmd", "rm": "rm_cmd",
    "calibrate": "calibrate_cmd", "encoder": "encoder_cmd", "tls": "edge_cmd", "token": "edge_cmd", "dlq": "dlq_cmd",
    "recover": "recover_cmd",
    "probe": "probe_cmd",
}.items()}


def _command_of(argv: Sequence[str]) -> str | None:
    """The command word of ``argv`` (the first argument that is not an option), if any."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with only the module of ``argv``'s command when it names a known one."""
    parser = argparse.ArgumentParser(
        prog="strata", description="Strata: tiered rollout for RLHF/PPO training."
    )
    parser.add_argument("--version", action="version", version=f"strata {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    only = MODULE_OF_COMMAND.get(_command_of(argv) or "") if argv is not None else None
    for module_name in (only,) if only else COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # group not built yet in this checkout
            raise
        if "argv" in inspect.signature(module.register).parameters:
            module.register(subparsers, argv=argv)  # registers only what argv runs (bench_cmd)
        else:
            module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
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
    # Run the imported module's main: commands raise strata_tools.cli.main.CliError, which would be a
    # different class from this __main__ module's.
    from strata_tools.cli.main import main as _main

    sys.exit(_main())
