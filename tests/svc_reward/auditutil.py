"""Scripted audit streams for the live audit's and the defence's tests."""

from __future__ import annotations

import random

from strata.audit import AuditTally


def audit_stream(gap_at: list[float], per_version: int, seed: int = 0, noise: float = 0.4
                 ) -> list[tuple[int, AuditTally]]:
    """Per policy version, ``per_version`` audits whose light score sits ``gap_at[v]`` above the strong one
    (plus Gaussian ``noise``); the strong RM calls an answer bad under 1.5."""
    rng = random.Random(seed)
    versions = []
    for version, gap in enumerate(gap_at):
        tally = AuditTally()
        for _ in range(per_version):
            strong = rng.uniform(1.0, 4.0)
            tally = tally + AuditTally.of(strong + gap + rng.gauss(0, noise), strong, False, strong < 1.5)
        versions.append((version, tally))
    return versions
