"""``strata bench``: each bench listed by the line its module's docstring opens with, and only the bench that
runs imported (its torch and services are paid by that bench alone)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from strata_tools.cli.bench_cmd import BENCHES, help_line, selected_bench
from strata_tools.cli.main import build_parser


@pytest.mark.parametrize("name", sorted(BENCHES))
def test_each_bench_is_listed_by_its_docstrings_first_line(name: str) -> None:
    module_name = BENCHES[name]
    spec = importlib.util.find_spec(module_name)
    assert spec is not None and spec.origin is not None
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text()))
    assert doc is not None and doc.strip().splitlines()[0] == help_line(module_name)


def test_the_bench_named_is_the_one_registered() -> None:
    assert selected_bench(["bench", "tiers", "--prompts", "8"]) == "tiers"
    assert selected_bench(["-v", "bench", "--help"]) is None and selected_bench(["status"]) is None
    assert selected_bench(["bench", "nonsense"]) is None and selected_bench(None) is None
    args = build_parser(["bench", "peers", "--seeds", "3"]).parse_args(["bench", "peers", "--seeds", "3"])
    assert args.seeds == 3 and callable(args.func)


def test_listing_the_benches_imports_none_of_them() -> None:
    code = ("import sys\nfrom strata_tools.cli.main import main\n"
            "try:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('strata_tools.bench') or m == 'torch'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert "peers" in done.stdout and "tiers" in done.stdout  # listed in the help ...
    assert done.stdout.strip().splitlines()[-1] == "[]"  # ... and not imported
