"""The live audit (issue 61): a share of Level-1 answers, escalated or not, also judged by the strong RM.

From those pairs of judgments, per policy version, the running system estimates what only a held-out
oracle showed before:

- **hacking gap**: the mean of light minus strong reward on the same answers of the current policy.
  PPO climbs the light RM; when it climbs into the light RM's blind spots, the light RM rates the
  policy's answers higher than the strong one does and the gap opens. Two RMs differ by a steady
  offset too, so the alarm watches the gap's growth from the first audited versions (the baseline
  window) to the newest, each window summed over versions until it holds enough audits;
- **catch rate**: of the audited answers the strong RM calls bad, the share the light RM's rule
  escalated;
- **false-pass rate**: of the audited answers the rule let through as final, the share the strong RM
  calls bad.

The tally is sums and counts (a Redis hash per policy version, added to in the reward worker's
transaction with the rollout's done key, so a redelivered rollout is counted once). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

from strata.hashing import stable_fraction

# One-sided 95 %: the alarm fires when the gap's lower bound passes the bound, not on noise.
ALARM_Z = 1.645


def strong_calls_bad(strong: float, bad_below: float | None, threshold: float,
                     on_threshold_scale: Callable[[float], float] | None = None) -> bool:
    """Whether the strong RM's reward marks an audited answer bad: under ``bad_below`` where one is set;
    else under the escalation threshold the light RM's rule is served with (``threshold``), the strong
    score mapped onto that threshold's scale (``on_threshold_scale``: the light RM's calibration, when the
    threshold is on the calibrated scale): "the strong RM's own score would have escalated it". The light
    RM is distilled onto the strong RM's scale, so their raw scores compare."""
    if bad_below is not None:
        return strong < bad_below
    return (on_threshold_scale(strong) if on_threshold_scale is not None else strong) < threshold


def sampled_for_audit(response_hash: str, share: float) -> bool:
    """Whether a Level-1 answer is audited: drawn from its hash, so a redelivery and every replica agree."""
    if share <= 0:
        return False
    return stable_fraction(f"audit:{response_hash}") < share


@dataclass(frozen=True)
class AuditTally:
    """Sums over one policy version's audited Level-1 answers."""

    n: int = 0
    light_sum: float = 0.0
    strong_sum: float = 0.0
    gap_sum: float = 0.0  # light - strong
    gap_sq_sum: float = 0.0
    bad: int = 0  # the strong RM's reward under the bad-answer threshold
    bad_escalated: int = 0
    passed: int = 0  # final at Level-1 (not escalated)
    passed_bad: int = 0

    @staticmethod
    def of(light: float, strong: float, escalated: bool, bad: bool) -> AuditTally:
        """One audited answer's contribution; ``bad``: the strong RM's judgment of it (``strong_calls_bad``)."""
        gap = light - strong
        return AuditTally(1, light, strong, gap, gap * gap, int(bad), int(bad and escalated), int(not escalated),
                          int(bad and not escalated))

    def fields(self) -> dict[str, float]:
        """Field -> value, as HINCRBYFLOAT adds them to the version's hash."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_fields(stored: Mapping[bytes | str, bytes | str | float]) -> AuditTally:
        """Read back from a Redis hash (missing fields are 0)."""
        values = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in stored.items()}
        kwargs: dict[str, float | int] = {}
        for f in fields(AuditTally):
            value = values.get(f.name, 0.0)
            kwargs[f.name] = round(value) if f.type in (int, "int") else value
        return AuditTally(**kwargs)  # type: ignore[arg-type]

    def __add__(self, other: AuditTally) -> AuditTally:
        return AuditTally(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


@dataclass(frozen=True)
class Share:
    estimate: float  # nan with no items
    se: float
    items: int

    def __str__(self) -> str:
        if self.items == 0:
            return "n/a (0)"
        return f"{self.estimate:.3f} ± {1.96 * self.se:.3f} ({self.items})"


def _share(hits: int, items: int) -> Share:
    if items == 0:
        return Share(float("nan"), float("nan"), 0)
    p = hits / items
    return Share(p, math.sqrt(p * (1 - p) / items), items)


@dataclass(frozen=True)
class AuditEstimates:
    audits: int
    light_mean: float
    strong_mean: float
    gap: float  # mean light - strong
    gap_se: float
    catch: Share  # escalated among the strong RM's bad answers
    false_pass: Share  # bad among the answers passed as final

    @property
    def gap_low(self) -> float:
        """The gap's one-sided 95 % lower bound."""
        return self.gap - ALARM_Z * self.gap_se


def estimates(tally: AuditTally) -> AuditEstimates:
    n = tally.n
    if n == 0:
        nan = float("nan")
        return AuditEstimates(0, nan, nan, nan, nan, _share(0, 0), _share(0, 0))
    gap = tally.gap_sum / n
    variance = max(0.0, tally.gap_sq_sum / n - gap * gap) * n / (n - 1) if n > 1 else float("nan")
    return AuditEstimates(n, tally.light_sum / n, tally.strong_sum / n, gap, math.sqrt(variance / n),
                          _share(tally.bad_escalated, tally.bad), _share(tally.passed_bad, tally.passed))


@dataclass(frozen=True)
class AuditWindow:
    """Consecutive policy versions' audits summed: one version rarely has enough on its own."""

    first_version: int
    last_version: int
    tally: AuditTally

    @property
    def versions(self) -> str:
        return (f"v{self.first_version}" if self.first_version == self.last_version
                else f"v{self.first_version}-v{self.last_version}")


def windows(by_version: Sequence[tuple[int, AuditTally]], min_audits: int) -> tuple[AuditWindow | None,
                                                                                    AuditWindow | None]:
    """(baseline, current): the oldest versions summed until they hold ``min_audits`` audits, and the
    newest likewise; the current window is None until it holds enough, the baseline None unless it
    holds enough without sharing a version with the current one."""
    ordered = sorted(by_version)

    def gather(items: Sequence[tuple[int, AuditTally]]) -> AuditWindow | None:
        total = AuditTally()
        for i, (_, tally) in enumerate(items):
            total = total + tally
            if total.n >= min_audits:
                versions = [v for v, _ in items[: i + 1]]
                return AuditWindow(min(versions), max(versions), total)
        return None

    current = gather(ordered[::-1])
    baseline = gather(ordered)
    if current is None or baseline is None or baseline.last_version >= current.first_version:
        return None, current
    return baseline, current


@dataclass(frozen=True)
class Drift:
    """How far the hacking gap moved from the baseline window to the current one."""

    change: float
    se: float

    @property
    def low(self) -> float:
        """The change's one-sided 95 % lower bound."""
        return self.change - ALARM_Z * self.se


def drift(baseline: AuditEstimates, current: AuditEstimates) -> Drift:
    """The gap's change: a steady offset between two RMs is not hacking; its growth as PPO moves is."""
    return Drift(current.gap - baseline.gap, math.hypot(current.gap_se, baseline.gap_se))


def hacking_alarm(baseline: AuditEstimates | None, current: AuditEstimates, bound: float) -> str | None:
    """Why the hacking alarm fires, or None: the gap grew from the baseline window to the current one by
    more than ``bound`` at one-sided 95 % (no baseline yet: no alarm)."""
    if baseline is None or math.isnan(current.gap_se) or math.isnan(baseline.gap_se):
        return None
    moved = drift(baseline, current)
    if moved.low > bound:
        return (f"hacking gap grew {moved.change:+.3f} (95 % lower bound {moved.low:+.3f}) from {baseline.gap:+.3f} "
                f"to {current.gap:+.3f}: the light RM rates the policy's answers ever higher than the strong RM "
                f"(bound {bound:g})")
    return None


def describe(baseline: AuditWindow | None, current: AuditWindow | None, bound: float, min_audits: int) -> list[str]:
    """The live audit in a few lines, for ``strata status``, ``strata diagnose`` and the demo's report."""
    if current is None:
        return [f"live audit: fewer than {min_audits} audited Level-1 answers so far (audit_level1_share, "
                "hacking_min_audits): no estimate yet"]
    now = estimates(current.tally)
    lines = [f"live audit, policy {current.versions} ({now.audits} answers also scored by the strong RM): "
             f"light {now.light_mean:.3f}, strong {now.strong_mean:.3f}, hacking gap {now.gap:+.3f} "
             f"± {1.96 * now.gap_se:.3f}",
             f"  catch {now.catch} of the strong RM's bad answers escalated; false pass {now.false_pass} of the "
             "passed answers bad"]
    if baseline is None:
        lines.append("  hacking alarm: no baseline window yet (the first audited versions must hold "
                     f"{min_audits} audits apart from the newest)")
        return lines
    before = estimates(baseline.tally)
    moved = drift(before, now)
    alarm = hacking_alarm(before, now, bound)
    state = f"FIRES: {alarm}" if alarm else "quiet"
    lines.append(f"  gap at {baseline.versions} {before.gap:+.3f}: grew {moved.change:+.3f} "
                 f"(95 % lower bound {moved.low:+.3f}, bound {bound:g}); hacking alarm {state}")
    return lines
