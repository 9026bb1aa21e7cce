"""RM overfit (seed §5.1 row 3): does the RM still rank responses to prompts it never saw?

Symptom: human evaluation improves while the automatic metric (the RM score) drops. Check: test the
RM on newly collected, unseen prompts; a Spearman correlation under 0.7 confirms overfitting. Cure:
adversarial augmentation of the RM's training data (perturb responses: synonym swaps, sentence
reordering, then re-score them; ``strata_tools.rm.augment``).

The reference ranking is the oracle judge (the zoo's stand-in for human scores) on the suite's
``fresh`` split, a user file's scores, or the strong RM (R5) on the same items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from strata_tools.diagnose.verdict import CheckResult, Verdict
from strata_tools.rm.refresh import spearman as rank_spearman

NAME = "rm-overfit"
CURE = ("augment the RM's training data with adversarial samples: perturbed responses (synonym swaps, "
        "sentence reordering) re-scored, then retrain / re-distil the light RM (strata_tools.rm.augment)")


@dataclass(frozen=True)
class RmOverfitConfig:
    n_pairs: int = 120               # fresh (prompt, response) pairs scored
    min_spearman: float = 0.7        # Spearman rho under which the check alarms


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho (Pearson of the ranks); 0 when either side is constant."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("need two sequences of the same length >= 2")
    rho = rank_spearman(a, b)
    return 0.0 if math.isnan(rho) else rho


@dataclass(frozen=True)
class OverfitMeasurement:
    rho: float
    n_pairs: int
    reference: str            # oracle | file | strong RM <version>
    rm_version: str


def measure(rm_scores: Sequence[float], reference_scores: Sequence[float], reference: str,
            rm_version: str) -> OverfitMeasurement:
    return OverfitMeasurement(spearman(rm_scores, reference_scores), len(rm_scores), reference, rm_version)


def evaluate(m: OverfitMeasurement, config: RmOverfitConfig) -> CheckResult:
    summary = (f"Spearman {m.rho:.3f} of RM {m.rm_version} against the {m.reference} "
               f"on {m.n_pairs} fresh (prompt, response) pairs")
    verdict = Verdict.ALARM if m.rho < config.min_spearman else Verdict.PASS
    details = {"spearman": m.rho, "pairs": m.n_pairs, "reference": m.reference, "rm_version": m.rm_version}
    return CheckResult(NAME, verdict, m.rho, config.min_spearman, f"rho < {config.min_spearman:g} alarms",
                       summary, CURE, details)
