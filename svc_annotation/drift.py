"""Annotator drift (R18): per-annotator bias and agreement over a sliding window, and an alarm when an
annotator's scores move away from the truth. Pure: no Redis, Kafka or gRPC; the annotation service
feeds it one :class:`Observation` per score and reads :class:`AnnotatorSnapshot`s back (Prometheus
gauges, the lead's page, ``strata diagnose annotators``).

Three references, unequal in authority:

- **gold** items have a known score: the residual ``score - gold`` is the annotator's error, so its
  mean is the annotator's bias. This is the only signal the alarm reads.
- the **strong RM**'s reward (``model_reward``) is there for every Level-2 item, but it is a model
  with errors of its own, and the policy's tics fool it as they fool people;
- **peers** (other annotators on a double-annotated item) are people too: when the whole pool drifts
  together (everyone gets used to the model's tics), peers agree with each other and say nothing.

The strong RM and peers are therefore reported (bias, mean absolute difference, share within
``agreement_tolerance``) beside gold, to corroborate or explain an alarm, but never raise one.

The alarm: a two-sided CUSUM on gold residuals (Page 1954, "Continuous inspection schemes",
Biometrika 41). For each gold residual ``e`` (winsorized to ``±residual_clip``)::

    cusum_up   = max(0, cusum_up   + e - cusum_slack)      # evidence the annotator scores too high
    cusum_down = max(0, cusum_down - e - cusum_slack)      # ... too low
    alarm when either exceeds cusum_threshold

Why CUSUM and not a windowed mean with a threshold: a drift is a persistent shift of the mean, and
CUSUM is the optimal detector of such a shift for a given false-alarm rate (Lorden 1971, Moustakides
1986). Each residual moves the sum by its excess over the slack, so scores within noise of the truth
cost nothing and a small shift that persists adds up; a windowed mean must pick one window length
and then either alarms on the noise of few gold items or waits for its window to fill with drifted
ones. The residuals are winsorized (Hawkins 1993, "Robustification of cumulative sum charts by
winsorization", J. Quality Technology 25) so that one misclick (a 0 for a gold 5) moves the sum by
at most ``residual_clip - cusum_slack`` instead of raising the alarm at once.

The thresholds are in score points, sized from the annotator noise we expect (the zoo's
``SimulatedAnnotator``: Gaussian noise sd 0.3, rounded to 0.5, clipped to 0-5, i.e. gold residuals
of sd ~0.33): ``cusum_slack`` 0.15 is half the smallest bias worth an alarm (0.3), and
``cusum_threshold`` 3.5 (~10 sd) buys a low false-alarm rate for a few gold items of delay.
Measured on simulated gold residuals of that noise (60 runs of 5,000 gold items each; the window
rules on 200-item windows at a 10% gold share):

    detector                                 false alarms per gold item   +0.4 step flagged after
    CUSUM k=0.15 h=3.5 (these defaults)      1-2 in 300,000               13-14 gold items (p95 27)
    CUSUM k=0.15 h=3.0                       1 in ~17,000-19,000          11 gold items (p95 22-26)
    200-item window mean, |bias| > 0.35      0 in 100,000                 ~19 gold items (187 items)
    200-item window mean, |bias| > 0.3       1 in ~10,000                 ~15 gold items (155 items)
    200-item window mean, |bias| > 0.2       1 in ~350                    ~11 gold items

On the seed's gradual drift (+0.4 ramped over 300 items, 10% gold) the alarm comes about when the
ramp is complete: ``strata bench annotators`` measures it beside the window rule, in one run. Gold
items whose known score sits at an end of the scale hide a drift towards that end (an annotator
cannot score a gold 5 higher), so a gold set away from the ends is flagged sooner.

A second, plain rule catches an annotator who is unbiased but careless: a mean absolute gold error
over the window above ``max_gold_mae`` (noise sd 0.3 gives ~0.26).

An annotator is *not judged* until ``min_gold_items`` gold items are in the window (and the CUSUM
does not alarm before as many gold items since its last restart): few gold items say nothing, and
"not judged" must not read as "fine". An alarm latches (with the item number it fired at) until the
lead acknowledges it (:func:`acknowledge`), which restarts the CUSUM and the window.

Items are numbered per annotator from 0, in the order the annotator scored them. A double-annotated
item is best fed once all its scores are in (:func:`item_observations`); fed as each score arrives,
the later annotator sees the earlier one as its peer and each pair still counts once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

MAX_SCORE = 5.0  # the 0-5 scale of scores, gold scores and rewards

AlarmKind = Literal["drift_up", "drift_down", "disagreement"]
Status = Literal["not_judged", "ok", "drift_up", "drift_down", "disagreement"]


@dataclass(frozen=True)
class DriftSettings:
    """Every threshold of the drift tracker, in items or score points (0-5)."""

    window_items: int = 200  # the sliding window of figures: this many of the annotator's latest items
    min_gold_items: int = 10  # gold items needed (in the window; since the last restart for the CUSUM) to judge
    cusum_slack: float = 0.15  # k: half the smallest bias worth an alarm; residuals within it add nothing
    cusum_threshold: float = 3.5  # h: an arm of the CUSUM above this is an alarm (~10 sd of gold residuals)
    residual_clip: float = 1.0  # gold residuals are winsorized to +-this before the CUSUM (one misclick)
    max_gold_mae: float = 0.6  # disagreement alarm: window mean |score - gold| above this
    agreement_tolerance: float = 0.5  # "agrees": |score - reference| <= this (one step of a 0.5 grid)

    def __post_init__(self) -> None:
        if self.window_items < 1 or self.min_gold_items < 1:
            raise ValueError("window_items and min_gold_items must be >= 1")
        if self.cusum_slack < 0 or self.cusum_threshold <= 0 or self.residual_clip <= self.cusum_slack:
            raise ValueError("need cusum_slack >= 0, cusum_threshold > 0 and residual_clip > cusum_slack")
        if self.max_gold_mae <= 0 or self.agreement_tolerance < 0:
            raise ValueError("need max_gold_mae > 0 and agreement_tolerance >= 0")


def _check_score(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= MAX_SCORE):
        raise ValueError(f"{name} must be a finite score in [0, {MAX_SCORE:g}], got {value!r}")


@dataclass(frozen=True)
class Observation:
    """One score an annotator gave, with the references known for its item."""

    annotator: str
    item_id: str
    score: float  # the annotator's score, 0-5
    gold: float | None = None  # the known score of a gold item; None: not a gold item
    model_reward: float | None = None  # the strong RM's reward for the item; None: none
    peer_scores: tuple[float, ...] = ()  # other annotators' scores on the same item (double annotation)

    def __post_init__(self) -> None:
        _check_score("score", self.score)
        for name, value in (("gold", self.gold), ("model_reward", self.model_reward)):
            if value is not None:
                _check_score(name, value)
        for value in self.peer_scores:
            _check_score("peer score", value)


def item_observations(
    item_id: str, scores: Mapping[str, float], gold: float | None = None, model_reward: float | None = None
) -> list[Observation]:
    """One observation per annotator of an item, each with the others' scores as its peers."""
    return [
        Observation(annotator, item_id, score, gold, model_reward,
                    tuple(s for other, s in scores.items() if other != annotator))
        for annotator, score in scores.items()
    ]


@dataclass(frozen=True)
class Residuals:
    """One item in an annotator's window: the annotator's score minus each reference."""

    item: int  # the annotator's item number
    gold: float | None  # score - gold (gold items only)
    model: float | None  # score - strong RM reward
    peers: tuple[float, ...] = ()  # score - each peer's score


@dataclass(frozen=True)
class Alarm:
    kind: AlarmKind  # drift_up / drift_down: a CUSUM arm; disagreement: the window's gold MAE
    since_item: int  # the annotator's item number at which it fired
    statistic: float  # the value that crossed its threshold


@dataclass(frozen=True)
class AnnotatorState:
    """What the tracker keeps per annotator (immutable: :func:`observe` returns a new one)."""

    annotator: str
    items: int = 0  # items scored in all (the next item's number)
    gold_seen: int = 0  # gold items in all
    gold_since_restart: int = 0  # gold items since the start or the last acknowledge
    cusum_up: float = 0.0
    cusum_down: float = 0.0
    window: tuple[Residuals, ...] = ()  # the latest window_items items, oldest first
    alarm: Alarm | None = None


@dataclass(frozen=True)
class Agreement:
    """An annotator against one reference over the window (``None`` where no item had it)."""

    n: int  # comparisons (items with a gold score / a model reward; peer scores)
    bias: float | None  # mean of (score - reference)
    mae: float | None  # mean of |score - reference|
    within: float | None  # share with |score - reference| <= agreement_tolerance


@dataclass(frozen=True)
class AnnotatorSnapshot:
    """One annotator's figures for a gauge or a page."""

    annotator: str
    status: Status  # an alarm's kind, else "not_judged" (too few gold items in the window) or "ok"
    items: int  # items scored in all
    gold_items: int  # gold items in all
    window_items: int  # items in the window
    gold: Agreement  # against gold: bias is the annotator's bias
    model: Agreement  # against the strong RM (secondary: the RM has errors of its own)
    peers: Agreement  # against other annotators on the same items (secondary)
    cusum_up: float
    cusum_down: float
    alarm_since: int | None = None  # the item number the alarm fired at; None: no alarm

    @property
    def alarm(self) -> bool:
        return self.alarm_since is not None

    @property
    def judged(self) -> bool:
        return self.status != "not_judged"

    def gauges(self) -> dict[str, float]:
        """Flat figures for Prometheus gauges (labelled by annotator); NaN where there is no value."""
        out = {"items": float(self.items), "gold_items": float(self.gold_items),
               "judged": float(self.judged), "alarm": float(self.alarm),
               "cusum_up": self.cusum_up, "cusum_down": self.cusum_down}
        for ref, agreement in (("gold", self.gold), ("model", self.model), ("peers", self.peers)):
            out[f"{ref}_n"] = float(agreement.n)
            for name in ("bias", "mae", "within"):
                value = getattr(agreement, name)
                out[f"{ref}_{name}"] = math.nan if value is None else value
        return out


# -- the tracker's steps ------------------------------------------------------------------------------


def cusum_step(up: float, down: float, residual: float, settings: DriftSettings) -> tuple[float, float]:
    """One step of the two-sided CUSUM (Page 1954) on a winsorized gold residual.

    The arms are rounded to 1e-9: scores on a 0.5 grid and a slack of 0.15 keep them on a 0.05
    lattice, and float error must not decide whether a sum that lands on the threshold exceeds it.
    """
    e = min(settings.residual_clip, max(-settings.residual_clip, residual))
    up = round(max(0.0, up + e - settings.cusum_slack), 9)
    down = round(max(0.0, down - e - settings.cusum_slack), 9)
    return up, down


def agreement(differences: Sequence[float], tolerance: float) -> Agreement:
    """Bias, MAE and share within ``tolerance`` of a list of (score - reference)."""
    n = len(differences)
    if n == 0:
        return Agreement(0, None, None, None)
    return Agreement(
        n,
        sum(differences) / n,
        sum(abs(d) for d in differences) / n,
        sum(1 for d in differences if abs(d) <= tolerance) / n,
    )


def _gold_residuals(window: Sequence[Residuals]) -> list[float]:
    return [r.gold for r in window if r.gold is not None]


def check_alarm(state: AnnotatorState, settings: DriftSettings) -> Alarm | None:
    """The alarm rule on a state (its latest item is the one being judged); None: no alarm."""
    if state.gold_since_restart < settings.min_gold_items:
        return None
    since = state.items - 1
    if state.cusum_up > settings.cusum_threshold:
        return Alarm("drift_up", since, state.cusum_up)
    if state.cusum_down > settings.cusum_threshold:
        return Alarm("drift_down", since, state.cusum_down)
    gold = agreement(_gold_residuals(state.window), settings.agreement_tolerance)
    if gold.n >= settings.min_gold_items and gold.mae is not None and gold.mae > settings.max_gold_mae:
        return Alarm("disagreement", since, gold.mae)
    return None


def observe(state: AnnotatorState, obs: Observation, settings: DriftSettings) -> AnnotatorState:
    """The state after ``obs``: the window slides; a gold item steps the CUSUM and runs the alarm
    rule (an alarm already raised stays as it was)."""
    if obs.annotator != state.annotator:
        raise ValueError(f"observation of {obs.annotator!r} fed to the state of {state.annotator!r}")
    entry = Residuals(
        item=state.items,
        gold=None if obs.gold is None else obs.score - obs.gold,
        model=None if obs.model_reward is None else obs.score - obs.model_reward,
        peers=tuple(obs.score - peer for peer in obs.peer_scores),
    )
    up, down = state.cusum_up, state.cusum_down
    if entry.gold is not None:
        up, down = cusum_step(up, down, entry.gold, settings)
    is_gold = int(entry.gold is not None)
    new = replace(
        state,
        items=state.items + 1,
        gold_seen=state.gold_seen + is_gold,
        gold_since_restart=state.gold_since_restart + is_gold,
        cusum_up=up,
        cusum_down=down,
        window=(*state.window, entry)[-settings.window_items:],
    )
    if new.alarm is None and is_gold:  # the figures the rule reads move with gold items
        new = replace(new, alarm=check_alarm(new, settings))
    return new


def acknowledge(state: AnnotatorState) -> AnnotatorState:
    """The lead has dealt with the alarm (or looked and found nothing): restart the CUSUM and the
    window; the annotator is not judged again until ``min_gold_items`` new gold items."""
    return replace(state, gold_since_restart=0, cusum_up=0.0, cusum_down=0.0, window=(), alarm=None)


def snapshot(state: AnnotatorState, settings: DriftSettings) -> AnnotatorSnapshot:
    """The figures of one annotator over its window, and its status."""
    tolerance = settings.agreement_tolerance
    gold = agreement(_gold_residuals(state.window), tolerance)
    model = agreement([r.model for r in state.window if r.model is not None], tolerance)
    peers = agreement([d for r in state.window for d in r.peers], tolerance)
    status: Status
    if state.alarm is not None:
        status = state.alarm.kind
    elif gold.n < settings.min_gold_items:
        status = "not_judged"
    else:
        status = "ok"
    return AnnotatorSnapshot(
        annotator=state.annotator,
        status=status,
        items=state.items,
        gold_items=state.gold_seen,
        window_items=len(state.window),
        gold=gold,
        model=model,
        peers=peers,
        cusum_up=state.cusum_up,
        cusum_down=state.cusum_down,
        alarm_since=None if state.alarm is None else state.alarm.since_item,
    )


@dataclass
class DriftTracker:
    """Every annotator's state, in memory; the service rebuilds it by replaying stored scores."""

    settings: DriftSettings = field(default_factory=DriftSettings)
    states: dict[str, AnnotatorState] = field(default_factory=dict)

    def state(self, annotator: str) -> AnnotatorState:
        return self.states.get(annotator) or AnnotatorState(annotator)

    def observe(self, obs: Observation) -> AnnotatorState:
        """Feed one score; the annotator's new state (``.alarm`` set once the rule fired)."""
        state = self.states[obs.annotator] = observe(self.state(obs.annotator), obs, self.settings)
        return state

    def acknowledge(self, annotator: str) -> AnnotatorSnapshot:
        state = self.states[annotator] = acknowledge(self.state(annotator))
        return snapshot(state, self.settings)

    def snapshot(self, annotator: str) -> AnnotatorSnapshot:
        """An annotator never seen is "not_judged", with zero items."""
        return snapshot(self.state(annotator), self.settings)

    def snapshots(self) -> list[AnnotatorSnapshot]:
        """Every annotator seen, by name."""
        return [snapshot(self.states[name], self.settings) for name in sorted(self.states)]
