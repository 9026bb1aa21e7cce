"""What each kind of reward-model data adds (issue 37 part 3; the article's stage 1 and §5.1).

On one set of train-split prompts, every arm fine-tunes the same strong RM (its model before growth,
as ``strata rm refresh`` does: answers grouped by prompt, the zoo's data replayed, the refresh's
steps and rate) on a **base** of one Level-1 and one Level-2 answer per prompt, plus one more answer
per prompt from the arm's source, every answer labelled by the oracle:

- ``samples`` (the control): another plain Level-1 sample: what more of the same buys;
- ``best_of_n``: the Level-1 answer the served light RM rates best of ``best_of`` fresh samples, the
  answers it over-rates, where PPO against it goes;
- ``perturbed``: the Level-2 answer with synonyms swapped or sentences reordered
  (``strata_tools.rm.augment``), re-scored by the oracle (§5.1's near misses);
- ``policy_checkpoint``: a sample of a PPO checkpoint the learner trained against the light RM.

Each arm, and the RM before any fine-tuning (``none``), is judged as ``strata bench rm`` judges an RM:
on the fresh split's Level-1 and Level-2 answers against the oracle; the gain is the Level-1
Spearman over the base arm, with a bootstrap standard error. The probe writes no answers (it
proposes directions), so it is no source here.

The rules are pure (top of the file); :func:`run_sources` loads the models.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from strata_tools.rm.augment import perturb_each
from strata_tools.rm.lifecycle import mean_rewards, read_pairs
from strata_tools.rm.models import ZooModels, ZooSource
from strata_tools.rm.onpolicy import (
    OnPolicyFigures,
    PolicyAnswer,
    onpolicy_figures,
    policy_answers,
    sample_policy_answers,
)
from strata_tools.rm.refresh import (
    RefreshOptions,
    fine_tune_steps,
    gain_se,
    grouped_by_prompt,
    replay_groups,
    spearman,
)
from strata_tools.rm.strong import StrongOptions, train_strong
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import load_suite

log = logging.getLogger(__name__)

EXTRA_ARMS: tuple[str, ...] = ("samples", "best_of_n", "perturbed", "policy_checkpoint")
REPORT_DIR = "rm-sources"  # under the state dir, beside the refresh's reports


class SourcesOptions(BaseSettings):
    """``strata rm sources``; every field is also ``STRATA_RM_SOURCES_<NAME>`` (flags win)."""

    model_config = SettingsConfigDict(env_prefix="STRATA_RM_SOURCES_", frozen=True, extra="ignore")

    arms: tuple[str, ...] = Field(EXTRA_ARMS, description="sources measured against the base (and in this order)")
    prompts: int = Field(200, ge=8, description="train-split prompts each arm's labels are answers to")
    best_of: int = Field(4, ge=2, description="Level-1 samples the light RM picks its best from (best_of_n)")
    policy_checkpoint: Path | None = Field(
        None, description="a PPO checkpoint of this zoo's Level-1 policy; unset: the learner's newest that "
                          "started from it, if any"
    )
    eval_prompts: int | None = Field(None, ge=10, description="fresh-split prompts judged on (unset: all)")
    replay: float = Field(0.5, ge=0, description="zoo RM groups replayed per labelled prompt (as the refresh)")
    strong_epochs: float = Field(3.0, gt=0, description="passes over the prompts and the replay (as the refresh)")
    bootstrap_rounds: int = Field(1000, ge=100, description="resamples of the judged answers for a gain's SE")
    seed: int = 0
    device: str = "auto"

    @field_validator("arms")
    @classmethod
    def _known_arms(cls, arms: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [arm for arm in arms if arm not in EXTRA_ARMS]
        if unknown:
            raise ValueError(f"unknown source(s) {unknown}; known: {', '.join(EXTRA_ARMS)}")
        if len(set(arms)) != len(arms):
            raise ValueError("a source is named twice")
        return arms


@dataclass(frozen=True)
class ArmResult:
    """One arm: the labels it trained on, what its own source added, and how it ranks fresh answers."""

    arm: str
    n_labels: int  # base + source (0 for ``none``)
    n_added: int  # answers of the arm's own source
    added_oracle: float  # mean oracle score of those answers (nan for none/base)
    added_light: float  # mean served-light-RM reward of them: how much the RM likes them
    figures: OnPolicyFigures
    gain_level1: float  # Level-1 Spearman minus the base arm's (nan for the base arm itself)
    gain_se: float
    seconds: float


@dataclass
class SourcesReport:
    zoo: str
    n_prompts: int
    steps: int
    lr: float
    arms: list[ArmResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # arm -> why it was not run
    seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str)


# --- the rules (pure) -----------------------------------------------------------------------------


def best_of_n(rewards: Sequence[Sequence[float]]) -> list[int]:
    """Per prompt, the draw with the highest reward (the first of equals): ``rewards[draw][prompt]``."""
    if not rewards or any(len(draw) != len(rewards[0]) for draw in rewards):
        raise ValueError("one reward per prompt in every draw")
    return [max(range(len(rewards)), key=lambda d: (rewards[d][p], -d)) for p in range(len(rewards[0]))]


def label_rows(answers: Sequence[PolicyAnswer], source: str) -> list[dict[str, Any]]:
    """Training rows labelled by the oracle, tagged with where they came from."""
    return [{"prompt": a.prompt, "response": a.response, "score": a.oracle, "source": source} for a in answers]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def level1_gain(arm: Sequence[float], base: Sequence[float], answers: Sequence[PolicyAnswer], rounds: int,
                seed: int) -> tuple[float, float]:
    """Level-1 Spearman gain of ``arm``'s rewards over ``base``'s on the same answers, and its SE."""
    picks = [i for i, a in enumerate(answers) if a.tier == "level1"]
    oracle = [answers[i].oracle for i in picks]
    ours, theirs = [arm[i] for i in picks], [base[i] for i in picks]
    return spearman(ours, oracle) - spearman(theirs, oracle), gain_se(ours, theirs, oracle, rounds, seed)


def summary_line(report: SourcesReport) -> str:
    """The last line: the base arm's Level-1 Spearman and every other arm's gain over it, ± its SE."""
    by_arm = {a.arm: a for a in report.arms}
    parts = [f"base_l1={by_arm['base'].figures.spearman_level1:.3f}" if "base" in by_arm else "base_l1=nan"]
    for arm in report.arms:
        if arm.arm not in ("none", "base"):
            parts.append(f"{arm.arm}={arm.gain_level1:+.3f}±{arm.gain_se:.3f}")
    parts += [f"{arm}=skipped" for arm in report.skipped]
    return "rm_sources " + " ".join(parts)


def table(report: SourcesReport) -> list[str]:
    lines = [f"{'arm':18s} {'labels':>6s} {'added':>5s} {'oracle':>6s} {'light':>6s} | {'L1 rho':>6s} "
             f"{'L2 rho':>6s} {'badAUC':>6s} {'pairs':>6s} | gain over base (L1)"]
    for a in report.arms:
        f = a.figures
        gain = "" if math.isnan(a.gain_level1) else f"{a.gain_level1:+.3f} ± {a.gain_se:.3f}"
        lines.append(f"{a.arm:18s} {a.n_labels:6d} {a.n_added:5d} {a.added_oracle:6.2f} {a.added_light:6.2f} | "
                     f"{f.spearman_level1:6.3f} {f.spearman_level2:6.3f} {f.bad_auc:6.3f} {f.pair_accuracy:6.3f} | "
                     f"{gain}")
    lines += [f"{arm:18s} skipped: {why}" for arm, why in report.skipped.items()]
    return lines


# --- the run (loads the zoo's models) -------------------------------------------------------------


def newest_policy_checkpoint(checkpoint_dir: Path, level1: Path) -> Path | None:
    """The newest learner checkpoint under ``checkpoint_dir`` whose PPO run started from ``level1``."""
    from svc_learner.checkpoint import list_checkpoints

    for path in reversed(list_checkpoints(checkpoint_dir)):
        config_file = path / "learner_config.json"
        try:
            initial = json.loads(config_file.read_text(encoding="utf-8")).get("initial_policy")
        except (OSError, ValueError):
            continue
        if initial and Path(initial).resolve() == Path(level1).resolve():
            return path
    return None


@dataclass
class _Arm:
    name: str
    added: list[PolicyAnswer]
    added_light: list[float]


def _perturbed(answers: Sequence[PolicyAnswer], records: dict[str, Any], seed: int) -> list[PolicyAnswer]:
    return [PolicyAnswer(answer.prompt_id, answer.prompt, "perturbed", text, answer.directions,
                         oracle_score(records[answer.prompt_id], text))
            for answer, text in zip(answers, perturb_each([a.response for a in answers], seed), strict=True)
            if text is not None]


def run_sources(options: SourcesOptions, settings: Any, zoo: ZooSource,
                progress: Callable[[str], None] = print) -> SourcesReport:
    """Sample every source's answers, fine-tune one RM per arm, judge each on the fresh answers."""
    started = time.time()
    models = zoo.models()
    cache = Path(settings.cache_dir).expanduser() / "rm"
    fresh = policy_answers(models, "fresh", cache_dir=cache / "onpolicy", limit=options.eval_prompts)
    base_rows, arms, skipped = _sample_arms(options, models, progress)
    report = _fine_tune_and_judge(options, settings, zoo, models, base_rows, arms, fresh, cache, progress)
    report.skipped = skipped
    report.seconds = round(time.time() - started, 1)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
    out = Path(settings.state_dir) / REPORT_DIR / f"{models.root.name}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.to_json(), encoding="utf-8")
    progress(f"report: {out}")
    return report


def _sample_arms(options: SourcesOptions, zoo: ZooModels, progress: Callable[[str], None],
                 ) -> tuple[list[dict[str, Any]], list[_Arm], dict[str, str]]:
    """The base rows, each arm's added answers with the light RM's rewards of them, and the arms skipped."""
    from strata.models.loading import load_reward_model
    from svc_learner.config import LearnerSettings

    records = random.Random(options.seed).sample(load_suite("train"), options.prompts)
    light = load_reward_model(zoo.rm_light, device=options.device)

    def sample(model_dir: Path, tier: str, seed: int) -> list[PolicyAnswer]:
        return sample_policy_answers(zoo.probe, {tier: model_dir}, records, options.seed + seed, progress=False)

    def light_rewards(answers: Sequence[PolicyAnswer], desc: str) -> list[float]:
        return mean_rewards([light], [a.prompt for a in answers], [a.response for a in answers],
                            zoo.config.rm_max_length, desc)

    progress(f"sampling: {options.prompts} train prompts, a Level-2 answer and {options.best_of + 1} Level-1 "
             "answers each")
    level2 = sample(zoo.level2, "level2", 101)
    level1 = [sample(zoo.level1, "level1", 201 + k) for k in range(options.best_of + 1)]
    arms: list[_Arm] = []
    skipped: dict[str, str] = {}
    for name in options.arms:
        if name == "samples":
            arms.append(_Arm(name, level1[1], light_rewards(level1[1], "light: samples")))
        elif name == "best_of_n":
            pool = level1[1:]
            rewards = [light_rewards(draw, f"light: draw {k + 1}") for k, draw in enumerate(pool)]
            picks = best_of_n(rewards)
            arms.append(_Arm(name, [pool[d][p] for p, d in enumerate(picks)],
                             [rewards[d][p] for p, d in enumerate(picks)]))
        elif name == "perturbed":
            added = _perturbed(level2, {r.id: r for r in records}, options.seed)
            arms.append(_Arm(name, added, light_rewards(added, "light: perturbed")))
        elif name == "policy_checkpoint":
            checkpoint = options.policy_checkpoint or newest_policy_checkpoint(
                LearnerSettings().checkpoint_dir, zoo.level1)
            if checkpoint is None:
                skipped[name] = (f"no learner checkpoint started from {zoo.level1}: run `make demo` (or the learner) "
                                 "on this zoo, or pass --policy-checkpoint DIR")
                continue
            progress(f"policy checkpoint: {checkpoint}")
            added = sample(Path(checkpoint), "level1", 301)
            arms.append(_Arm(name, added, light_rewards(added, "light: checkpoint")))
    return label_rows(level1[0], "sample:level1") + label_rows(level2, "sample:level2"), arms, skipped


def _fine_tune_and_judge(options: SourcesOptions, settings: Any, zoo: ZooSource, models: ZooModels,
                         base_rows: list[dict[str, Any]], arms: list[_Arm], fresh: list[PolicyAnswer], cache: Path,
                         progress: Callable[[str], None]) -> SourcesReport:
    """The RM before fine-tuning (``models``' strong RM, what ``zoo`` gives), then one fine-tune per arm (the
    base first), each judged on ``fresh``."""
    from strata.models.loading import load_reward_model
    from strata_tools.rm.recipe import student_init_dir

    recipe = models.config
    init = student_init_dir(models.rm_strong) or models.rm_strong
    replay = replay_groups(read_pairs(models.rm_data, need_score=True), round(options.replay * options.prompts),
                           options.seed)
    groups_per_step = recipe.rm_strong_train.batch_size
    steps = fine_tune_steps(options.prompts, len({r["group"] for r in replay}), groups_per_step,
                            RefreshOptions(strong_epochs=options.strong_epochs))
    lr = 0.6 * recipe.rm_strong_train.lr
    report = SourcesReport(zoo=models.root.name, n_prompts=options.prompts, steps=steps, lr=lr)
    progress(f"each arm: {steps} steps at lr {lr:g} from {init.name} + {len(replay)} replayed zoo pairs; judged on "
             f"{len(fresh) // 2} fresh prompts' Level-1 and Level-2 answers")

    def judge(model_dir: Path, desc: str) -> list[float]:
        return mean_rewards([load_reward_model(model_dir, device=options.device)], [a.prompt for a in fresh],
                            [a.response for a in fresh], recipe.rm_max_length, desc)

    t = time.time()
    report.arms.append(ArmResult("none", 0, 0, float("nan"), float("nan"), onpolicy_figures(fresh, judge(init, "none")),
                                 float("nan"), float("nan"), round(time.time() - t, 1)))
    work = cache / f".sources-{uuid.uuid4().hex[:8]}"
    base_rewards: list[float] | None = None
    try:
        for arm in [_Arm("base", [], []), *arms]:
            t = time.time()
            rows = base_rows + label_rows(arm.added, arm.name)
            data = work / f"{arm.name}.jsonl"
            data.parent.mkdir(parents=True, exist_ok=True)
            data.write_text("".join(json.dumps(r) + "\n" for r in grouped_by_prompt(rows) + replay), encoding="utf-8")
            progress(f"arm {arm.name}: {len(rows)} labels")
            result = train_strong(StrongOptions(
                data=data, init=str(init), n_bins=recipe.rm_n_bins, steps=steps, lr=lr, groups_per_step=groups_per_step,
                match_pairs=0, max_length=recipe.rm_max_length, widen=1, grow_layers=0, pseudo_label=False,
                seed=options.seed, device=options.device, out=work / f"{arm.name}-rm"), settings, zoo,
                lambda message: None)
            rewards = judge(Path(result.entry.path), f"judge: {arm.name}")
            if base_rewards is None:
                base_rewards, gain, se = rewards, float("nan"), float("nan")
            else:
                gain, se = level1_gain(rewards, base_rewards, fresh, options.bootstrap_rounds, options.seed)
            row = ArmResult(arm.name, len(rows), len(arm.added), mean([a.oracle for a in arm.added]),
                            mean(arm.added_light), onpolicy_figures(fresh, rewards), gain, se,
                            round(time.time() - t, 1))
            report.arms.append(row)
            progress(table(SourcesReport(report.zoo, 0, 0, 0.0, [row]))[1])
            shutil.rmtree(work / f"{arm.name}-rm", ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report
