"""What a reward means for its rollout (R2, R3): final, or escalate to Level-2; and whether a human
scores it. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata.hashing import stable_fraction

if TYPE_CHECKING:
    from svc_reward.escalation_rule import EscalationRule


@dataclass(frozen=True)
class Outcome:
    final: bool        # this reward is the prompt's answer (goes to the rollout log and the learner)
    escalate: bool     # send the prompt to Level-2
    annotate: bool     # ask for human annotation
    reason: str
    awaits_annotation: bool = False  # the human's score, published by svc_annotation, is the final reward


def sampled_for_annotation(response_hash: str, share: float) -> bool:
    """Whether a Level-1 answer is in the share sent to the annotators as RM data (issue 37's loop).

    Drawn from the response hash, so a redelivered rollout draws the same and the share is the same
    on every replica.
    """
    if share <= 0:
        return False
    return stable_fraction(f"annotate:{response_hash}") < share


@dataclass(frozen=True)
class RuleVerdict:
    """The learned escalation rule's judgment of one Level-1 answer (``svc_reward.escalation_rule``)."""

    escalate: bool
    probability: float  # P(bad)
    threshold: float


# The brief's threshold (R3), served where neither the settings nor the light RM's calibration give one.
BRIEF_ESCALATION_THRESHOLD = 3.2


def escalation_threshold(setting: float | None, calibrated: float | None) -> float:
    """The threshold a Level-1 reward is compared with: the one set (``escalation_threshold``), else the
    one stored with the served light RM's calibration (``calibrated``: given only when its calibrated
    score is the one compared), else the brief's."""
    if setting is not None:
        return setting
    return BRIEF_ESCALATION_THRESHOLD if calibrated is None else calibrated


def describe_threshold(setting: float | None, calibrated_scale: bool, stored: float | None) -> str:
    """Which threshold is served and why, for the log at start and after a swap. ``calibrated_scale``: the
    light RM's calibrated score is the one compared; ``stored``: the threshold stored with that calibration."""
    scale = "calibrated" if calibrated_scale else "raw"
    threshold = escalation_threshold(setting, stored if calibrated_scale else None)
    if setting is not None:
        why = "set (escalation_threshold)"
    elif calibrated_scale and stored is not None:
        why = "the threshold stored with the light RM's calibration"
    else:
        why = ("the brief's: the light RM has no calibrated threshold (`strata calibrate escalation --write` "
               "stores one with it)")
    return f"escalating Level-1 answers whose {scale} light-RM reward is under {threshold:g}, {why}"


def describe_escalation(rule: EscalationRule | None, threshold_line: str) -> str:
    """How Level-1 answers escalate: by the learned rule where one is served (``threshold_line``, from
    ``describe_threshold``, for the answers it cannot judge), else by the threshold."""
    if rule is None:
        return threshold_line
    fitted = rule.fitted
    source = str(fitted.get("source") or f"strata calibrate rule on the {fitted.get('split', '?')} split")
    auc = fitted.get("combined_auc")
    how = f"fitted by {source} on {fitted.get('answers', '?')} answers" + (
        f", out-of-fold AUC {auc:.3f}" if isinstance(auc, int | float) else "")
    return (f"escalating Level-1 answers by the learned rule on {', '.join(rule.features)} at P(bad) >= "
            f"{rule.threshold:.3f} ({how}); an answer missing one of its signals: {threshold_line}")


def decide(tier: int, reward: float, caution: bool, threshold: float, escalate_on_caution: bool = True,
           annotate_level2: bool = True, unsafe: bool = False, await_annotation: bool = False,
           sampled: bool = False, raw: float | None = None, rule: RuleVerdict | None = None) -> Outcome:
    """``tier`` is 1 or 2 (the generator tier that produced the sample); ``unsafe``: the response gives
    unsafe advice (R12), so a Level-1 answer is never final and a Level-2 one goes to a human.
    ``await_annotation``: a Level-2 reward sent to a human is not final; svc_annotation publishes the
    final one (the human's score, or this reward past its deadline). ``sampled``: a Level-1 answer
    drawn for annotation (``sampled_for_annotation``): a human scores it for the reward models' data,
    and its routing is what it would have been, never waiting on that score. ``raw``: given when
    ``reward`` is the light RM's calibrated score, the raw one it came from (named in the reason only).
    ``rule``: the learned escalation rule's verdict, which replaces the threshold where it could judge."""
    if tier == 2:
        reason = "level-2 sample, unsafe advice" if unsafe else "level-2 sample"
        annotate = annotate_level2 or unsafe
        awaits = annotate and await_annotation
        if awaits:
            reason += ", awaiting annotation"
        return Outcome(final=not awaits, escalate=False, annotate=annotate, reason=reason, awaits_annotation=awaits)
    sample_note = ", sampled for annotation" if sampled else ""
    scored = (f"light RM reward {reward:.2f}" if raw is None
              else f"light RM calibrated reward {reward:.2f} (raw {raw:.2f})")
    if unsafe:
        return Outcome(False, True, sampled, "unsafe advice in the response" + sample_note)
    if rule is not None:
        verdict = f"escalation rule P(bad) {rule.probability:.3f} {'>=' if rule.escalate else '<'} {rule.threshold:.3f}"
        if rule.escalate:
            return Outcome(False, True, sampled, f"{verdict} ({scored})" + sample_note)
    elif reward < threshold:
        return Outcome(False, True, sampled, f"{scored} < {threshold}" + sample_note)
    if caution and escalate_on_caution:
        return Outcome(False, True, sampled, "probe flagged caution" + sample_note)
    if rule is not None:
        return Outcome(True, False, sampled, f"{verdict} ({scored})" + sample_note)
    return Outcome(True, False, sampled, f"{scored} >= {threshold}" + sample_note)
