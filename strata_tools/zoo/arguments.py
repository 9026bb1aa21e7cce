"""Command-line arguments that choose a zoo (``--preset``, ``--cache-dir``), shared by ``strata models``
and ``strata bench zoo``."""

from __future__ import annotations

import argparse
import os
from typing import Any

from strata.errors import CliError


def add_zoo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default=None, help="zoo preset: default | ci (env STRATA_ZOO_PRESET)")
    parser.add_argument("--cache-dir", default=None, help="cache root (env STRATA_CACHE_DIR, default ~/.cache/strata)")


def zoo_settings_from_args(args: argparse.Namespace, **extra: Any) -> Any:
    # Imported here: strata_tools.zoo.build loads torch and transformers (seconds), and every `strata`
    # command registers these arguments, `strata health` (a container's healthcheck) included.
    from strata_tools.zoo.build import ZooSettings
    from strata_tools.zoo.config import PRESETS

    overrides: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if args.preset is not None:
        overrides["zoo_preset"] = args.preset
    if args.cache_dir is not None:
        overrides["cache_dir"] = os.path.expanduser(args.cache_dir)
    settings = ZooSettings(**overrides)
    if settings.zoo_preset not in PRESETS:
        raise CliError(f"unknown zoo preset {settings.zoo_preset!r}: use one of {', '.join(PRESETS)}")
    return settings

