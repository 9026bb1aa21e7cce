"""The functions over 60 lines outside the tests and the generated code, each with why it stays long.

    .venv/bin/python scripts/long_functions.py            # the markdown table docs/architecture.md holds
    .venv/bin/python scripts/long_functions.py --check    # exit 1 when the docs' table is stale

A function that grows past the limit needs a reason here (or a cut); tests/strata/test_long_functions.py
runs ``--check``'s logic, so the table in docs/architecture.md cannot drift from the tree.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- long-functions:begin -->", "<!-- long-functions:end -->"

BENCH = "a bench is a script: set up, stream, wait on conditions, print the table in the order the docs quote it"
COMMAND = "a command: argparse, then the steps it prints, in the order a user reads them"
# "path:function" -> why it stays long. Keep the reasons short; the history goes in commit bodies.
REASONS: dict[str, str] = {
    "scripts/gpu_check.py:main": "the GPU check, run by hand on a lent machine: each step prints as it goes",
    "strata_tools/cli/rm_cmd.py:register": "the help text of the rm commands' ~40 options",
    "strata_tools/bench/scheduler.py:run_routing": BENCH,
    "strata_tools/bench/learner.py:_run": BENCH,
    "svc_learner/ppo.py:ppo_update": "CleanRL's shape on purpose: one readable pass of the PPO math, top to bottom",
    "strata_tools/rm/train.py:train_reward_model": "one training loop with its optional match steps and feature heads",
    "strata_tools/bench/rm.py:run": BENCH,
    "strata_tools/bench/scheduler.py:_run": BENCH,
    "strata_tools/rm/loop.py:run_turn": "one turn of the RM loop, its steps printed in order",
    "strata_tools/cli/probe_cmd.py:run_train": COMMAND,
    "strata_tools/bench/tiers.py:build_report": BENCH,
    "strata_tools/bench/index_scale.py:main": BENCH,
    "strata_tools/bench/zoo.py:run": BENCH,
    "strata_tools/cli/demo_cmd.py:run": COMMAND,
    "strata_tools/train.py:train": "the demo's round loop: submit, wait for finals, update, report",
    "svc_scheduler/routing.py:decide": "the rules R10-R12 in their order, which is the policy; split, it would hide",
    "strata_tools/bench/edge.py:_run": BENCH,
    "strata_tools/bench/tiers.py:started": BENCH,
    "strata/models/growth.py:widen": "one weight-surgery pass over every GPT-2 tensor, read once top to bottom",
    "svc_reward/worker.py:handle_batch": "one batch: dedupe, score per tier, publish, claim, book in one transaction",
    "strata_tools/bench/scheduler.py:run_latency": BENCH,
    "strata_tools/cli/probe_cmd.py:run_compare": COMMAND,
    "strata_tools/bench/generator.py:measure": BENCH,
    "strata_tools/cli/calibrate_cmd.py:run_escalation": COMMAND,
    "svc_generator/worker.py:handle_batch": "one batch: claim, generate, store, publish, book",
    "strata_tools/bench/chaos.py:_run": BENCH,
}


def long_functions(root: Path = ROOT, limit: int = LIMIT) -> list[tuple[int, str]]:
    """(lines, "path:function") of every function over ``limit`` lines, longest first."""
    paths = [*sorted((root / "strata").rglob("*.py")), *sorted((root / "strata_tools").rglob("*.py"))]
    paths += sorted((root / "scripts").glob("*.py"))
    paths += sorted(p for d in sorted(root.glob("svc_*")) for p in d.rglob("*.py"))
    found = []
    for path in paths:
        relative = path.relative_to(root).as_posix()
        if relative.startswith("strata/v1/"):
            continue  # generated
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found.append((lines, f"{relative}:{node.name}"))
    return sorted(found, key=lambda item: (-item[0], item[1]))


def table(found: list[tuple[int, str]]) -> str:
    rows = ["| lines | function | why it stays |", "|---|---|---|"]
    for lines, key in found:
        path, name = key.split(":")
        rows.append(f"| {lines} | `{path}` `{name}` | {REASONS.get(key, '**no reason given**')} |")
    return "\n".join(rows)


def documented(doc: Path = DOC) -> str:
    text = doc.read_text(encoding="utf-8")
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip()


def problems(root: Path = ROOT) -> list[str]:
    found = long_functions(root)
    out = [f"{key} ({lines} lines) has no reason in scripts/long_functions.py" for lines, key in found
           if key not in REASONS]
    if documented(root / "docs" / "architecture.md") != table(found):
        out.append("docs/architecture.md's table is stale: run scripts/long_functions.py and paste it")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a reason is missing or the docs are stale")
    args = parser.parse_args()
    if args.check:
        found = problems()
        for problem in found:
            print(problem, file=sys.stderr)
        return 1 if found else 0
    print(table(long_functions()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
