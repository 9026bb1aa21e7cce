"""Annotator drift (R18): is any annotator's scoring drifting away from the gold items?

Symptom: an annotator's scores move away from the known scores of gold items (the seed's 3.8 -> 4.2
over 300 items), or scatter around them. svc_annotation tracks it per annotator (a CUSUM on gold
residuals, ``svc_annotation.drift``); this check reads its ``Status`` and alarms when any annotator's
tracker has. Cure: re-brief the annotator on the gold set and check their scores since the alarm item
(the lead's page shows it); acknowledging the alarm there restarts their tracking.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from strata_tools.diagnose.verdict import CheckResult, Verdict

NAME = "annotators"
CURE = ("re-brief the annotator on the gold items and review their scores since the alarm item (lead page "
        "/lead); acknowledge the alarm there to restart their tracking (R18)")
ALARMS = ("drift_up", "drift_down", "disagreement")


def evaluate(annotators: Mapping[str, Any]) -> CheckResult:
    """``annotators``: the desk's ``StatusResponse.annotators`` (name -> AnnotatorStatus)."""
    alarmed = sorted(name for name, row in annotators.items() if row.drift_status in ALARMS)
    judged = [name for name, row in annotators.items() if row.drift_status and row.drift_status != "not_judged"]
    details = {name: {"status": row.drift_status or "unknown", "gold_bias": None if math.isnan(row.gold_bias)
                      else round(row.gold_bias, 3), "gold_window": row.gold_window, "scored": row.scored}
               for name, row in sorted(annotators.items())}
    if alarmed:
        summary = "drifting: " + ", ".join(f"{n} ({annotators[n].drift_status}, gold bias "
                                           f"{annotators[n].gold_bias:+.2f})" for n in alarmed)
    elif judged:
        summary = f"{len(judged)} annotator(s) judged against gold, none drifting"
    else:
        summary = "no annotator has enough gold items in its window to be judged yet"
    return CheckResult(NAME, Verdict.ALARM if alarmed else Verdict.PASS, float(len(alarmed)), 0.0,
                       "an annotator's drift alarm alarms", summary, CURE, details)
