"""Two judges audit the light RM (strata.audit): the alarm and the defence act on the one that fires, else on
the one whose gap grew most."""

from __future__ import annotations

from auditutil import audit_stream

from strata.audit import HUMAN_AUDIT, STRONG_AUDIT, deciding, read_judges


def test_the_judge_that_fires_decides_and_names_itself() -> None:
    flat, grown = audit_stream([0.5] * 8, 10, seed=1), audit_stream([0.0] * 4 + [1.0] * 4, 10, seed=2)
    readings = read_judges({HUMAN_AUDIT: grown, STRONG_AUDIT: flat}, min_audits=30, bound=0.25)
    assert [r.judge for r in readings] == [HUMAN_AUDIT, STRONG_AUDIT]
    acting = deciding(readings)
    assert acting is not None and acting.judge is HUMAN_AUDIT and acting.alarm is not None
    assert "than people" in acting.alarm and acting.last_version == 7
    assert deciding(list(reversed(readings))).judge is HUMAN_AUDIT  # type: ignore[union-attr]


def test_quiet_judges_leave_the_one_whose_gap_grew_most() -> None:
    steady, creeping = audit_stream([0.5] * 8, 10, seed=3), audit_stream([0.0] * 4 + [0.1] * 4, 10, seed=4)
    acting = deciding(read_judges({STRONG_AUDIT: steady, HUMAN_AUDIT: creeping}, 30, 0.25))
    assert acting is not None and acting.alarm is None and acting.judge is HUMAN_AUDIT
    assert deciding(read_judges({HUMAN_AUDIT: [], STRONG_AUDIT: audit_stream([0.0], 5)}, 30, 0.25)) is None


def test_people_decide_when_both_judges_fire() -> None:
    grown = audit_stream([0.0] * 4 + [1.0] * 4, 10, seed=5)
    for order in ({STRONG_AUDIT: grown, HUMAN_AUDIT: grown}, {HUMAN_AUDIT: grown, STRONG_AUDIT: grown}):
        readings = read_judges(order, 30, 0.25)
        assert all(r.alarm for r in readings)
        assert deciding(readings).judge is HUMAN_AUDIT  # type: ignore[union-attr]
