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

# "path:function" -> why it stays long. Keep the reasons short; the history goes in commit bodies.
REASONS: dict[str, str] = {
    "svc_learner/ppo.py:ppo_update": "CleanRL's shape on purpose: one readable pass of the PPO math, top to bottom",
    "strata_tools/rm/train.py:train_reward_model": "one training loop with its optional match steps and feature heads",
    "strata_tools/rm/loop.py:run_turn": "one turn of the RM loop, its steps printed in order",
    "strata_tools/train.py:train": "the demo's round loop: submit, wait for finals, update, report",
    "svc_scheduler/routing.py:decide": "the rules R10-R12 in their order, which is the policy; split, it would hide",
    "strata/models/growth.py:widen": "one weight-surgery pass over every GPT-2 tensor, read once top to bottom",
    "svc_reward/worker.py:handle_batch": "one batch: dedupe, score per tier, publish, claim, book in one transaction",
    "svc_generator/worker.py:handle_batch": "one batch: claim, generate, store, publish, book",
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
