"""Reward hacking (issue 61): does the policy climb the light RM's blind spots?

Symptom: the light RM rates the current policy's answers ever higher than a second judge does on the same
answers. The reward service audits a share of Level-1 answers with the strong RM, and the annotation desk's
Level-1 share is judged by people (``strata.audit``); both keep tallies per policy version in Redis. This
check compares each judge's newest versions' gap with its first audited versions' and alarms when one grew
past ``hacking_gap_bound`` at one-sided 95 %.
Cure: the reward service's defence answers on its own (``svc_reward.defence``: a brake on the learner's KL
coefficient, a larger strong-RM share with its reward given to PPO unless the strong RM rates like the light
one, and a re-distillation request, on people's labels when people raised the alarm, that `strata rm refresh
--every` answers); by hand, re-distil the light RM on the audited answers (`strata rm refresh --audits`) or
serve a conservative ensemble (``STRATA_AGGREGATION=lcb``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from strata.audit import AuditJudge, AuditTally, deciding, describe_judges, drift, read_judges
from strata_tools.diagnose.verdict import CheckResult, Verdict, error_result

NAME = "hacking"
CURE = ("keep the reward service's hacking defence on (a KL brake on the learner, a larger strong-RM share with "
        "its reward given to PPO) and `strata rm refresh --every` running to answer its re-distillation request; "
        "by hand, `strata rm refresh --audits`, or a conservative ensemble (STRATA_AGGREGATION=lcb) (issue 61)")


def evaluate(by_judge: Mapping[AuditJudge, Sequence[tuple[int, AuditTally]]], bound: float,
             min_audits: int) -> CheckResult:
    """``by_judge``: each judge's audit tallies per policy version (``strata.audit.read_versions``); people
    first. ALARM when any judge's gap grew past ``bound``; the verdict's figures are the deciding judge's
    (``strata.audit.deciding``)."""
    summary = " ".join(line.strip() for line in describe_judges(by_judge, bound, min_audits))
    acting = deciding([r for r in read_judges(by_judge, min_audits, bound) if r.baseline is not None])
    if acting is None or acting.baseline is None or acting.baseline_window is None:
        return error_result(NAME, CURE, summary)
    before, now = acting.baseline, acting.current
    moved = drift(before, now)
    details = {"judge": acting.judge.name, "baseline": acting.baseline_window.versions,
               "current": acting.current_window.versions, "audits": now.audits,
               "gap": round(now.gap, 4), "baseline_gap": round(before.gap, 4), "growth_low": round(moved.low, 4),
               "catch": round(now.catch.estimate, 4) if now.catch.items else None,
               "false_pass": round(now.false_pass.estimate, 4) if now.false_pass.items else None}
    return CheckResult(NAME, Verdict.ALARM if acting.alarm else Verdict.PASS, moved.change, bound,
                       f"gap growth's 95 % lower bound > {bound:g} alarms", summary, CURE, details)
