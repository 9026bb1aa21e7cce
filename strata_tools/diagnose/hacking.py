"""Reward hacking (issue 61): does the policy climb the light RM's blind spots?

Symptom: the light RM rates the current policy's answers ever higher than the strong RM does on the same
answers. The reward service audits a share of Level-1 answers with the strong RM (``svc_reward.audit``)
and keeps the tallies per policy version in Redis; this check compares the newest versions' gap with
the first audited versions' and alarms when it grew past ``hacking_gap_bound`` at one-sided 95 %.
Cure: the reward service's defence answers on its own (``svc_reward.defence``: a larger strong-RM share,
its reward given to PPO, and a re-distillation request that `strata rm refresh --every` answers); by
hand, re-distil the light RM on the audited answers (`strata rm refresh --audits`) or serve a
conservative ensemble (``STRATA_AGGREGATION=lcb``).
"""

from __future__ import annotations

from collections.abc import Sequence

from strata_tools.diagnose.verdict import CheckResult, Verdict, error_result
from svc_reward.audit import AuditTally, describe, drift, estimates, hacking_alarm, windows

NAME = "hacking"
CURE = ("keep the reward service's hacking defence on (a larger strong-RM share, its reward given to PPO) and "
        "`strata rm refresh --every` running to answer its re-distillation request; by hand, `strata rm refresh "
        "--audits`, or a conservative ensemble (STRATA_AGGREGATION=lcb) (issue 61)")


def evaluate(by_version: Sequence[tuple[int, AuditTally]], bound: float, min_audits: int) -> CheckResult:
    """``by_version``: the audit tallies per policy version (``svc_reward.audit_store.read_versions``)."""
    baseline, current = windows(by_version, min_audits)
    lines = describe(baseline, current, bound, min_audits)
    if current is None or baseline is None:
        return error_result(NAME, CURE, " ".join(line.strip() for line in lines))
    before, now = estimates(baseline.tally), estimates(current.tally)
    moved = drift(before, now)
    alarm = hacking_alarm(before, now, bound)
    details = {"baseline": baseline.versions, "current": current.versions, "audits": now.audits,
               "gap": round(now.gap, 4), "baseline_gap": round(before.gap, 4), "growth_low": round(moved.low, 4),
               "catch": round(now.catch.estimate, 4) if now.catch.items else None,
               "false_pass": round(now.false_pass.estimate, 4) if now.false_pass.items else None}
    return CheckResult(NAME, Verdict.ALARM if alarm else Verdict.PASS, moved.change, bound,
                       f"gap growth's 95 % lower bound > {bound:g} alarms", " ".join(line.strip() for line in lines),
                       CURE, details)
