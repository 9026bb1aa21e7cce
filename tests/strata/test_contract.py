"""The run-time contract: services find a built zoo through its manifest, and never import the zoo."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from strata.contract.models import ModelNotConfiguredError, manifest_path, model_path, write_manifest

ROOT = Path(__file__).resolve().parents[2]
# The two wings: the runtime library every service imports (strata/) and the tools people and CI run
# (strata_tools/); the tools import the library, never the other way.
LIBRARY, TOOLS = "strata", "strata_tools"


def test_a_configured_path_wins_and_the_manifest_fills_in(tmp_path: Path) -> None:
    probe = tmp_path / "models" / "probe"
    probe.mkdir(parents=True)
    assert model_path("probe", "/my/probe", tmp_path, "ci", "--model") == "/my/probe"
    write_manifest(tmp_path, "ci", "abc123", {"probe": probe})
    assert manifest_path(tmp_path, "ci").is_file()
    assert model_path("probe", None, tmp_path, "ci", "--model") == str(probe)


def test_no_zoo_or_a_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotConfiguredError, match=r"set --model \(STRATA_MODEL\).*strata models build --preset ci"):
        model_path("probe", None, tmp_path, "ci", "--model (STRATA_MODEL)")
    write_manifest(tmp_path, "ci", "abc123", {"probe": tmp_path / "gone"})
    with pytest.raises(ModelNotConfiguredError, match="names no probe model on disk"):
        model_path("probe", None, tmp_path, "ci", "--model")
    manifest_path(tmp_path, "ci").write_text("{not json")
    with pytest.raises(ModelNotConfiguredError, match="unreadable"):
        model_path("probe", None, tmp_path, "ci", "--model")
    with pytest.raises(ValueError, match="unknown model role"):
        model_path("policy", None, tmp_path, "ci", "--model")


def test_a_built_zoo_leaves_its_manifest(zoo) -> None:
    # The session's zoo went through ensure_zoo, which writes the manifest every time.
    cache_dir = zoo.root.parents[1]
    for role, expected in (("probe", zoo.probe), ("level1", zoo.level1), ("rm_light", zoo.rm_light)):
        assert model_path(role, None, cache_dir, zoo.config.preset, "--model") == str(expected)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_service_imports_another_service() -> None:
    services = sorted(p.name for p in ROOT.glob("svc_*") if p.is_dir())
    offenders = [f"{rel} imports {name}" for service in services for rel, names in _modules(f"{service}/**/*.py")
                 for name in names if _top(name).startswith("svc_") and _top(name) != service]
    assert not offenders, "\n".join(offenders)


def test_checksums_and_versions(tmp_path: Path) -> None:
    import hashlib

    from strata.contract.checksums import policy_checksum, sha256_file, version_id, weights_checksum

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "model.safetensors").write_bytes(b"policy weights")
    (b / "part-1.safetensors").write_bytes(b"one")
    (b / "part-2.safetensors").write_bytes(b"two")
    assert policy_checksum(a) == hashlib.sha256(b"policy weights").hexdigest() == sha256_file(a / "model.safetensors")
    # Members in order, their weight files sorted: a then b is not b then a.
    assert weights_checksum([a, b]) == hashlib.sha256(b"policy weightsonetwo").hexdigest()
    assert weights_checksum([b, a]) != weights_checksum([a, b])
    assert version_id("light", weights_checksum([a])) == "light-" + hashlib.sha256(b"policy weights").hexdigest()[:12]
    with pytest.raises(FileNotFoundError, match="no weights"):
        weights_checksum([tmp_path])


def test_identities_keep_their_spelling() -> None:
    from strata.contract.identity import request_identity, sample_identity

    # These strings are inside Redis keys of running deployments: changing them forgets every claim.
    assert sample_identity("p", "r", "req", 3) == "p:r:req:3"
    assert request_identity("req", 5, 6) == "req" and request_identity("", 5, 6) == "t5.6"


def _modules(pattern: str) -> list[tuple[str, set[str]]]:
    return [(p.relative_to(ROOT).as_posix(), _imports(p)) for p in sorted(ROOT.glob(pattern))]


def _top(name: str) -> str:
    return name.split(".")[0]


def test_the_library_imports_neither_tools_nor_services() -> None:
    offenders = [f"{rel} imports {name}" for rel, names in _modules(f"{LIBRARY}/**/*.py")
                 for name in names if _top(name) == TOOLS or _top(name).startswith("svc_")]
    assert not offenders, "\n".join(offenders)


def test_the_services_import_the_library_only() -> None:
    offenders = [f"{rel} imports {name}" for rel, names in _modules("svc_*/**/*.py")
                 for name in names if _top(name) == TOOLS]
    assert not offenders, "\n".join(offenders)


def test_within_the_tools_the_zoo_imports_no_service_and_only_the_cli_imports_the_cli() -> None:
    offenders = []
    for rel, names in _modules(f"{TOOLS}/**/*.py"):
        for name in names:
            if _top(name).startswith("svc_") and rel.startswith(f"{TOOLS}/zoo/"):  # the zoo builds models
                offenders.append(f"{rel} imports {name}")
            if name.startswith(f"{TOOLS}.cli") and not rel.startswith(f"{TOOLS}/cli/"):
                offenders.append(f"{rel} imports {name}")
    assert not offenders, "\n".join(offenders)


# How an RM is made (strata_tools/rm/recipe.py and what it trains with, the task's rows among it): the zoo
# calls it, so it never calls the zoo back, nor a service, nor the tools that run it (docs/architecture.md).
RM_RECIPE = (*(f"{TOOLS}/rm/{name}.py" for name in ("recipe", "train", "distill", "augment", "refresh", "rows",
                                                     "models")),
             "strata/models/training.py", "strata/models/growth.py")


def test_the_rm_recipe_imports_no_zoo_service_or_rm_run() -> None:
    runs = tuple(f"{TOOLS}.rm.{name}" for name in ("lifecycle", "light", "strong", "loop", "onpolicy", "versions",
                                                   "human"))
    offenders = [f"{rel} imports {name}" for rel in RM_RECIPE for name in _imports(ROOT / rel)
                 if _top(name).startswith("svc_") or name == f"{TOOLS}.zoo" or name.startswith(f"{TOOLS}.zoo.")
                 or name in runs]
    assert not offenders, "\n".join(offenders)


def _every_import(path: Path) -> set[str]:
    """What ``path`` imports anywhere (in functions and under ``if TYPE_CHECKING:`` too, as ``_imports``), with
    ``from a import b`` also as ``a.b`` (``b`` may be a module) and relative imports resolved."""
    names = set()
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])]
                            ) if node.level else node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(f"{package}.")


def test_the_zoo_imports_rm_and_rm_never_the_zoo() -> None:
    # The tools' model side in layers: the synthetic task (strata_tools/task/: the suite, the oracle, the
    # corpora, the desk) <- the RM lifecycle (strata_tools/rm/) <- the zoo build (strata_tools/zoo/), which
    # reads the task too. rm is handed a zoo (strata_tools/rm/models.py's protocols), never imports one.
    zoo, rm, task = f"{TOOLS}.zoo", f"{TOOLS}.rm", f"{TOOLS}.task"
    rm_files, task_files = sorted(ROOT.glob(f"{TOOLS}/rm/**/*.py")), sorted(ROOT.glob(f"{TOOLS}/task/**/*.py"))
    assert rm_files and task_files
    offenders = [f"{p.relative_to(ROOT)} imports {name}" for p in rm_files for name in sorted(_every_import(p))
                 if _within(name, zoo)]
    offenders += [f"{p.relative_to(ROOT)} imports {name}" for p in task_files for name in sorted(_every_import(p))
                  if _within(name, zoo) or _within(name, rm)]
    assert not offenders, "\n".join(offenders)
    build = _every_import(ROOT / TOOLS / "zoo" / "build.py")
    assert any(_within(name, rm) for name in build) and any(_within(name, task) for name in build)
