"""``strata models``: build the offline model zoo, show where it is."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from strata.errors import CliError
from strata_tools.zoo.arguments import add_zoo_arguments, zoo_settings_from_args


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("models", help="build and locate the offline model zoo")
    sub = parser.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)

    build = sub.add_parser("build", help="train the zoo's tokenizer, LMs and reward models (cached)")
    add_zoo_arguments(build)
    build.add_argument("--force", action="store_true", help="rebuild even if the cache has this zoo")
    build.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    build.set_defaults(func=_build)

    path = sub.add_parser("path", help="print the zoo's model directories as JSON (built or not)")
    add_zoo_arguments(path)
    path.set_defaults(func=_path)

    from strata.models.tiny import ARCHITECTURES

    tiny = sub.add_parser("tiny", help="write a tiny random-weight checkpoint of a model family (tests, benches)")
    tiny.add_argument("arch", choices=ARCHITECTURES, help="family (llama, qwen2, mistral: with a chat template)")
    tiny.add_argument("out", help="directory to write (must not exist or be empty)")
    tiny.add_argument("--kind", choices=("causal", "reward"), default="causal",
                      help="causal LM (generator, policy, probe) or sequence-classification reward model")
    tiny.add_argument("--positions", type=int, default=512, help="context length in tokens (default 512)")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_tiny)


def _paths_dict(paths: Any) -> dict[str, str]:
    roles = ("root", "tokenizer", "probe", "level1", "level2", "rm_strong", "rm_light", "rm_data")
    return {role: str(getattr(paths, role)) for role in roles} | {"policy": str(paths.policy)}


def _build(args: argparse.Namespace) -> int:
    from strata_tools.zoo.build import ensure_zoo, zoo_paths

    settings = zoo_settings_from_args(args, zoo_threads=args.threads)
    paths = zoo_paths(settings)
    print(f"zoo preset={paths.config.preset} hash={paths.config.config_hash()} dir={paths.root}")
    started = time.perf_counter()
    paths = ensure_zoo(settings, force=args.force)
    manifest = json.loads((paths.root / "manifest.json").read_text())
    print(f"zoo built in {time.perf_counter() - started:.1f}s (stages: {manifest['stage_seconds']})")
    for role, path in _paths_dict(paths).items():
        print(f"  {role:10s} {path}")
    return 0


def _path(args: argparse.Namespace) -> int:
    from strata_tools.zoo.build import zoo_paths

    paths = zoo_paths(zoo_settings_from_args(args))
    print(json.dumps(_paths_dict(paths) | {"built": paths.is_complete()}, indent=2))
    return 0


def _tiny(args: argparse.Namespace) -> int:
    from strata.models.tiny import build_tiny_model

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CliError(f"{out} exists and is not an empty directory: pick a new path")
    if args.positions < 64:
        raise CliError(f"--positions must be at least 64, got {args.positions}")
    build_tiny_model(args.arch, out, args.kind, positions=args.positions, seed=args.seed)
    print(f"wrote a tiny {args.arch} {args.kind} model to {out}")
    return 0
