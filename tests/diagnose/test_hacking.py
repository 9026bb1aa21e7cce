"""``strata diagnose hacking``: the live audit's gap growth as a PASS/ALARM verdict."""

from __future__ import annotations

from strata.audit import HUMAN_AUDIT, STRONG_AUDIT, AuditTally
from strata_tools.diagnose.hacking import evaluate
from strata_tools.diagnose.verdict import Verdict


def stream(gaps: list[float], per_version: int = 10) -> list[tuple[int, AuditTally]]:
    """Versions whose audited answers sit ``gap`` above the strong RM, with a fixed scatter."""
    out = []
    for version, gap in enumerate(gaps):
        tally = AuditTally()
        for i in range(per_version):
            strong = 1.0 + 0.3 * i
            tally = tally + AuditTally.of(strong + gap + (0.2 if i % 2 else -0.2), strong, i % 3 == 0, strong < 1.5)
        out.append((version, tally))
    return out


def test_a_grown_gap_alarms_and_a_steady_one_passes() -> None:
    grown = evaluate({STRONG_AUDIT: stream([0.0] * 4 + [1.0] * 4)}, bound=0.25, min_audits=30)
    assert grown.verdict is Verdict.ALARM and grown.value is not None and grown.value > 0.9
    assert grown.details["baseline"] == "v0-v2" and grown.details["current"] == "v5-v7"
    steady = evaluate({STRONG_AUDIT: stream([0.8] * 8)}, bound=0.25, min_audits=30)
    assert steady.verdict is Verdict.PASS and abs(steady.value or 0) < 1e-9


def test_too_few_audits_cannot_judge() -> None:
    result = evaluate({STRONG_AUDIT: stream([0.0] * 2)}, bound=0.25, min_audits=30)
    assert result.verdict is Verdict.ERROR and "no estimate yet" in result.summary


def test_people_alarm_where_the_strong_rm_sees_nothing() -> None:
    result = evaluate({HUMAN_AUDIT: stream([0.0] * 4 + [1.0] * 4), STRONG_AUDIT: stream([0.8] * 8)}, bound=0.25,
                      min_audits=30)
    assert result.verdict is Verdict.ALARM and result.details["judge"] == "human"
    assert "human audit" in result.summary and "live audit" in result.summary
