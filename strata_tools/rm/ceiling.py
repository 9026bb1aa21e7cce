"""What escalation could reach on a set of judged answers: in-sample figures, not operating points.

A router's threshold is chosen on one split and read on another; these figures choose it on the answers they
read, so no threshold on the same score does better on them. They say whether a target is out of reach of a
score, not how close a served rule comes:

- :func:`least_share_for_catch`: the smallest share of answers escalated that catches ``target`` of the
  bad ones, with the threshold chosen on those answers (the best any threshold on that score does).
- :func:`binormal_auc_needed`: the AUC an equal-variance binormal detector needs for that catch at that
  share, at a given bad rate (the reading issue 61 states its targets in).
- :func:`escalation_apgr`: RouteLLM's APGR of escalating answers in one order, Level-2's expected score
  replacing Level-1's answer one answer at a time, from none escalated to all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from strata_tools.tiering.tier_eval import apgr
from svc_reward.escalation_rule import threshold_for_catch

_NORMAL = NormalDist()


def least_share_for_catch(suspicion: Sequence[float], bad: Sequence[bool], target: float) -> float:
    """The smallest share of answers escalated, most suspicious first, that escalates at least ``target`` of
    the bad ones; answers as suspicious as the last one needed go too (a threshold cannot split a tie).
    ValueError without a bad answer, or on a target outside (0, 1]."""
    if len(suspicion) != len(bad) or not suspicion:
        raise ValueError("one suspicion per answer, and at least one answer")
    if not 0 < target <= 1:
        raise ValueError(f"target catch must be in (0, 1], got {target}")
    cut = threshold_for_catch(suspicion, bad, target)  # the served rule's: escalate at P(bad) >= it
    return sum(s >= cut for s in suspicion) / len(suspicion)


def binormal_auc_needed(catch: float, share: float, bad_rate: float) -> float:
    """The AUC of an equal-variance binormal detector that catches ``catch`` of the bad answers while
    escalating ``share`` of all answers, ``bad_rate`` of them bad. ValueError when no detector can: the
    share holds fewer answers than the catch alone needs, or every good answer too."""
    if not 0 < bad_rate < 1 or not 0 < catch < 1:
        raise ValueError("bad_rate and catch must be in (0, 1)")
    false_escalation = (share - bad_rate * catch) / (1 - bad_rate)
    if not 0 < false_escalation < 1:
        raise ValueError(f"a share of {share:.3f} cannot hold a {catch:.0%} catch at a bad rate of {bad_rate:.3f} "
                         "with some good answers passing")
    separation = _NORMAL.inv_cdf(catch) - _NORMAL.inv_cdf(false_escalation)
    return _NORMAL.cdf(separation / math.sqrt(2))


def escalation_apgr(order: Sequence[float], level1: Sequence[float], level2: Sequence[float]) -> float:
    """APGR of escalating answers by descending ``order`` (suspicion, or expected gain): at k escalated the
    quality is the mean of Level-2's expected score on those k and Level-1's on the rest; weak and strong are
    the means at none and all; answers of equal ``order`` escalate together. ValueError when Level-2 is no
    better than Level-1 on average (no gap)."""
    if not len(order) == len(level1) == len(level2) or len(order) < 2:
        raise ValueError("one order value, Level-1 and Level-2 score per answer, and two or more answers")
    n = len(order)
    ranked = sorted(range(n), key=lambda i: -order[i])
    quality = sum(level1)
    points = [(0.0, quality / n)]
    for k, i in enumerate(ranked, start=1):
        quality += level2[i] - level1[i]
        if k == n or order[ranked[k]] != order[i]:  # equal values escalate together: one threshold
            points.append((k / n, quality / n))
    weak, strong = points[0][1], points[-1][1]
    if strong <= weak:
        raise ValueError("Level-2 scores no better than Level-1 on these answers: no gap to recover")
    return apgr(points, weak, strong)
