"""``strata bench <name>``: measurements on this machine, one module per bench.

To add a bench, write ``strata_tools/bench/<name>.py`` with ``add_arguments(parser)`` and ``run(args) ->
int`` (its docstring's first line is the help text) and list it in ``BENCHES``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from typing import Any

logger = logging.getLogger(__name__)

# name -> module; in help order.
BENCHES: dict[str, str] = {
    "zoo": "strata_tools.bench.zoo",
    "probe": "strata_tools.bench.probe",
    "level0": "strata_tools.bench.level0",
    "generator": "strata_tools.bench.generator",
    "scheduler": "strata_tools.bench.scheduler",
    "risk": "strata_tools.bench.risk",
    "learner": "strata_tools.bench.learner",
    "rm": "strata_tools.bench.rm",
    "tiers": "strata_tools.bench.tiers",
    "edge": "strata_tools.bench.edge",
    "chaos": "strata_tools.bench.chaos",
    "annotators": "strata_tools.bench.annotators",
    "stages": "strata_tools.bench.stages",
    "peers": "strata_tools.bench.peers",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks measured on this machine")
    sub = parser.add_subparsers(dest="bench_name", metavar="BENCH", required=True)
    for name, module_name in BENCHES.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # bench not in this checkout
            raise
        summary = (module.__doc__ or name).strip().splitlines()[0]
        bench = sub.add_parser(name, help=summary, description=module.__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(bench)
        bench.set_defaults(func=module.run)
