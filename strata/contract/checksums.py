"""Checksums and versions of model weights: what a publisher writes and every loader verifies.

- ``policy_checksum(dir)``: SHA-256 of a policy checkpoint's ``model.safetensors``
  (``PolicyUpdated.checksum``, written by the learner, verified by the generators);
- ``weights_checksum(dirs)``: SHA-256 over the weight files of every member, in order
  (``RewardModelUpdated.checksum``; for one model, the digest of its weight files);
- ``version_id(kind, checksum)``: ``<kind>-<12 hex>``, the version a model is served and logged as.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from strata.contract.ensemble import ensemble_members

POLICY_WEIGHTS_FILE = "model.safetensors"
POLICY_META_FILE = "strata_checkpoint.json"  # written last by the learner: version, step, checksums
_CHUNK = 1 << 20


def sha256_file(path: str | Path, chunk_bytes: int = _CHUNK) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def policy_checksum(checkpoint_dir: str | Path) -> str:
    return sha256_file(Path(checkpoint_dir) / POLICY_WEIGHTS_FILE)


def recorded_policy_version(checkpoint_dir: str | Path) -> int | None:
    """The version a policy checkpoint's own metadata records; None when it cannot be read."""
    try:
        return int(json.loads((Path(checkpoint_dir) / POLICY_META_FILE).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def weight_files(model_dir: str | Path) -> list[Path]:
    """The directory's weight files; an ensemble directory's are its members', in member order."""
    directory = Path(model_dir)
    if (members := ensemble_members(directory)) is not None:
        return [f for member in members for f in weight_files(member)]
    return sorted(directory.glob("*.safetensors")) or sorted(directory.glob("*.bin"))


def weights_checksum(model_dirs: Sequence[str | Path]) -> str:
    """SHA-256 of the weight files of every member, in order (hex)."""
    digest = hashlib.sha256()
    for model_dir in model_dirs:
        files = weight_files(model_dir)
        if not files:
            raise FileNotFoundError(f"no weights (*.safetensors or *.bin) in {model_dir}")
        for weights in files:
            with weights.open("rb") as handle:
                while block := handle.read(_CHUNK):
                    digest.update(block)
    return digest.hexdigest()


def version_id(kind: str, checksum: str) -> str:
    return f"{kind}-{checksum[:12]}"
