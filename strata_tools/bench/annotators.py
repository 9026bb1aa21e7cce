"""Annotator drift (R18): simulated annotators, one drifting from a known item on, and the alarm.

Each trial is a pool of ``--annotators`` of the zoo's ``SimulatedAnnotator`` (the oracle's score plus
Gaussian noise of ``--noise-sd``, rounded to 0.5, clipped to 0-5), each scoring ``--items`` items:
the prompt suite's reference answers and their degradations (``strata_tools.task.corpus.rm_pairs``), whose
true score is the oracle's. No model is involved: the bench neither builds nor reads a model zoo.
One annotator, drawn at random, drifts from its item ``--drift-from`` on by ``+--drift`` over
``--drift-items`` items (a linear ramp, the seed's 3.8 -> 4.2 over 300 items; ``--drift-items 1``
is a step). Per round every annotator scores one item:

- a ``--gold-share`` of them are gold items, the oracle's score known (each annotator sees each
  gold item at most once, as the service serves them);
- each annotator but the round's first joins the previous one's regular item at ``--double-share``
  (a double-annotated item: the two are each other's peers);
- every item has a strong-RM stand-in reward: the oracle's score plus a fixed per-item Gaussian
  error of sd ``--rm-noise-sd``, clipped to 0-5 (a model wrong in its own, consistent way).

Every score goes through ``svc_annotation.drift``'s tracker (CUSUM on gold residuals). An alarm on
an annotator who is not drifting, or on the drifting one before its drift began, is a false alarm:
the lead acknowledges it and tracking goes on. The drifting annotator's first alarm from the drift's
start is a detection; its delay counts that annotator's items since the drift began.

Baseline, on the same scores in the same run: the rule a lead would apply to the page's windowed
figure, an alarm when the window's gold bias is beyond ``--naive-threshold`` once ``min_gold_items``
gold items are in the window (then the window restarts), one row per threshold.

Last line: ``annotators drift_detected=<k>/<n> false_alarms=<m> detection_delay=<median items>``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from strata_tools.task.corpus import RmPair, rm_pairs
from strata_tools.task.oracle import MAX_SCORE, SimulatedAnnotator, oracle_score
from strata_tools.task.suite import load_suite
from svc_annotation.drift import DriftSettings, DriftTracker, Observation, item_observations

POOL_SEED = 0  # the corpus of (prompt, response) items is the same in every run
GOLD_SET_SIZE = 400  # gold items in the gold file: more than any annotator sees in a default run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=20, help="pools simulated, one drifting annotator each")
    parser.add_argument("--annotators", type=int, default=5, help="annotators per pool")
    parser.add_argument("--items", type=int, default=1000, help="items each annotator scores")
    parser.add_argument("--drift-from", type=int, default=200, help="the drifting annotator's item the drift starts at")
    parser.add_argument("--drift", type=float, default=0.4, help="the drift's full size, in score points")
    parser.add_argument("--drift-items", type=int, default=300, help="items the drift takes to reach its full size")
    parser.add_argument("--noise-sd", type=float, default=0.3, help="annotators' Gaussian noise (before rounding)")
    parser.add_argument("--gold-share", type=float, default=0.1, help="share of each annotator's items that are gold")
    parser.add_argument("--double-share", type=float, default=0.1,
                        help="chance an annotator joins the round's previous regular item (double annotation)")
    parser.add_argument("--rm-noise-sd", type=float, default=0.5, help="the strong-RM stand-in's per-item error")
    parser.add_argument("--naive-threshold", type=float, nargs="+", default=[0.2, 0.3, 0.35],
                        help="baseline: alarm when the window's |gold bias| exceeds this (one row each)")
    parser.add_argument("--gold-range", type=float, nargs=2, default=[0.0, MAX_SCORE], metavar=("LO", "HI"),
                        help="gold items are drawn among items whose true score is in [LO, HI]")
    defaults = DriftSettings()
    parser.add_argument("--window", type=int, default=defaults.window_items, help="DriftSettings.window_items")
    parser.add_argument("--min-gold", type=int, default=defaults.min_gold_items, help="DriftSettings.min_gold_items")
    parser.add_argument("--cusum-slack", type=float, default=defaults.cusum_slack, help="DriftSettings.cusum_slack")
    parser.add_argument("--cusum-threshold", type=float, default=defaults.cusum_threshold,
                        help="DriftSettings.cusum_threshold")
    parser.add_argument("--seed", type=int, default=0)


class LateDriftAnnotator(SimulatedAnnotator):
    """A ``SimulatedAnnotator`` whose drift ramps from item ``drift_from`` on, not from item 0."""

    def __init__(self, drift_from: int, name: str = "annotator-0", seed: int = 0, noise_sd: float = 0.3,
                 drift: float = 0.0, drift_items: int = 300) -> None:
        super().__init__(name=name, seed=seed, noise_sd=noise_sd, drift=drift, drift_items=drift_items)
        self.drift_from = drift_from

    def current_bias(self) -> float:
        return self.drift * min(1.0, max(0, self.n_seen - self.drift_from) / self.drift_items)


@dataclass
class WindowMean:
    """The baseline: |mean gold residual| over the last ``window`` items beyond ``threshold``."""

    window: int
    min_gold: int
    threshold: float
    residuals: deque[tuple[int, float]] = field(default_factory=deque)  # (item, score - gold)

    def observe(self, item: int, gold_residual: float | None) -> bool:
        if gold_residual is not None:
            self.residuals.append((item, gold_residual))
        while self.residuals and self.residuals[0][0] <= item - self.window:
            self.residuals.popleft()
        if len(self.residuals) < self.min_gold:
            return False
        if abs(statistics.fmean(e for _, e in self.residuals)) > self.threshold:
            self.residuals.clear()  # acknowledged: the window restarts
            return True
        return False


@dataclass
class Outcome:
    """One detector in one trial."""

    detected_at: int | None = None  # the drifting annotator's item of its first alarm after the drift began
    bias_at_detection: float | None = None  # its true bias then
    false_alarms: list[tuple[str, int]] = field(default_factory=list)  # (annotator, item)


@dataclass
class Trial:
    drifter: str
    cusum: Outcome
    baselines: list[Outcome]  # one per --naive-threshold
    tracker: DriftTracker


@dataclass(frozen=True)
class Item:
    id: str
    index: int  # in the corpus pool
    gold: bool


def _record(outcome: Outcome, name: str, item: int, drifter: LateDriftAnnotator | None) -> bool:
    """Book an alarm; True when it is a false alarm (to be acknowledged)."""
    if drifter is not None and name == drifter.name and item >= drifter.drift_from:
        if outcome.detected_at is None:
            outcome.detected_at = item
            outcome.bias_at_detection = drifter.current_bias()
        return False
    outcome.false_alarms.append((name, item))
    return True


def run_trial(trial: int, args: argparse.Namespace, pairs: Sequence[RmPair], truths: Sequence[float],
              settings: DriftSettings) -> Trial:
    rng = random.Random(f"{args.seed}:{trial}")
    n = args.annotators
    drifter_index = rng.randrange(n)
    annotators = [
        LateDriftAnnotator(
            drift_from=args.drift_from, name=f"annotator-{j}", seed=rng.randrange(2**32), noise_sd=args.noise_sd,
            drift=args.drift if j == drifter_index else 0.0, drift_items=args.drift_items,
        )
        for j in range(n)
    ]
    drifter = annotators[drifter_index]
    rm_error = [rng.gauss(0.0, args.rm_noise_sd) for _ in pairs]  # fixed per item: the RM's own mistakes
    lo, hi = args.gold_range
    eligible = [k for k in range(len(pairs)) if lo <= truths[k] <= hi]
    gold_set = set(eligible[:GOLD_SET_SIZE])  # the pool is shuffled already: any slice is a fair draw
    regular = [k for k in range(len(pairs)) if k not in gold_set]
    gold_queues = [rng.sample(sorted(gold_set), len(gold_set)) for _ in range(n)]

    tracker = DriftTracker(settings)
    cusum = Outcome()
    baselines = [
        (Outcome(), {a.name: WindowMean(settings.window_items, settings.min_gold_items, threshold) for a in annotators})
        for threshold in args.naive_threshold
    ]
    for round_ in range(args.items):
        # Assign: one item per annotator; some share the previous annotator's regular item.
        assigned: dict[str, list[int]] = {}  # item id -> annotator indices
        items: dict[str, Item] = {}
        previous: str | None = None
        for j in rng.sample(range(n), n):
            if (previous is not None and not items[previous].gold and len(assigned[previous]) == 1
                    and rng.random() < args.double_share):
                assigned[previous].append(j)
                continue
            gold = rng.random() < args.gold_share
            k = gold_queues[j].pop() if gold and gold_queues[j] else rng.choice(regular)
            item = Item(f"{round_}:{j}", k, k in gold_set)
            items[item.id], assigned[item.id], previous = item, [j], item.id
        # Score, then feed each item's observations to the tracker and the baselines.
        for item_id, who in assigned.items():
            k = items[item_id].index
            pair = pairs[k]
            scores = {annotators[j].name: annotators[j].annotate(pair.record, pair.response) for j in who}
            reward = min(MAX_SCORE, max(0.0, truths[k] + rm_error[k]))
            gold = truths[k] if items[item_id].gold else None
            for obs in item_observations(item_id, scores, gold, reward):
                _feed(obs, round_, tracker, cusum, baselines, drifter)
    return Trial(drifter.name, cusum, [outcome for outcome, _ in baselines], tracker)


def _feed(obs: Observation, item: int, tracker: DriftTracker, cusum: Outcome,
          baselines: Sequence[tuple[Outcome, dict[str, WindowMean]]], drifter: LateDriftAnnotator) -> None:
    """One observation through every detector; false alarms are booked and acknowledged."""
    alarm = tracker.observe(obs).alarm
    if alarm is not None and alarm.since_item == item and _record(cusum, obs.annotator, item, drifter):
        tracker.acknowledge(obs.annotator)
    gold_residual = None if obs.gold is None else obs.score - obs.gold
    for outcome, windows in baselines:
        if windows[obs.annotator].observe(item, gold_residual):
            _record(outcome, obs.annotator, item, drifter)


def corpus() -> tuple[list[RmPair], list[float]]:
    """The items (shuffled once, fixed) and their oracle scores."""
    pairs = rm_pairs(load_suite(), pairs_per_prompt=1, seed=POOL_SEED)
    random.Random(POOL_SEED).shuffle(pairs)
    return pairs, [oracle_score(p.record, p.response) for p in pairs]


@dataclass(frozen=True)
class Summary:
    detected: int
    trials: int
    false_alarms: int
    delays: tuple[int, ...]
    biases: tuple[float, ...]  # the drifting annotator's true bias when it was flagged

    @property
    def median_delay(self) -> float:
        return statistics.median(self.delays) if self.delays else float("nan")


def summarise(outcomes: Sequence[Outcome], drift_from: int) -> Summary:
    found = [o for o in outcomes if o.detected_at is not None]
    return Summary(
        detected=len(found),
        trials=len(outcomes),
        false_alarms=sum(len(o.false_alarms) for o in outcomes),
        delays=tuple(o.detected_at - drift_from for o in found if o.detected_at is not None),
        biases=tuple(o.bias_at_detection for o in found if o.bias_at_detection is not None),
    )


def _fmt(value: float | None, spec: str = "+.2f") -> str:
    return "-" if value is None else format(value, spec)


def run(args: argparse.Namespace) -> int:
    if args.trials < 1 or args.annotators < 2 or not 0 <= args.drift_from < args.items:
        print("annotators: need --trials >= 1, --annotators >= 2 and 0 <= --drift-from < --items")
        return 2
    started = time.monotonic()
    settings = DriftSettings(window_items=args.window, min_gold_items=args.min_gold,
                             cusum_slack=args.cusum_slack, cusum_threshold=args.cusum_threshold)
    pairs, truths = corpus()
    trials = [run_trial(t, args, pairs, truths, settings) for t in range(args.trials)]
    items = args.trials * args.annotators * args.items
    print(f"annotators: {args.trials} trials x {args.annotators} annotators x {args.items} items "
          f"({items} scores, {time.monotonic() - started:.1f} s); one drifts {args.drift:+.2f} from item "
          f"{args.drift_from} over {args.drift_items} items; noise sd {args.noise_sd}, gold {args.gold_share:.0%}, "
          f"double {args.double_share:.0%}, RM error sd {args.rm_noise_sd}; no model zoo (oracle + corpus)")
    print(f"settings: {settings}")
    print()
    last = trials[-1]
    print(f"trial {len(trials) - 1}, every annotator at the end (window {settings.window_items} items; "
          f"drifting: {last.drifter}):")
    print(f"{'annotator':<13}{'status':<13}{'items':>6}{'gold':>6}{'bias_gold':>10}{'mae_gold':>9}"
          f"{'bias_rm':>8}{'agree_peers':>12}{'cusum+':>8}{'cusum-':>8}{'alarm@':>7}")
    for s in last.tracker.snapshots():
        print(f"{s.annotator:<13}{s.status:<13}{s.items:>6}{s.gold_items:>6}{_fmt(s.gold.bias):>10}"
              f"{_fmt(s.gold.mae, '.2f'):>9}{_fmt(s.model.bias):>8}{_fmt(s.peers.within, '.2f'):>12}"
              f"{s.cusum_up:>8.2f}{s.cusum_down:>8.2f}{'-' if s.alarm_since is None else s.alarm_since:>7}")
    print()
    ours = summarise([t.cusum for t in trials], args.drift_from)
    rows = [(f"CUSUM k={settings.cusum_slack} h={settings.cusum_threshold} (Page 1954)", ours)] + [
        (f"baseline: window |bias| > {threshold}", summarise([t.baselines[i] for t in trials], args.drift_from))
        for i, threshold in enumerate(args.naive_threshold)
    ]
    clean = args.trials * args.annotators * args.items - args.trials * (args.items - args.drift_from)
    print(f"{'detector':<34}{'detected':>9}{'false_alarms':>13}{'per_10k_clean_items':>20}"
          f"{'median_delay':>13}{'delay_range':>13}{'bias_at_alarm':>14}")
    for label, s in rows:
        spread = f"{min(s.delays)}-{max(s.delays)}" if s.delays else "-"
        bias = _fmt(statistics.median(s.biases)) if s.biases else "-"
        print(f"{label:<34}{f'{s.detected}/{s.trials}':>9}{s.false_alarms:>13}"
              f"{1e4 * s.false_alarms / clean:>20.2f}{s.median_delay:>13.0f}{spread:>13}{bias:>14}")
    print("false alarms: on annotators not drifting, or on the drifting one before its drift; delay: the drifting "
          "annotator's items from the drift's start to its alarm; bias_at_alarm: its drift then (median)")
    delay = "nan" if not ours.delays else f"{ours.median_delay:.0f}"
    print(f"annotators drift_detected={ours.detected}/{ours.trials} false_alarms={ours.false_alarms} "
          f"detection_delay={delay}")
    return 0
