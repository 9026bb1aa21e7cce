"""The seal on the suite's ``test`` split (R27): no test prompt reaches a set that trains, calibrates or chooses.

Headline figures are reported on the test split, so they mean something only while nothing was fitted,
calibrated or chosen on it. Every path that builds such a set (the zoo's training prompts, the PPO
prompt stream, an RM's distillation pairs, a calibration sample) passes its prompts through
:func:`check_sealed`, which refuses a set holding a test prompt by content hash (the hash the stack
keys prompts by, so a copy with other whitespace is caught too). ``tests/zoo/test_seal.py`` runs each
of those builders and fails CI if the seal breaks.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from strata.hashing import content_hash
from strata_tools.task.suite import SEALED_SPLIT, load_suite


class SealBrokenError(ValueError):
    """A training, calibration or recipe set holds a prompt of the sealed test split."""


@lru_cache(maxsize=1)
def sealed_prompts() -> dict[str, str]:
    """The test split's prompts: content hash -> suite id."""
    return {content_hash(record.text): record.id for record in load_suite(SEALED_SPLIT)}


def check_sealed(prompts: Iterable[str], role: str) -> None:
    """Raise :class:`SealBrokenError` when ``prompts`` (texts) hold a test-split prompt. ``role`` names the set
    in the message ("the zoo's training prompts", "the escalation calibration")."""
    sealed = sealed_prompts()
    leaked = sorted({sealed[h] for h in map(content_hash, prompts) if h in sealed})
    if leaked:
        shown = ", ".join(leaked[:3]) + (f" and {len(leaked) - 3} more" if len(leaked) > 3 else "")
        raise SealBrokenError(f"{role} would use {len(leaked)} prompt(s) of the sealed {SEALED_SPLIT!r} split "
                              f"({shown}); headline figures are reported there, so nothing may be trained, "
                              "calibrated or chosen on it: use the train or fresh (validation) split")
