"""What every check returns: a verdict, the number behind it, and the cure to try."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Verdict(str, Enum):
    PASS = "PASS"
    ALARM = "ALARM"
    ERROR = "ERROR"  # the check could not run (service down, no data); says why in ``summary``


@dataclass(frozen=True)
class CheckResult:
    check: str                        # rm-noise | shift | rm-overfit | memory | repetition
    verdict: Verdict
    value: float | None               # the measured number (None when the check could not run)
    threshold: float | None           # the decision rule's bound
    rule: str                         # e.g. "spread > 0.1 alarms"
    summary: str                      # one line: the number in words
    cure: str                         # the article's fix for this failure mode (always shown)
    details: Mapping[str, Any] = field(default_factory=dict)  # supporting numbers, JSON-friendly

    @property
    def alarmed(self) -> bool:
        return self.verdict is Verdict.ALARM


def error_result(check: str, cure: str, why: str) -> CheckResult:
    """A check that could not run: shown in the table, and a non-zero exit of ``all``."""
    return CheckResult(check, Verdict.ERROR, None, None, "", f"could not run: {why}", cure)
