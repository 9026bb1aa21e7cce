"""The loop's answer to hacking (issue 61): what the reward service does while the alarm fires. Pure.

While the live hacking alarm fires (``strata.audit``), PPO is climbing into the light RM's blind
spots: the light RM rates the policy's answers ever higher than a second judge does (the strong RM, or
people at the desk). The defence moves
the reward PPO climbs towards the strong RM's, on the policy's own answers:

- **a larger strong-RM share.** Each newer policy version the alarm still fires on adds
  ``defence_share_step`` to the share of Level-1 answers the strong RM also judges (on top of
  ``audit_level1_share``), up to ``defence_max_share``; while defending, an audited answer that is
  final is published with the strong RM's reward. PPO then climbs (1 - s) x light + s x strong, which
  at s = 1 is conventional RLHF's reward;
- **a re-distillation, once per alarm**: a request that ``strata rm refresh`` answers with a turn on
  the audited answers (the strong RM's labels of the current policy's answers; no humans needed),
  re-distilling the light RM where the policy now writes;
- **people's labels when people raise the alarm**: the re-distillation learns from their scores of the
  policy's answers (the desk's annotations), not from the strong RM's audit labels, which would teach the
  light RM that the answers people call gamed are good wherever the strong RM rates like its student. And
  when the strong RM's own audit of the same run sees the gap grow by less than half the bound (it rates
  the policy's answers as the light RM does: it is its teacher), its reward would not change what PPO
  climbs, so the share holds;
- **a KL brake** (``defence_kl_factor``): each newer version the alarm fires on multiplies the learner's
  KL coefficient by the factor, up to ``defence_max_kl_scale``. It is the one lever that needs no better
  judge: a larger penalty to the reference policy pulls PPO back from where the light RM is fooled
  (Coste et al., ICLR 2024: a small KL with a conservative reward stops over-optimisation). The
  learner reads the scale from this state before each update (``strata.audit.defence_kl_scale``);
- **relaxing with hysteresis**: once the gap's growth is back under half the bound, the share comes
  down one step and the brake one factor per newer policy version, so they do not flap at the edge.

Why not more escalations: an escalated Level-1 answer still trains the policy with its light-RM
reward (the learner's ``train_on_escalated``), and Level-2's answer is not the policy's, so escalating
more changes what a rollout costs, not the reward PPO climbs. Judging the policy's answers with the
better judge changes it. Every step is a decision with its figures, logged and kept.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from strata.audit import HUMAN_AUDIT, STRONG_AUDIT, AuditEstimates, AuditJudge, DefenceState, drift, hacking_alarm

# Shares are kept to this many decimals so that steps up and down return to exactly 0.
_DECIMALS = 6


@dataclass(frozen=True)
class DefenceStep:
    state: DefenceState
    decision: str | None  # what changed and why, with its figures; None when nothing changed
    redistil: bool  # ask for a re-distillation of the light RM now
    labels: str = "strong"  # whose labels it learns from: "strong" (the audited answers) or "people" (the desk's)


def respond(state: DefenceState, baseline: AuditEstimates | None, current: AuditEstimates, newest_version: int,
            bound: float, step: float, max_share: float, judge: AuditJudge = STRONG_AUDIT,
            strong_growth: float = math.nan, kl_factor: float = 1.0, max_kl_scale: float = 1.0) -> DefenceStep:
    """One look at the audit (``judge``'s, as ``strata.audit.deciding`` chose it): at most one step per newer
    audited policy version (``newest_version``). ``strong_growth``: when people decide, how far the strong RM's
    own gap grew over the run (nan: unknown, or the strong RM decides). ``kl_factor``: the KL brake's step
    (1: off), up to ``max_kl_scale``."""
    if newest_version <= state.acted_on:
        return DefenceStep(state, None, False)
    looked = replace(state, acted_on=newest_version)
    alarm = hacking_alarm(baseline, current, bound, judge.who)
    if alarm is not None:
        blind = strong_growth <= bound / 2  # False for nan
        share = state.share if blind else round(min(max_share, state.share + step), _DECIMALS)
        kl_scale = round(min(max(max_kl_scale, 1.0), state.kl_scale * kl_factor), _DECIMALS)
        redistil = not state.redistil_requested
        if share == state.share and kl_scale == state.kl_scale and not redistil:
            return DefenceStep(looked, None, False)
        parts = [f"policy v{newest_version}: {alarm}"]
        if blind and redistil:
            parts.append(f"the strong RM's own gap grew {strong_growth:+.3f}: it rates them as the light RM does, so "
                         f"its share holds at {share:.2f}")
        elif share != state.share:
            parts.append(f"strong-RM share of Level-1 answers {state.share:.2f} -> {share:.2f}, their reward the "
                         "strong RM's")
        if kl_scale != state.kl_scale:
            parts.append(f"the learner's KL coefficient x{state.kl_scale:g} -> x{kl_scale:g}")
        labels = "people" if judge is HUMAN_AUDIT else "strong"
        if redistil:
            taught_by = "people's scores of the policy's answers" if labels == "people" else "the audited answers"
            parts.append(f"re-distillation of the light RM on {taught_by} requested")
        return DefenceStep(replace(looked, share=share, kl_scale=kl_scale, redistil_requested=True),
                           "; ".join(parts), redistil, labels)
    if state.at_rest and not state.redistil_requested:
        return DefenceStep(looked, None, False)
    growth = math.nan if baseline is None else drift(baseline, current).change
    if math.isnan(growth) or growth > bound / 2:
        return DefenceStep(looked, None, False)  # nothing to compare, or quiet but not well under the bound: hold
    share = round(max(0.0, state.share - step), _DECIMALS)
    kl_scale = round(max(1.0, state.kl_scale / kl_factor), _DECIMALS) if kl_factor > 1 else 1.0
    parts = [f"policy v{newest_version}: the gap grew {growth:+.3f} (now {current.gap:+.3f}), under half the "
             f"bound {bound:g}"]
    if share != state.share:
        parts.append(f"strong-RM share of Level-1 answers {state.share:.2f} -> {share:.2f}")
    if kl_scale != state.kl_scale:
        parts.append(f"the learner's KL coefficient x{state.kl_scale:g} -> x{kl_scale:g}")
    relaxed = replace(looked, share=share, kl_scale=kl_scale)
    if relaxed.at_rest:  # cleared once every lever is back, so that a later alarm asks again
        relaxed = replace(relaxed, redistil_requested=False)
        if len(parts) == 1:
            parts.append("the defence stands down")
    return DefenceStep(relaxed, "; ".join(parts), False)


def describe(state: DefenceState, decisions: Sequence[Mapping[str, Any]], enabled: bool,
             redistil_pending: bool) -> list[str]:
    """The defence in a few lines (``decisions``: newest first, as kept in Redis), for ``strata status``,
    ``strata diagnose`` and the demo's report."""
    if not enabled:
        return ["  hacking defence: off (hacking_defence): the alarm only reports"]
    if state.at_rest and not decisions:
        return ["  hacking defence: standing by (no alarm has fired)"]
    lines = [f"  hacking defence: strong-RM share of Level-1 answers +{state.share:.2f} (their reward the strong RM's)"
             + (f"; the learner's KL coefficient x{state.kl_scale:g}" if state.kl_scale > 1 else "")
             + ("; a re-distillation of the light RM awaits `strata rm refresh --every`" if redistil_pending else "")]
    for made in decisions[:3]:
        when = time.strftime("%H:%M:%S", time.localtime(float(made.get("at", 0.0))))
        lines.append(f"    {when} {made.get('decision', '')}")
    return lines
