"""Where a service finds its model when none is configured: the manifest a built zoo leaves behind.

Building the zoo (``strata models build``, ``strata up``, ``make demo``, compose's ``strata-init``)
writes ``<cache_dir>/zoo/<preset>.json``::

    {"zoo": "<config hash>", "models": {"probe": "...", "level1": "...", "level2": "...",
                                       "rm_light": "...", "rm_strong": "..."}}

A service started without a model path reads the manifest of its ``zoo_preset`` and uses that
model. It never builds one: a model build takes minutes to a quarter of an hour, which has no place
in a service's start-up (a health check would give up, and every replica would build its own). No
manifest, or a manifest whose model is gone, is an error that names the setting to give.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from strata.errors import ServiceConfigError

ROLES: tuple[str, ...] = ("probe", "level1", "level2", "rm_light", "rm_strong")


class ModelNotConfiguredError(ServiceConfigError):
    """A service has no model path and no built zoo to take it from; the message says what to set."""


def manifest_path(cache_dir: Path, preset: str) -> Path:
    return Path(cache_dir) / "zoo" / f"{preset}.json"


def write_manifest(cache_dir: Path, preset: str, zoo_hash: str, models: Mapping[str, Path]) -> Path:
    """Record a complete zoo's model directories for ``preset`` (atomically: readers never see half)."""
    unknown = set(models) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown model roles {sorted(unknown)}; known: {', '.join(ROLES)}")
    path = manifest_path(cache_dir, preset)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"zoo": zoo_hash, "models": {role: str(p) for role, p in models.items()}}, indent=2)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{preset}.", delete=False) as out:
        out.write(body + "\n")
    os.replace(out.name, path)
    return path


def model_path(role: str, configured: str | Path | None, cache_dir: Path, preset: str, setting: str) -> str:
    """``configured`` when set, else the ``role`` model of the built ``preset`` zoo.

    ``setting`` names the flag / variable that configures it, for the error message.
    """
    if role not in ROLES:
        raise ValueError(f"unknown model role {role!r}; known: {', '.join(ROLES)}")
    if configured:
        return str(configured)
    manifest = manifest_path(cache_dir, preset)
    hint = (f"set {setting} to a model directory, or build the {preset!r} zoo first "
            f"(`strata models build --preset {preset}`; `strata up` and `make demo` do it)")
    try:
        models = json.loads(manifest.read_text())["models"]
    except FileNotFoundError:
        raise ModelNotConfiguredError(f"no {role} model configured and no built zoo at {manifest}: {hint}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelNotConfiguredError(f"the zoo manifest {manifest} is unreadable ({exc}): {hint}") from exc
    path = models.get(role)
    if not path or not Path(path).is_dir():
        raise ModelNotConfiguredError(f"the zoo manifest {manifest} names no {role} model on disk ({path}): {hint}")
    return str(path)
