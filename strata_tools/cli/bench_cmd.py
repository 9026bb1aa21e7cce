"""``strata bench <name>``: measurements on this machine, one module per bench.

To add a bench, write ``strata_tools/bench/<name>.py`` with ``add_arguments(parser)`` and ``run(args) ->
int`` and list it in ``BENCHES`` with its docstring's first line (a test keeps the two equal). Only the
bench that runs is imported: ``strata bench --help`` lists them from ``BENCHES`` alone, and a bench's
imports (torch, transformers, its services) are paid by that bench.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

# name -> (module, its docstring's first line); in help order.
BENCHES: dict[str, tuple[str, str]] = {
    "zoo": ("strata_tools.bench.zoo", "``strata bench zoo``: the zoo's models measured in one run on this machine."),
    "probe": ("strata_tools.bench.probe", "``strata bench probe``: latency of the Level-0 probe per prompt through "
              "its gRPC API (R1: < 50 ms)."),
    "level0": ("strata_tools.bench.level0", "``strata bench level0``: what the Level-0 probe's directions and caution "
               "do for Level-1 (R1, R2)."),
    "generator": ("strata_tools.bench.generator", "``strata bench generator``: what dynamic batching buys (R15)."),
    "scheduler": ("strata_tools.bench.scheduler", "``strata bench scheduler``: what embedding-based skipping "
                  "(R10-R12) saves, and what it costs."),
    "risk": ("strata_tools.bench.risk", "``strata bench risk``: does risk detection (R3) find medical and legal "
             "prompts its keyword lists never name?"),
    "learner": ("strata_tools.bench.learner", "``strata bench learner``: PPO update throughput, weight-sync time and "
                "reward gain, in one run."),
    "rm": ("strata_tools.bench.rm", "``strata bench rm``: the light RM against the strong RM (R6): rank agreement, "
           "prompt match, speed."),
    "tiers": ("strata_tools.bench.tiers", "``strata bench tiers``: the article's headline, measured: cost, quality "
              "and bad cases caught, arm by arm."),
    "edge": ("strata_tools.bench.edge", "``strata bench edge``: the front door under abuse: Submit and health latency "
             "with 64 Watch streams"),
    "chaos": ("strata_tools.bench.chaos", "``strata bench chaos``: a steady stream of prompts through the real stack "
              "while faults hit it;"),
    "annotators": ("strata_tools.bench.annotators", "Annotator drift (R18): simulated annotators, one drifting from a "
                   "known item on, and the alarm."),
    "stages": ("strata_tools.bench.stages", "``strata bench stages``: where one request's time goes on each hot path, "
               "stage by stage (issue 26)."),
    "peers": ("strata_tools.bench.peers", "Strata beside TRL: the same policy, reward model, prompts and sampling, one "
              "after another in one run."),
}


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
    for name, (module_name, summary) in BENCHES.items():
        if argv is not None and name != chosen:
            sub.add_parser(name, help=summary)  # listed only: `strata bench <name>` registers it in full
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # bench not in this checkout
            raise
        bench = sub.add_parser(name, help=summary, description=module.__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(bench)
        bench.set_defaults(func=module.run)
