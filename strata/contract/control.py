"""Checks on control events (``PolicyUpdated``, ``RewardModelUpdated``) before anyone acts on them.

A control event names files to load into a serving process; a bad one must not freeze a follower
(a huge version no later update can beat), crash-loop it (it is replayed at every start) or make it
load foreign weights (a path outside the checkpoint root). Pure: the callers read the files.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
MAX_PATH_CHARS = 4096
MAX_VERSION_CHARS = 128
MAX_ENSEMBLE_MEMBERS = 16  # models one RM version may load at once


def _has_controls(text: str) -> bool:
    """NUL, newlines, escapes: nothing a path or a version name carries."""
    return any(ord(c) < 32 for c in text)


class ControlEventError(ValueError):
    """A control event that must not be acted on; the message says why."""


class ControlEventUnavailable(Exception):
    """A control event whose files cannot be read here now: skipped, not refused for good."""


def confined_path(raw: str, root: Path | None, what: str = "path") -> Path:
    """``raw`` as a resolved path inside ``root`` (when one is configured), or :class:`ControlEventError`."""
    if not raw:
        raise ControlEventError(f"{what} is empty")
    if len(raw) > MAX_PATH_CHARS:
        raise ControlEventError(f"{what} is {len(raw)} characters long")
    if _has_controls(raw):
        raise ControlEventError(f"{what} contains control characters")
    path = Path(raw)
    if not path.is_absolute() and root is not None:
        path = root / path
    resolved = path.resolve()
    if root is not None:
        base = root.resolve()
        if resolved != base and base not in resolved.parents:
            raise ControlEventError(f"{what} {raw!r} is outside the configured root {base}")
    return resolved


def check_checksum(checksum: str) -> str:
    if not SHA256_HEX.fullmatch(checksum):
        raise ControlEventError("checksum missing or not a sha256 hex digest: a follower loads only verified files")
    return checksum


def check_policy_update(version: int, path: str, checksum: str, root: Path | None,
                        recorded_version_of: Callable[[Path], int | None]) -> Path:
    """The checkpoint directory a ``PolicyUpdated`` may load, or :class:`ControlEventError`.

    ``recorded_version_of``: reads the version a checkpoint's own metadata records (None: unreadable),
    called only once the path is known to be inside the root. The event's version must be that one:
    a forged or corrupted version (2^63) would otherwise outrank every real update and freeze the
    follower.
    """
    directory = confined_path(path, root, "checkpoint_path")
    check_checksum(checksum)
    recorded_version = recorded_version_of(directory)
    if recorded_version is None:  # maybe not for good: a volume not mounted yet on this replica
        raise ControlEventUnavailable(f"checkpoint_path {path!r} holds no readable checkpoint metadata")
    if recorded_version != version:
        raise ControlEventError(f"policy_version {version} does not match the checkpoint's own version "
                                f"{recorded_version}")
    return directory


def check_rm_update(rm_version: str, paths: Sequence[str], checksum: str, root: Path | None) -> list[Path]:
    """The model directories a ``RewardModelUpdated`` may load, or :class:`ControlEventError`."""
    if not rm_version or len(rm_version) > MAX_VERSION_CHARS or _has_controls(rm_version):
        raise ControlEventError(f"rm_version {rm_version[:40]!r} is empty, too long or has control characters")
    if not paths:
        raise ControlEventError("no model path")
    if len(paths) > MAX_ENSEMBLE_MEMBERS:
        raise ControlEventError(f"{len(paths)} model paths: an ensemble has at most {MAX_ENSEMBLE_MEMBERS}")
    check_checksum(checksum)
    return [confined_path(p, root, f"path[{i}]") for i, p in enumerate(paths)]
