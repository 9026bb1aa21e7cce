"""Policy checkpoints: written atomically, verified by checksum, loadable by plain transformers.

Layout of ``<checkpoint_dir>/v<version>/``::

    config.json, generation_config.json   the LM's Hugging Face config (save_pretrained)
    model.safetensors                     the LM's weights, one file; its sha256 is "the checksum"
    value_head.safetensors                the value head (ignored by AutoModelForCausalLM)
    tokenizer files                       when a tokenizer was given
    learner_config.json                   the resolved learner settings that produced the weights
    optimizer.pt                          optimizer state (tensors only), when given, for exact resume
    strata_checkpoint.json                version, step, sha256 of every file above, applied batches

A checkpoint is written into ``<checkpoint_dir>/.tmp-v<version>-*`` and renamed into place only
when complete (``rename`` is atomic within a filesystem), and the metadata file is written last
inside it: a reader never sees a half-written ``v<N>``. The policy directory is a plain
``save_pretrained`` directory, so generators load it with ``AutoModelForCausalLM.from_pretrained``
exactly like a user's own checkpoint.

Restart without double-applying a batch: the metadata records, per ``topic:partition``, the next
offset not yet applied (every lower offset was applied or deliberately dropped) and the ids of the
last applied batches (:class:`AppliedBatches`). A restarted learner loads the latest checkpoint and
skips any delivery that :meth:`AppliedBatches.is_applied` recognises.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from strata.contract.checksums import POLICY_META_FILE, POLICY_WEIGHTS_FILE, sha256_file
from svc_learner.policy import PolicyWithValueHead

FORMAT_VERSION = 1
META_FILE = POLICY_META_FILE
WEIGHTS_FILE = POLICY_WEIGHTS_FILE
LEARNER_CONFIG_FILE = "learner_config.json"
OPTIMIZER_FILE = "optimizer.pt"
MAX_BATCH_IDS = 256  # applied batch ids remembered per checkpoint (offsets cover everything older)
_VERSION_DIR = re.compile(r"v(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read; the message says which and why."""


class ChecksumMismatchError(CheckpointError):
    """A file of a checkpoint does not match the sha256 recorded when it was written."""


@dataclass(frozen=True)
class AppliedBatches:
    """Which reward events the weights of a checkpoint have already learned from."""

    offsets: Mapping[str, int] = field(default_factory=dict)  # "topic:partition" -> next offset not applied
    batch_ids: tuple[str, ...] = ()  # the last applied batch ids, oldest first, at most MAX_BATCH_IDS

    def is_applied(self, topic: str, partition: int, offset: int) -> bool:
        return offset < self.offsets.get(f"{topic}:{partition}", 0)

    def after_batch(self, batch_id: str, next_offsets: Mapping[tuple[str, int], int]) -> AppliedBatches:
        """This state plus one applied batch; ``next_offsets[(topic, partition)]`` = its highest offset + 1."""
        offsets = dict(self.offsets)
        for (topic, partition), offset in next_offsets.items():
            key = f"{topic}:{partition}"
            offsets[key] = max(offsets.get(key, 0), offset)
        return AppliedBatches(offsets, (*self.batch_ids, batch_id)[-MAX_BATCH_IDS:])

    def to_json(self) -> dict[str, Any]:
        return {"offsets": dict(sorted(self.offsets.items())), "batch_ids": list(self.batch_ids)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AppliedBatches:
        return cls({str(k): int(v) for k, v in data.get("offsets", {}).items()}, tuple(data.get("batch_ids", ())))


@dataclass(frozen=True)
class CheckpointInfo:
    """The verified metadata of one checkpoint directory."""

    path: Path  # the v<version> directory, usable as a model path
    version: int  # policy version (what rollouts are stamped with)
    step: int  # learner updates applied in total
    checksum: str  # sha256 of model.safetensors (PolicyUpdated.checksum)
    files: Mapping[str, str]  # relative path -> sha256, every file except the metadata itself
    applied: AppliedBatches
    learner_config: Mapping[str, Any]
    metrics: Mapping[str, float]  # the metrics of the update that produced it
    created_at: str  # ISO 8601, UTC


@dataclass(frozen=True)
class LoadedCheckpoint:
    info: CheckpointInfo
    policy: PolicyWithValueHead
    optimizer_state: dict[str, Any] | None  # for optimizer.load_state_dict, None if not saved


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    checkpoint_dir: str | Path,
    policy: PolicyWithValueHead,
    version: int,
    step: int,
    *,
    learner_config: Mapping[str, Any],
    applied: AppliedBatches | None = None,
    tokenizer: Any | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    metrics: Mapping[str, float] | None = None,
) -> CheckpointInfo:
    """Write ``<checkpoint_dir>/v<version>/`` atomically and return its metadata.

    ``learner_config`` is the resolved settings (``LearnerSettings.as_log_dict()``); ``tokenizer``
    anything with ``save_pretrained``. An existing ``v<version>`` is an error, never overwritten.
    """
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"v{version}"
    if final.exists():
        raise CheckpointError(f"checkpoint {final} already exists; versions are never overwritten")
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-v{version}-", dir=root))
    try:
        policy.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / LEARNER_CONFIG_FILE).write_text(json.dumps(dict(learner_config), indent=2, sort_keys=True, default=str))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        if not (tmp / WEIGHTS_FILE).is_file():
            raise CheckpointError(f"the policy did not write a single {WEIGHTS_FILE} (sharded or non-safetensors)")

        files = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        info = CheckpointInfo(
            path=final,
            version=version,
            step=step,
            checksum=files[WEIGHTS_FILE],
            files=files,
            applied=applied or AppliedBatches(),
            learner_config=dict(learner_config),
            metrics=dict(metrics or {}),
            created_at=datetime.now(timezone.utc).isoformat(),
        )
        (tmp / META_FILE).write_text(json.dumps(_meta_json(info), indent=2))  # written last
        for p in tmp.rglob("*"):
            if p.is_file():
                _fsync(p)
        _fsync(tmp)
        os.rename(tmp, final)  # atomic: v<version> appears complete or not at all
        _fsync(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return info


def _meta_json(info: CheckpointInfo) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "version": info.version,
        "step": info.step,
        "checksum": info.checksum,
        "weights_file": WEIGHTS_FILE,
        "files": dict(info.files),
        "applied": info.applied.to_json(),
        "metrics": dict(info.metrics),
        "created_at": info.created_at,
    }


def list_checkpoints(checkpoint_dir: str | Path) -> list[Path]:
    """Complete ``v<N>`` directories (metadata present), oldest version first; temp dirs are ignored."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = [
        (int(match.group(1)), p)
        for p in root.iterdir()
        if (match := _VERSION_DIR.fullmatch(p.name)) and (p / META_FILE).is_file()
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The highest-version complete checkpoint, or None when there is none."""
    checkpoints = list_checkpoints(checkpoint_dir)
    return checkpoints[-1] if checkpoints else None


def prune_checkpoints(checkpoint_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints; returns the deleted directories.

    Keep at least ``max_staleness + 1``: the behaviour log-probs of a stale sample are recomputed
    from the checkpoint of the version that generated it.
    """
    if keep < 1:
        raise ValueError("keep must be >= 1")
    doomed = list_checkpoints(checkpoint_dir)[:-keep]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def verify_checkpoint(path: str | Path) -> CheckpointInfo:
    """Read a checkpoint's metadata and check every file against its recorded sha256."""
    path = Path(path)
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise CheckpointError(f"{path} is not a Strata checkpoint: {META_FILE} is missing")
    try:
        meta = json.loads(meta_path.read_text())
        files: dict[str, str] = dict(meta["files"])
        version, step, checksum = int(meta["version"]), int(meta["step"]), str(meta["checksum"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"unreadable {meta_path}: {exc}") from exc
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{meta_path} has format {meta.get('format')!r}; this learner reads {FORMAT_VERSION}")
    if files.get(meta.get("weights_file", WEIGHTS_FILE)) != checksum:
        raise CheckpointError(f"{meta_path}: the checksum does not match the recorded weights file hash")
    for name, expected in files.items():
        file_path = path / name
        if not file_path.is_file():
            raise CheckpointError(f"checkpoint {path} is incomplete: {name} is missing")
        actual = sha256_file(file_path)
        if actual != expected:
            raise ChecksumMismatchError(
                f"checkpoint {path}: {name} has sha256 {actual}, expected {expected} (corrupted or modified)"
            )
    learner_config_path = path / LEARNER_CONFIG_FILE
    learner_config = json.loads(learner_config_path.read_text()) if learner_config_path.is_file() else {}
    return CheckpointInfo(
        path=path,
        version=version,
        step=step,
        checksum=checksum,
        files=files,
        applied=AppliedBatches.from_json(meta.get("applied", {})),
        learner_config=learner_config,
        metrics={str(k): float(v) for k, v in meta.get("metrics", {}).items()},
        created_at=str(meta.get("created_at", "")),
    )


def load_checkpoint(path: str | Path, device: str = "auto", dtype: str = "float32") -> LoadedCheckpoint:
    """Verify a checkpoint (:class:`ChecksumMismatchError` on any altered file), then load the policy."""
    info = verify_checkpoint(path)
    policy = PolicyWithValueHead.from_pretrained(info.path, device=device, dtype=dtype)
    optimizer_path = info.path / OPTIMIZER_FILE
    optimizer_state = (
        torch.load(optimizer_path, map_location="cpu", weights_only=True) if optimizer_path.is_file() else None
    )
    return LoadedCheckpoint(info, policy, optimizer_state)
