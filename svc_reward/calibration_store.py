"""A light RM's score calibration on disk: ``strata_calibration.json`` in its model directory; its learned
escalation rule beside it, ``strata_escalation_rule.json`` (``write_rule``, ``read_rule``).

An ensemble's calibration maps the aggregated score, so it belongs to the ensemble, not to one
member; it lives in the *first* member's directory (the one ``RmVersion.path`` names) and its
``checksum`` is ``weights_checksum`` of every member, in order. Written atomically: a reader (a
reward service loading this version) sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from svc_reward.calibrate import ScoreCalibration
from svc_reward.escalation_rule import RULE_FILE, EscalationRule

CALIBRATION_FILE = "strata_calibration.json"


def calibration_path(model_dir: str | Path) -> Path:
    return Path(model_dir) / CALIBRATION_FILE


def write_calibration(model_dir: str | Path, calibration: ScoreCalibration) -> Path:
    """Store ``calibration`` in ``model_dir``. ValueError, nothing written, for a one-knot calibration: a
    constant map gives every answer the same calibrated score, so escalation would be all or nothing."""
    if len(calibration.raw) < 2:
        raise ValueError("the calibration is one constant (a single isotonic block: the score does not rise "
                         "with the labels); not stored, since every answer would get the same calibrated score")
    path = calibration_path(model_dir)
    _write_atomically(path, json.dumps(calibration.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def read_calibration(model_dir: str | Path) -> ScoreCalibration | None:
    """The calibration stored in ``model_dir``; None when there is none. ValueError (naming the file)
    when it is not a valid calibration; OSError when it cannot be read."""
    path = calibration_path(model_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return ScoreCalibration.from_dict(json.loads(text))
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path}: {exc}") from exc


def rule_path(model_dir: str | Path) -> Path:
    return Path(model_dir) / RULE_FILE


def write_rule(model_dir: str | Path, rule: EscalationRule) -> Path:
    """Store ``rule`` in ``model_dir`` atomically (a reader sees the old file or the new one)."""
    path = rule_path(model_dir)
    _write_atomically(path, json.dumps(rule.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def read_rule(model_dir: str | Path) -> EscalationRule | None:
    """The rule stored in ``model_dir``; None when there is none. ValueError (naming the file) when it is not
    a valid rule; OSError when it cannot be read."""
    path = rule_path(model_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return EscalationRule.from_dict(json.loads(text))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def _write_atomically(path: Path, body: str) -> None:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide it from a service running as another user
        with os.fdopen(fd, "w") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())  # the bytes are on disk before the name points at them
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
