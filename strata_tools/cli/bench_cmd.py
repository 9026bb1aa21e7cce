"""``strata bench <name>``: measurements on this machine, one module or package per bench.

To add a bench, write ``strata_tools/bench/<name>.py`` (or a package ``<name>/``, its ``__init__.py`` the
entry) with ``add_arguments(parser)`` and ``run(args) -> int`` (its docstring's first line is the help
text) and list it in ``BENCHES``. Only the bench that runs
is imported: ``strata bench --help`` lists the others by their docstrings, read from source, and a bench's
imports (torch, transformers, its services) are paid by that bench.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.machinery
import importlib.util
import logging
import tokenize
from collections.abc import Sequence
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
    "load": "strata_tools.bench.load",
    "chaos": "strata_tools.bench.chaos",
    "annotators": "strata_tools.bench.annotators",
    "stages": "strata_tools.bench.stages",
    "peers": "strata_tools.bench.peers",
}


def help_line(module_name: str) -> str | None:
    """The first line of a bench module's docstring, read from its source without importing it (a few
    milliseconds for all of them); None when it is not in this checkout."""
    package, _, leaf = module_name.rpartition(".")
    # find_spec of the module itself would import its package; its package's spec names the directory.
    where = importlib.util.find_spec(package)
    spec = importlib.machinery.PathFinder.find_spec(leaf, where.submodule_search_locations) if where else None
    if spec is None or spec.origin is None:
        return None
    with open(spec.origin, "rb") as source:
        for token in tokenize.tokenize(source.readline):
            if token.type in (tokenize.ENCODING, tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
                continue
            if token.type == tokenize.STRING:
                return str(ast.literal_eval(token.string)).strip().splitlines()[0]
            break
    return module_name.rsplit(".", 1)[-1]


def selected_bench(argv: Sequence[str] | None) -> str | None:
    """The bench ``argv`` runs (the first word after ``bench`` that is not an option), if it names one."""
    if argv is None:
        return None
    words = [w for w in argv if not w.startswith("-")]
    if "bench" not in words:
        return None
    after = words[words.index("bench") + 1:]
    return after[0] if after and after[0] in BENCHES else None


def register(subparsers: Any, argv: Sequence[str] | None = None) -> None:
    """The ``bench`` parser; with ``argv`` naming one bench, that bench's module alone is imported (the
    others are listed by their help line); without, every bench is registered in full."""
    parser = subparsers.add_parser("bench", help="benchmarks measured on this machine")
    sub = parser.add_subparsers(dest="bench_name", metavar="BENCH", required=True)
    chosen = selected_bench(argv)
    for name, module_name in BENCHES.items():
        summary = help_line(module_name)
        if summary is None:
            continue  # bench not in this checkout
        if argv is not None and name != chosen:
            sub.add_parser(name, help=summary)  # listed only: `strata bench <name>` registers it in full
            continue
        module = importlib.import_module(module_name)
        bench = sub.add_parser(name, help=summary, description=module.__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(bench)
        bench.set_defaults(func=module.run)
