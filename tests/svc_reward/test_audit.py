"""The live audit (issue 61): tallies, estimates, windows over policy versions and the hacking alarm."""

from __future__ import annotations

import math

import pytest
from auditutil import audit_stream

from strata.audit import MIXED_RMS, AuditTally, estimates, hacking_alarm, since_rm_swap, windows
from svc_reward.audit import sampled_for_audit


def test_the_audit_draw_is_fixed_by_the_hash_and_takes_its_share() -> None:
    hashes = [f"{i:064x}" for i in range(4000)]
    drawn = [sampled_for_audit(h, 0.1) for h in hashes]
    assert drawn == [sampled_for_audit(h, 0.1) for h in hashes]
    assert 0.08 < sum(drawn) / len(drawn) < 0.12
    assert not any(sampled_for_audit(h, 0.0) for h in hashes)
    # Independent of the annotation draw: the same hashes are not simply the same share's first ones.
    from svc_reward.decide import sampled_for_annotation
    assert drawn != [sampled_for_annotation(h, 0.1) for h in hashes]


def test_estimates_on_a_constructed_tally() -> None:
    # (light, strong, escalated): two bad answers (strong < 1.5), one of them escalated; three passed.
    answers = [(3.0, 1.0, True), (3.5, 1.2, False), (4.0, 3.0, False), (2.0, 2.5, True), (4.5, 4.0, False)]
    tally = sum((AuditTally.of(lt, st, esc, st < 1.5) for lt, st, esc in answers), AuditTally())
    found = estimates(tally)
    gaps = [lt - st for lt, st, _ in answers]
    assert found.audits == 5
    assert found.gap == pytest.approx(sum(gaps) / 5)
    sd = math.sqrt(sum((g - found.gap) ** 2 for g in gaps) / 4)
    assert found.gap_se == pytest.approx(sd / math.sqrt(5))
    assert (found.catch.estimate, found.catch.items) == (0.5, 2)
    assert found.false_pass.estimate == pytest.approx(1 / 3) and found.false_pass.items == 3
    assert found.light_mean == pytest.approx(3.4) and found.strong_mean == pytest.approx(2.34)


def test_a_tally_reads_back_from_redis_fields() -> None:
    tally = AuditTally.of(3.0, 1.0, True, True) + AuditTally.of(2.0, 2.5, False, False)
    stored = {k.encode(): str(v).encode() for k, v in tally.fields().items()}
    assert AuditTally.from_fields(stored) == tally
    assert AuditTally.from_fields({}) == AuditTally()


def test_a_tally_reads_back_the_rms_that_scored_it() -> None:
    sums = {k: str(v) for k, v in AuditTally.of(3.0, 1.0, True, True).fields().items()}
    assert AuditTally.from_fields({**sums, "n@light-a": "1"}).rms == "light-a"
    # Answers of one version scored before and after a swap: both RMs' gaps in one sum.
    assert AuditTally.from_fields({**sums, "n@light-a": "1", "n@light-b": "2"}).rms == MIXED_RMS
    assert AuditTally.from_fields(sums).rms == ""  # written before the RMs were kept
    one, other = AuditTally.of(3.0, 1.0, True, True, "light-a"), AuditTally.of(2.0, 1.0, True, True, "light-b")
    assert (one + one).rms == "light-a" and (one + other).rms == MIXED_RMS and (one + AuditTally()).rms == "light-a"


def _under(rms: str, stream: list[tuple[int, AuditTally]], first_version: int = 0) -> list[tuple[int, AuditTally]]:
    """``stream``'s tallies as scored by ``rms``, its versions moved to start at ``first_version``."""
    return [(first_version + v, AuditTally(**{**t.fields(), "rms": rms})) for v, t in stream]  # type: ignore[arg-type]


def test_a_swap_of_rms_starts_the_baseline_again() -> None:
    """A light RM swapped in reads the policy 0.6 higher: a step in the gap that is the RMs', not the policy's."""
    before = _under("light-a", audit_stream([0.0] * 10, per_version=8))
    after = _under("light-b", audit_stream([0.6] * 10, per_version=8, seed=1), first_version=10)
    unaware = [(v, AuditTally(**t.fields())) for v, t in before + after]  # type: ignore[arg-type]
    baseline, current = windows(unaware, min_audits=30)
    assert baseline is not None and current is not None
    assert hacking_alarm(estimates(baseline.tally), estimates(current.tally), bound=0.25) is not None
    baseline, current = windows(before + after, min_audits=30)
    assert baseline is not None and current is not None and baseline.first_version == 10
    assert baseline.tally.rms == current.tally.rms == "light-b"
    assert hacking_alarm(estimates(baseline.tally), estimates(current.tally), bound=0.25) is None
    # The policy drifting under the new RM still raises it.
    growing = _under("light-b", audit_stream([0.6 + 0.06 * v for v in range(20)], per_version=8, seed=2), 10)
    baseline, current = windows(before + growing, min_audits=30)
    assert baseline is not None and current is not None and baseline.first_version == 10
    assert hacking_alarm(estimates(baseline.tally), estimates(current.tally), bound=0.25) is not None


def test_the_versions_since_a_swap_leave_out_the_one_that_spans_it() -> None:
    stream = audit_stream([0.0] * 6, per_version=4)
    tagged = _under("a", stream[:3]) + _under(MIXED_RMS, stream[3:4]) + _under("b", stream[4:])
    assert [v for v, _ in since_rm_swap(tagged)] == [4, 5]
    # Until a version is scored by the new RMs alone, the old ones' run goes on (the mixed version left out).
    assert [v for v, _ in since_rm_swap(tagged[:4])] == [0, 1, 2]
    # Tallies written before the RMs were kept go with any.
    assert [v for v, _ in since_rm_swap(_under("", stream[:3]) + _under("b", stream[3:]))] == list(range(6))


def test_no_audits_give_no_estimates() -> None:
    found = estimates(AuditTally())
    assert found.audits == 0 and math.isnan(found.gap) and found.catch.items == 0


def test_windows_sum_versions_until_they_hold_enough_audits() -> None:
    stream = audit_stream([0.0] * 10, per_version=4)
    baseline, current = windows(stream, min_audits=10)
    assert baseline is not None and current is not None
    assert (baseline.first_version, baseline.last_version) == (0, 2) and baseline.tally.n == 12
    assert (current.first_version, current.last_version) == (7, 9) and current.versions == "v7-v9"
    # Too few versions for two windows: the current one alone, no baseline.
    baseline, current = windows(stream[:4], min_audits=10)
    assert baseline is None and current is not None
    assert windows(stream[:2], min_audits=10) == (None, None)


def test_the_alarm_fires_on_a_gap_that_grows_and_not_on_a_steady_offset() -> None:
    """A scripted hacking stream: the light RM drifts above the strong one as the policy trains."""
    def alarm_after(gap_at: list[float]) -> list[bool]:
        fired = []
        for seen in range(1, len(gap_at) + 1):
            baseline, current = windows(audit_stream(gap_at, per_version=8)[:seen], min_audits=30)
            fired.append(current is not None and hacking_alarm(
                estimates(baseline.tally) if baseline else None, estimates(current.tally), bound=0.25) is not None)
        return fired

    steady = alarm_after([0.6] * 30)  # the light RM reads 0.6 higher throughout: an offset, not hacking
    assert not any(steady)
    growing = alarm_after([0.05 * v for v in range(30)])  # +1.45 by the end
    assert growing[-1] and not any(growing[:8])
    first = growing.index(True)
    assert all(growing[first:])  # once the gap has grown, it stays fired


def test_the_alarm_needs_a_baseline() -> None:
    current = estimates(audit_stream([2.0] * 5, per_version=10)[-1][1])
    assert hacking_alarm(None, current, bound=0.25) is None


def test_the_description_says_what_is_known() -> None:
    from strata.audit import describe

    assert "no estimate yet" in describe(None, None, 0.25, 30)[0]
    stream = audit_stream([0.05 * v for v in range(30)], per_version=8)
    baseline, current = windows(stream, min_audits=30)
    lines = describe(baseline, current, 0.25, 30)
    assert "policy v26-v29" in lines[0] and "FIRES" in lines[-1]
    baseline, current = windows(audit_stream([0.6] * 30, per_version=8), min_audits=30)
    assert describe(baseline, current, 0.25, 30)[-1].endswith("hacking alarm (strong) quiet")


def test_the_strong_rm_calls_bad_on_the_served_threshold_unless_a_line_is_set() -> None:
    from svc_reward.audit import strong_calls_bad

    assert strong_calls_bad(2.0, None, threshold=2.7)          # the strong score would have escalated it
    assert not strong_calls_bad(3.0, None, threshold=2.7)
    assert strong_calls_bad(2.0, 2.5, threshold=9.9)           # a set line wins
    # A calibrated threshold: the strong score is read on the calibration's scale first.
    assert strong_calls_bad(2.0, None, threshold=1.5, on_threshold_scale=lambda s: s - 1.0)
    assert not strong_calls_bad(2.0, None, threshold=1.5, on_threshold_scale=lambda s: s - 0.2)
