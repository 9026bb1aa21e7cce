"""The live audit (issue 61): a share of the policy's Level-1 answers judged again by a second judge, the
strong RM (the reward service's audit) or people (the annotation desk's Level-1 share).

From those pairs of judgments, per policy version, the running system estimates what only a held-out
oracle showed before:

- **hacking gap**: the mean of light RM minus judge on the same answers of the current policy. PPO
  climbs the light RM; when it climbs into the light RM's blind spots, the light RM rates the policy's
  answers higher than the judge does and the gap opens. Two judges differ by a steady offset too, so
  the alarm watches the gap's growth from the first audited versions (the baseline window) to the
  newest, each window summed over versions until it holds enough audits. Both windows come from the
  versions audited under the RMs scoring now: a light RM swapped in (or a strong RM retrained) moves the
  gap by its own difference, which is no drift of the policy, so the baseline starts again after a swap;
- **catch rate**: of the audited answers the judge calls bad, the share the light RM's rule escalated;
- **false-pass rate**: of the audited answers the rule let through as final, the share the judge calls bad.

A strong RM that is the light RM's teacher and scores alike is a weak second opinion (the gap stays near
zero whatever the policy does); people are not its copy. The tally is sums and counts: a Redis hash per
policy version and judge (``AuditJudge``), added to in the writer's transaction (the reward worker's, with
the rollout's done key) or once per closed desk item, so a redelivery counts once. The estimates are pure;
``add_to`` and ``read_versions`` are the tallies' Redis I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import cast

import redis

# One-sided 95 %: the alarm fires when the gap's lower bound passes the bound, not on noise.
ALARM_Z = 1.645

# The hacking defence's state (svc_reward/defence.py, as JSON), shared by the reward service's replicas; the
# learner reads its KL brake from it.
DEFENCE_KEY = "strata:reward:defence"


@dataclass(frozen=True)
class AuditJudge:
    """Who audits, and where their tallies live in Redis."""

    name: str  # "strong" or "human"
    prefix: str  # Redis keys: <prefix>:versions (sorted set), <prefix>:v<policy version> (hash)
    title: str  # how a report line opens
    who: str  # "the strong RM", "people"
    short: str  # the judge's column in a report line
    share_setting: str  # the setting that sets how many answers it audits

    @property
    def versions_key(self) -> str:
        return f"{self.prefix}:versions"

    def tally_key(self, policy_version: int) -> str:
        return f"{self.prefix}:v{policy_version}"

    @property
    def labels_key(self) -> str:
        """A stream: one entry per audited answer (``AuditLabel``)."""
        return f"{self.prefix}:labels"


STRONG_AUDIT = AuditJudge("strong", "strata:reward:audit", "live audit", "the strong RM", "strong",
                          "audit_level1_share")
HUMAN_AUDIT = AuditJudge("human", "strata:annotation:audit", "human audit", "people", "human",
                         "annotate_level1_share")


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
    # The RM versions whose scores the gap compares (the light RM's, and the strong RM's where it judges): ""
    # unknown (tallies written before it was kept), MIXED_RMS where the answers span a swap.
    rms: str = ""

    @staticmethod
    def of(light: float, strong: float, escalated: bool, bad: bool, rms: str = "") -> AuditTally:
        """One audited answer's contribution; ``bad``: the strong RM's judgment of it (``strong_calls_bad``);
        ``rms``: who scored it (:func:`rms_of`)."""
        gap = light - strong
        return AuditTally(1, light, strong, gap, gap * gap, int(bad), int(bad and escalated), int(not escalated),
                          int(bad and not escalated), rms)

    def fields(self) -> dict[str, float]:
        """Field -> value of the sums, as HINCRBYFLOAT adds them to the version's hash."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in _SUMS}

    @staticmethod
    def from_fields(stored: Mapping[bytes | str, bytes | str | float]) -> AuditTally:
        """Read back from a Redis hash (missing sums are 0; the RMs from :func:`add_to`'s per-RM counts: one RM
        tag, or mixed where answers of the version were scored under two)."""
        values = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                  for k, v in stored.items()}
        kwargs: dict[str, float | int | str] = {}
        for f in fields(AuditTally):
            if f.name in _SUMS:
                value = float(values.get(f.name, 0.0))
                kwargs[f.name] = round(value) if f.type in (int, "int") else value
        tags = [k.removeprefix(_RMS_COUNT) for k in values if k.startswith(_RMS_COUNT)]
        kwargs["rms"] = MIXED_RMS if len(tags) > 1 else (tags[0] if tags else "")
        return AuditTally(**kwargs)  # type: ignore[arg-type]

    def __add__(self, other: AuditTally) -> AuditTally:
        summed = {name: getattr(self, name) + getattr(other, name) for name in _SUMS}
        return AuditTally(**summed, rms=_joined(self.rms, other.rms))


# An audit tally's sums (what HINCRBYFLOAT adds); the answers each RM tag scored are counted in fields named
# <_RMS_COUNT><tag> beside them (numbers, so a reader that predates the tags reads the hash as before).
_SUMS = frozenset(f.name for f in fields(AuditTally)) - {"rms"}
_RMS_COUNT = "n@"
MIXED_RMS = "*"


def rms_of(light: str, judge: str = "") -> str:
    """The tag of the RMs behind an audited answer's gap: the light RM's version (an ensemble's members joined by
    "+"), and the judging strong RM's after a "|"."""
    return f"{light}|{judge}" if judge else light


def _joined(a: str, b: str) -> str:
    """Two tallies' RMs summed: one where they agree (an unknown one agrees with any), else mixed."""
    if a == b or not b:
        return a
    return b if not a else MIXED_RMS


def since_rm_swap(by_version: Sequence[tuple[int, AuditTally]]) -> list[tuple[int, AuditTally]]:
    """The policy versions audited under the RMs that scored the newest ones, oldest first: the run back from
    the newest version whose RMs are known until another RM appears. A version whose answers span a swap
    belongs to neither side; versions of unknown RMs (kept before the RMs were) go with any."""
    ordered = sorted(by_version)
    newest = next((t.rms for _, t in reversed(ordered) if t.rms not in ("", MIXED_RMS)), "")
    kept = []
    for version, tally in reversed(ordered):
        if tally.rms == MIXED_RMS:
            continue
        if tally.rms not in ("", newest):
            break
        kept.append((version, tally))
    return kept[::-1]


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
    newest likewise, both among the versions audited since the RMs last changed (:func:`since_rm_swap`);
    the current window is None until it holds enough, the baseline None unless it holds enough without
    sharing a version with the current one."""
    ordered = since_rm_swap(by_version)

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


def hacking_alarm(baseline: AuditEstimates | None, current: AuditEstimates, bound: float,
                  judge: str = "the strong RM") -> str | None:
    """Why the hacking alarm fires, or None: the gap grew from the baseline window to the current one by
    more than ``bound`` at one-sided 95 % (no baseline yet: no alarm). ``judge`` names who audited."""
    if baseline is None or math.isnan(current.gap_se) or math.isnan(baseline.gap_se):
        return None
    moved = drift(baseline, current)
    if moved.low > bound:
        return (f"hacking gap grew {moved.change:+.3f} (95 % lower bound {moved.low:+.3f}) from {baseline.gap:+.3f} "
                f"to {current.gap:+.3f}: the light RM rates the policy's answers ever higher than {judge} "
                f"(bound {bound:g})")
    return None


def describe(baseline: AuditWindow | None, current: AuditWindow | None, bound: float, min_audits: int,
             judge: AuditJudge | None = None) -> list[str]:
    """The live audit in a few lines, for ``strata status``, ``strata diagnose`` and the demo's report."""
    judge = judge or STRONG_AUDIT
    if current is None:
        return [f"{judge.title}: fewer than {min_audits} audited Level-1 answers under the RMs scoring now "
                f"({judge.share_setting}, hacking_min_audits): no estimate yet"]
    now = estimates(current.tally)
    scored_by = f"; RMs {current.tally.rms}" if current.tally.rms not in ("", MIXED_RMS) else ""
    lines = [f"{judge.title}, policy {current.versions} ({now.audits} answers also scored by {judge.who}{scored_by}): "
             f"light {now.light_mean:.3f}, {judge.short} {now.strong_mean:.3f}, hacking gap {now.gap:+.3f} "
             f"± {1.96 * now.gap_se:.3f}",
             f"  catch {now.catch} of the answers judged bad by {judge.who} escalated; false pass {now.false_pass} of "
             "the passed answers bad"]
    if baseline is None:
        lines.append("  hacking alarm: no baseline window yet (the first versions audited under these RMs must "
                     f"hold {min_audits} audits apart from the newest)")
        return lines
    before = estimates(baseline.tally)
    moved = drift(before, now)
    alarm = hacking_alarm(before, now, bound, judge.who)
    state = f"FIRES: {alarm}" if alarm else "quiet"
    lines.append(f"  gap at {baseline.versions} {before.gap:+.3f}: grew {moved.change:+.3f} "
                 f"(95 % lower bound {moved.low:+.3f}, bound {bound:g}); hacking alarm ({judge.name}) {state}")
    return lines


def describe_judges(by_judge: Mapping[AuditJudge, Sequence[tuple[int, AuditTally]]], bound: float,
                    min_audits: int) -> list[str]:
    """:func:`describe` for each judge in turn; people only once they have scored a Level-1 answer (no annotators,
    or none of their scores yet: nothing to say)."""
    lines: list[str] = []
    for judge, by_version in by_judge.items():
        if judge is HUMAN_AUDIT and not by_version:
            continue
        lines += describe(*windows(by_version, min_audits), bound, min_audits, judge)
    return lines


def add_to(pipe: redis.client.Pipeline, judge: AuditJudge, tallies: Mapping[int, AuditTally], ttl_s: int) -> None:
    """Queue the tallies' increments on ``pipe`` (the caller's transaction), and count the answers by the RMs
    that scored them, so that a version whose answers span a swap reads as mixed whatever order they came in."""
    for version, tally in tallies.items():
        key = judge.tally_key(version)
        for name, value in tally.fields().items():
            if value:
                pipe.hincrbyfloat(key, name, value)
        if tally.rms:
            pipe.hincrby(key, _RMS_COUNT + tally.rms, tally.n)
        pipe.expire(key, ttl_s)
        pipe.zadd(judge.versions_key, {str(version): version})


def read_versions(client: redis.Redis, judge: AuditJudge, limit: int = 1000) -> list[tuple[int, AuditTally]]:
    """The newest ``limit`` policy versions ``judge`` audited, oldest first, each with its tally (tallies whose
    hash expired are left out)."""
    members = cast("list[bytes | str]", client.zrevrange(judge.versions_key, 0, limit - 1))
    newest = [int(v) for v in members][::-1]
    with client.pipeline(transaction=False) as pipe:
        for version in newest:
            pipe.hgetall(judge.tally_key(version))
        stored = pipe.execute()
    return [(version, AuditTally.from_fields(hash_fields)) for version, hash_fields in zip(newest, stored, strict=True)
            if hash_fields]


@dataclass(frozen=True)
class AuditLabel:
    """One audited answer: the judge's score (``judge``), the light RM's, and, for a tool that checks the audit's
    catch against another judge on the same answers, whether the rule escalated it and whether the judge called
    it bad (None in entries written before they were kept). The strong RM's are the RM loop's audit labels."""

    prompt_hash: str
    response_hash: str
    judge: float
    light: float
    policy_version: int
    escalated: bool | None = None
    bad: bool | None = None


def add_labels(pipe: redis.client.Pipeline, judge: AuditJudge, labels: Sequence[AuditLabel], max_kept: int) -> None:
    """Queue ``judge``'s labels on ``pipe`` (the caller's transaction); its stream keeps about the newest
    ``max_kept``."""
    for label in labels:
        fields = {k: str(int(v) if isinstance(v, bool) else v) for k, v in asdict(label).items() if v is not None}
        fields["strong"] = fields.pop("judge")  # the stream's field name from when the strong RM was the only judge
        pipe.xadd(judge.labels_key, fields, maxlen=max_kept, approximate=True)  # type: ignore[arg-type]


def read_labels(client: redis.Redis, judge: AuditJudge, limit: int = 100_000) -> list[AuditLabel]:
    """The newest ``limit`` of ``judge``'s audited answers' labels, oldest first."""
    entries = cast("list[tuple[bytes, dict[bytes, bytes]]]", client.xrevrange(judge.labels_key, count=limit))
    labels = []
    for _, stored in reversed(entries):
        values = {k.decode(): v.decode() for k, v in stored.items()}
        flags = {name: values[name] == "1" if name in values else None for name in ("escalated", "bad")}
        labels.append(AuditLabel(values["prompt_hash"], values["response_hash"], float(values["strong"]),
                                 float(values["light"]), int(values["policy_version"]), **flags))
    return labels


@dataclass(frozen=True)
class JudgeReading:
    """One judge's audit now: its windows, their estimates and whether its alarm fires."""

    judge: AuditJudge
    baseline_window: AuditWindow | None
    current_window: AuditWindow
    baseline: AuditEstimates | None
    current: AuditEstimates
    alarm: str | None

    @property
    def last_version(self) -> int:
        """The newest policy version in its current window."""
        return self.current_window.last_version

    @property
    def growth(self) -> float:
        """The gap's growth from the baseline window (nan without one)."""
        return math.nan if self.baseline is None else drift(self.baseline, self.current).change


def read_judges(by_judge: Mapping[AuditJudge, Sequence[tuple[int, AuditTally]]], min_audits: int,
                bound: float) -> list[JudgeReading]:
    """Each judge with a current window (``min_audits`` audits), in the order given."""
    readings = []
    for judge, by_version in by_judge.items():
        baseline, current = windows(by_version, min_audits)
        if current is None:
            continue
        before = estimates(baseline.tally) if baseline is not None else None
        now = estimates(current.tally)
        readings.append(JudgeReading(judge, baseline, current, before, now,
                                     hacking_alarm(before, now, bound, judge.who)))
    return readings


def deciding(readings: Sequence[JudgeReading]) -> JudgeReading | None:
    """The reading the alarm and the defence act on: a judge whose alarm fires, people before the strong RM
    (they are no copy of the light RM's teacher); else the one whose gap grew most, so that the defence stands
    down only when every judge with a baseline is well under the bound."""
    firing = sorted((r for r in readings if r.alarm is not None), key=lambda r: r.judge is not HUMAN_AUDIT)
    if firing:
        return firing[0]
    grown = [r for r in readings if not math.isnan(r.growth)]
    if grown:
        return max(grown, key=lambda r: r.growth)
    return readings[0] if readings else None


@dataclass(frozen=True)
class DefenceState:
    """The hacking defence's levers (svc_reward/defence.py steps them), as JSON under ``DEFENCE_KEY``."""

    share: float = 0.0  # strong-RM share of Level-1 answers added while defending
    acted_on: int = -1  # the newest audited policy version the last step looked at
    redistil_requested: bool = False  # asked once per alarm; cleared when every lever is back at rest
    kl_scale: float = 1.0  # the learner's KL coefficient is multiplied by this while defending

    @property
    def at_rest(self) -> bool:
        return self.share <= 0 and self.kl_scale <= 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @staticmethod
    def from_json(raw: bytes | str | None) -> DefenceState:
        if not raw:
            return DefenceState()
        data = json.loads(raw)
        return DefenceState(float(data.get("share", 0.0)), int(data.get("acted_on", -1)),
                            bool(data.get("redistil_requested", False)), float(data.get("kl_scale", 1.0)))


def defence_kl_scale(client: redis.Redis) -> float:
    """What the hacking defence multiplies the learner's KL coefficient by now (1 when it does not, or when the
    value stored is not ours)."""
    try:
        scale = DefenceState.from_json(client.get(DEFENCE_KEY)).kl_scale
    except (ValueError, TypeError, AttributeError):
        return 1.0
    return scale if math.isfinite(scale) and scale >= 1 else 1.0
