"""What a run of :func:`strata_tools.train.train` yields, and its report: the rounds' figures, the held-out
evaluations and checkpoints beside what the run had booked, the paired before/after changes
(``paired_change``), the reward curve's oscillation, every request with its reward events, the
checkpoint table and the PNG and JSON it writes."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from strata import ledger
from strata_tools.intervals import clustered_se
from strata_tools.rm.onpolicy import BAD_THRESHOLD

RM_COLOR, ORACLE_COLOR = "tab:blue", "tab:orange"  # the same in both panels of the picture


@dataclass
class RoundStats:
    round: int
    policy_version: int                  # learner version at the end of the round
    submitted: int
    decisions: dict[str, int]
    finals: int
    level1_samples: int                  # Level-1 samples scored this round
    mean_reward: float | None            # light-RM rewards of every Level-1 sample (final or escalated)
    mean_oracle: float | None            # oracle score of those responses
    seconds: float


@dataclass
class Evaluation:
    policy_version: int
    mean_reward: float
    mean_oracle: float
    rewards: list[float] = field(default_factory=list)  # per held-out prompt, in a fixed order
    oracle_scores: list[float] = field(default_factory=list)
    families: list[str] = field(default_factory=list)  # each prompt's paraphrase family: the SE's clusters

    @property
    def bad_share(self) -> float:
        """Share of held-out answers the oracle scores under ``BAD_THRESHOLD``: the bad cases."""
        return sum(score < BAD_THRESHOLD for score in self.oracle_scores) / max(1, len(self.oracle_scores))


@dataclass(frozen=True)
class Booked:
    """What the run's rollouts booked in the cost ledger (every stage, human review apart)."""

    param_tokens: float = 0.0
    device_seconds: float = 0.0
    human_seconds: float = 0.0

    @classmethod
    def of(cls, stages: Sequence[ledger.StageCost]) -> Booked:
        return cls(sum(s.param_tokens for s in stages), sum(s.device_seconds for s in stages),
                   sum(s.human_seconds for s in stages))

    def __sub__(self, other: Booked) -> Booked:
        return Booked(self.param_tokens - other.param_tokens, self.device_seconds - other.device_seconds,
                      self.human_seconds - other.human_seconds)


@dataclass(frozen=True)
class Checkpoint:
    """A held-out evaluation during the run, and what the run's rollouts had booked by then."""

    updates: int                         # policy versions advanced since the start
    booked: Booked
    evaluation: Evaluation


@dataclass(frozen=True)
class Change:
    """A paired before/after difference over the same held-out prompts (same sampling seeds)."""

    mean: float
    stderr: float  # standard error of the mean paired difference (clustered when clusters is set)
    n: int
    clusters: int | None = None  # paraphrase families the prompts came from; None: prompts independent

    def __str__(self) -> str:
        if self.clusters is None:
            return f"{self.mean:+.3f} ± {self.stderr:.3f} (paired SE, n={self.n})"
        return (f"{self.mean:+.3f} ± {self.stderr:.3f} (paired SE clustered by family: {self.n} prompts, "
                f"{self.clusters} families)")


def paired_change(before: Sequence[float], after: Sequence[float], clusters: Sequence[str] | None = None) -> Change:
    """After minus before per prompt; its SE clustered by ``clusters`` (each prompt's paraphrase family)
    when given, since paraphrases of one request are not independent evidence."""
    if len(before) != len(after) or len(before) < 2:
        raise ValueError("a paired change needs two equally long lists of at least 2 scores")
    diffs = [a - b for b, a in zip(before, after, strict=True)]
    if clusters:
        return Change(statistics.fmean(diffs), clustered_se(diffs, clusters), len(diffs), len(set(clusters)))
    return Change(statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)), len(diffs))


@dataclass(frozen=True)
class Oscillation:
    """How far the rounds' mean light-RM reward swings from one round to the next (R8's symptom: a reward
    curve that oscillates by ±2 when the RM's scores are noisy)."""

    step_std: float       # standard deviation of the round-to-round changes
    largest_step: float   # the round-to-round change largest in size, with its sign
    rounds: int

    def __str__(self) -> str:
        return (f"±{self.step_std:.3f} (std of the round-to-round change over {self.rounds} rounds; "
                f"largest {self.largest_step:+.3f})")


def reward_oscillation(round_rewards: Sequence[float]) -> Oscillation | None:
    """The oscillation of a reward curve; None under three rounds (one change has no spread)."""
    if len(round_rewards) < 3:
        return None
    steps = [after - before for before, after in itertools.pairwise(round_rewards)]
    return Oscillation(statistics.stdev(steps), max(steps, key=abs), len(round_rewards))


@dataclass
class TrainSummary:
    start_version: int
    end_version: int
    rounds: list[RoundStats] = field(default_factory=list)
    before: Evaluation | None = None
    after: Evaluation | None = None
    weight_sync_s: float | None = None
    png: str | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)  # before, every eval_every updates, after
    # Every request the rounds submitted, with its reward events (hashes and rewards only; not in the JSON).
    requests: list[Request] = field(default_factory=list, repr=False)

    @property
    def reward_change(self) -> Change | None:
        """Held-out light-RM reward after minus before, per prompt."""
        if not self.before or not self.after:
            return None
        return paired_change(self.before.rewards, self.after.rewards, self.before.families)

    @property
    def oracle_change(self) -> Change | None:
        """Held-out oracle score after minus before, per prompt."""
        if not self.before or not self.after:
            return None
        return paired_change(self.before.oracle_scores, self.after.oracle_scores, self.before.families)

    @property
    def hacking_gap(self) -> Change | None:
        """Held-out light-RM reward change minus oracle change, per prompt: what the policy gained in
        the RM's eyes and not in the oracle's (reward hacking, issue 37; 0 when both move alike)."""
        if not self.before or not self.after:
            return None
        return paired_change([r - o for r, o in zip(self.before.rewards, self.before.oracle_scores, strict=True)],
                             [r - o for r, o in zip(self.after.rewards, self.after.oracle_scores, strict=True)],
                             self.before.families)

    @property
    def reward_oscillation(self) -> Oscillation | None:
        """The round-to-round swing of the rounds' mean light-RM reward (the curve the learner climbs)."""
        return reward_oscillation([r.mean_reward for r in self.rounds if r.mean_reward is not None])

    def changes_at(self, checkpoint: Checkpoint) -> tuple[Change, Change] | None:
        """The held-out light-RM reward and oracle changes from the start to ``checkpoint``, per prompt."""
        if not self.before:
            return None
        after = checkpoint.evaluation
        return (paired_change(self.before.rewards, after.rewards, self.before.families),
                paired_change(self.before.oracle_scores, after.oracle_scores, self.before.families))

    @property
    def reward_gain(self) -> float | None:
        if not self.before or not self.after or self.before.mean_reward == 0:
            return None
        return self.after.mean_reward / self.before.mean_reward - 1.0


@dataclass
class Request:
    """One prompt's request, and the reward events it got."""

    record: Any                       # strata_tools.task.suite.PromptRecord
    request_id: str
    prompt_hash: str = ""
    decision: str = ""                # the scheduler's decision (its enum name), or "refused"
    events: list = field(default_factory=list)
    reason: str = ""                  # the scheduler's reason for it (or the refusal's message)


def checkpoint_lines(summary: TrainSummary) -> list[str]:
    """The held-out checkpoints as a table: updates, what the rollouts had booked, the paired changes."""
    n = len(summary.before.rewards) if summary.before else 0
    lines = [f"held-out checkpoints ({n} prompts; changes since the start, ±1 paired SE):",
             f"  {'updates':>7} {'params x tokens':>15} {'device-s':>9} {'light-RM change':>18} {'oracle change':>18}"]
    for checkpoint in summary.checkpoints:
        at = summary.changes_at(checkpoint)
        reward, oracle = ("-", "-") if at is None else (f"{at[0].mean:+.3f} ± {at[0].stderr:.3f}",
                                                        f"{at[1].mean:+.3f} ± {at[1].stderr:.3f}")
        lines.append(f"  {checkpoint.updates:>7} {checkpoint.booked.param_tokens:>15.3g} "
                     f"{checkpoint.booked.device_seconds:>9.1f} {reward:>18} {oracle:>18}")
    return lines


def write_report(summary: TrainSummary, report_dir: Path) -> Path:
    """The held-out change against the booked cost, the training rounds' curves (PNG), and the JSON summary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    png = report_dir / f"train-{stamp}.png"
    fig, (held_out, rounds_ax) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    _plot_held_out(held_out, summary)
    _plot_rounds(rounds_ax, summary)
    fig.suptitle(f"strata train: policy v{summary.start_version} -> v{summary.end_version}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    png.with_suffix(".json").write_text(json.dumps(report_payload(summary), indent=2, default=str))
    return png


def report_payload(summary: TrainSummary) -> dict[str, Any]:
    """The JSON summary: everything but the requests, the paired changes, and each checkpoint's changes."""
    changes = {name: None if change is None else asdict(change)
               for name, change in (("reward_change", summary.reward_change), ("oracle_change", summary.oracle_change),
                                    ("hacking_gap", summary.hacking_gap))}
    checkpoints = []
    for checkpoint in summary.checkpoints:
        at = summary.changes_at(checkpoint)
        checkpoints.append({"updates": checkpoint.updates, "policy_version": checkpoint.evaluation.policy_version,
                            "booked": asdict(checkpoint.booked),
                            "mean_reward": checkpoint.evaluation.mean_reward,
                            "mean_oracle": checkpoint.evaluation.mean_oracle,
                            "reward_change": None if at is None else asdict(at[0]),
                            "oracle_change": None if at is None else asdict(at[1])})
    oscillation = summary.reward_oscillation
    fields = {f: getattr(summary, f) for f in ("start_version", "end_version", "weight_sync_s", "png")}
    return {**fields, "rounds": [asdict(r) for r in summary.rounds],
            "before": None if summary.before is None else asdict(summary.before),
            "after": None if summary.after is None else asdict(summary.after),
            "checkpoints": checkpoints, "reward_gain": summary.reward_gain, **changes,
            "reward_oscillation": None if oscillation is None else asdict(oscillation)}


def _plot_held_out(ax: Any, summary: TrainSummary) -> None:
    """Held-out light-RM and oracle changes since the start (paired, +-1 SE) against the booked params x tokens."""
    points = [(c.booked.param_tokens, at) for c in summary.checkpoints if (at := summary.changes_at(c)) is not None]
    if points:
        cost = [p[0] for p in points]
        for index, label, marker, color in ((0, "light-RM reward (what PPO climbs)", "o", RM_COLOR),
                                            (1, "oracle (the judge)", "s", ORACLE_COLOR)):
            ax.errorbar(cost, [p[1][index].mean for p in points], yerr=[p[1][index].stderr for p in points],
                        marker=marker, capsize=3, label=label, color=color)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    n = len(summary.before.rewards) if summary.before else 0
    ax.set_xlabel("params x tokens booked by the run's rollouts (every stage)")
    ax.set_ylabel(f"held-out change since the start ({n} prompts, ±1 paired SE)")
    ax.set_title("held-out prompts as training goes")
    ax.legend()


def _plot_rounds(ax: Any, summary: TrainSummary) -> None:
    """The training rounds' Level-1 samples: light-RM reward and oracle score per round (not held out)."""
    rounds = [r for r in summary.rounds if r.mean_reward is not None]
    ax.plot([r.round for r in rounds], [r.mean_reward for r in rounds], marker="o", label="light RM reward",
            color=RM_COLOR)
    ax.plot([r.round for r in rounds], [r.mean_oracle for r in rounds], marker="s", label="oracle score",
            color=ORACLE_COLOR)
    for r in summary.rounds[1:]:
        previous = summary.rounds[r.round - 1] if r.round else None
        if previous is not None and r.policy_version != previous.policy_version:
            ax.axvline(r.round, color="grey", alpha=0.2)
    ax.set_xlabel("round (grey lines: new policy version)")
    ax.set_ylabel("score (0-5)")
    ax.set_title("training rounds' Level-1 samples (not held out)")
    ax.legend()
