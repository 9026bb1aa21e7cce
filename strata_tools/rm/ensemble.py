"""``strata rm ensemble``: several trained RMs as one ensemble directory (``strata.contract.ensemble``).

The members are copied in as ``member-<i>`` (the first is the student init a light RM distilled from the
ensemble starts from), so the directory is self-contained and its checksum, version and cost are the
members'. Written beside ``out`` and renamed into place: nothing half-written is ever an ensemble.
``check_given_rms`` checks the ``--light-rm`` / ``--strong-rm`` directories a bench is given, either kind.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from strata.contract.checksums import version_id, weights_checksum
from strata.contract.ensemble import ENSEMBLE_FILE
from strata.errors import CliError


def write_ensemble(members: Sequence[str | Path], out: Path, kind: str = "strong") -> str:
    """Copy ``members`` (RM directories) into ``out`` as an ensemble; returns its version. CliError naming
    what to fix: fewer than two members, a member that is not an RM directory, an ``out`` that exists."""
    sources = [Path(m).expanduser() for m in members]
    if len(sources) < 2:
        raise CliError(f"--member: an ensemble needs at least two members, got {len(sources)}")
    for source in sources:
        if (source / ENSEMBLE_FILE).is_file():
            raise CliError(f"--member {source}: is an ensemble itself; name its members instead")
        if not (source / "config.json").is_file():
            raise CliError(f"--member {source}: not an RM directory (no config.json written by save_pretrained)")
    if out.exists():
        raise CliError(f"--out {out} exists: choose a new directory (an ensemble is never overwritten)")
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    names = [f"member-{i}" for i in range(len(sources))]
    for name, source in zip(names, sources, strict=True):
        shutil.copytree(source, staging / name)
    (staging / ENSEMBLE_FILE).write_text(json.dumps({"members": names}, indent=2) + "\n", encoding="utf-8")
    version = version_id(kind, weights_checksum([staging]))
    info = {"kind": kind, "version": version, "members": [str(s) for s in sources], "student_init": names[0]}
    (staging / "strata_rm.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    staging.rename(out)
    return version


def check_given_rms(light_rm: Path | None, strong_rm: Path | None) -> None:
    """CliError naming ``--light-rm`` or ``--strong-rm`` when the directory it gives does not exist."""
    for flag, path in (("--light-rm", light_rm), ("--strong-rm", strong_rm)):
        if path is not None and not Path(path).expanduser().is_dir():
            raise CliError(f"{flag} {path}: no such RM directory")
