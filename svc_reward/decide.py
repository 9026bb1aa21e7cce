"""What a reward means for its rollout (R2, R3): final, or escalate to Level-2. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Outcome:
    final: bool        # this reward is the prompt's answer (goes to the rollout log and the learner)
    escalate: bool     # send the prompt to Level-2
    annotate: bool     # ask for human annotation
    reason: str


def decide(tier: int, reward: float, caution: bool, threshold: float, escalate_on_caution: bool = True,
           annotate_level2: bool = True, unsafe: bool = False, await_annotation: bool = False) -> Outcome:
    """``tier`` is 1 or 2 (the generator tier that produced the sample); ``unsafe``: the response gives
    unsafe advice (R12), so a Level-1 answer is never final and a Level-2 one goes to a human.
    ``await_annotation``: a Level-2 reward sent to a human is not final; svc_annotation publishes the
    final one (the human's score, or this reward past its deadline)."""
    if tier == 2:
        reason = "level-2 sample, unsafe advice" if unsafe else "level-2 sample"
        annotate = annotate_level2 or unsafe
        if annotate and await_annotation:
            reason += ", awaiting annotation"
        return Outcome(final=not (annotate and await_annotation), escalate=False, annotate=annotate, reason=reason)
    if unsafe:
        return Outcome(False, True, False, "unsafe advice in the response")
    if reward < threshold:
        return Outcome(False, True, False, f"light RM reward {reward:.2f} < {threshold}")
    if caution and escalate_on_caution:
        return Outcome(False, True, False, "probe flagged caution")
    return Outcome(True, False, False, f"light RM reward {reward:.2f} >= {threshold}")
