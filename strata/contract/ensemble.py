"""A reward-model directory that holds several members (issue 61: a strong RM of members trained on
different data is a second opinion; a copy of the judge is not).

``strata_ensemble.json`` in a directory names its members, subdirectories written by ``save_pretrained``,
in order: ``{"members": ["member-0", "member-1"]}``. Loading it (``strata.models.loading.load_reward_model``)
gives one model whose score distribution is the mixture of the members' (its expected score is their mean),
so every consumer of an RM directory (svc_reward, distillation, the benches) reads an ensemble as it reads
one model, and the ledger books the members' parameters summed. Pure: reads one JSON file.
"""

from __future__ import annotations

import json
from pathlib import Path

ENSEMBLE_FILE = "strata_ensemble.json"


def ensemble_members(model_dir: str | Path) -> list[Path] | None:
    """The member directories of an ensemble directory, in order; None when ``model_dir`` is not one.
    ValueError naming the file when it is malformed or a member is not inside the directory."""
    directory = Path(model_dir)
    manifest = directory / ENSEMBLE_FILE
    if not manifest.is_file():
        return None
    try:
        names = json.loads(manifest.read_text(encoding="utf-8"))["members"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{manifest} is not {{\"members\": [<subdirectory>, ...]}}: {exc}") from None
    if not isinstance(names, list) or len(names) < 2 or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{manifest}: 'members' must list at least two subdirectory names, got {names!r}")
    members = [directory / name for name in names]
    for name, member in zip(names, members, strict=True):
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"{manifest}: member {name!r} must be a subdirectory of {directory}")
        if not member.is_dir():
            raise ValueError(f"{manifest}: member {name!r} is not a directory in {directory}")
    return members
