"""Training a strong RM version (R5): ``StrongOptions`` and the zoo recipe's defaults for what they leave
unset, the model it starts from, its fit and oracle metrics, and the logged rollouts it pseudo-labels
(``PSEUDO_LABELS_FILE`` in the version); what ``strata rm train-strong`` and the RM loop run."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata.errors import CliError
from strata_tools.rm.lifecycle import eval_sets, read_pairs, rollout_rows, score_logits
from strata_tools.rm.models import ZooRecipe, ZooSource
from strata_tools.rm.versions import finalize_version
from strata_tools.task.suite import load_suite

if TYPE_CHECKING:  # torch: imported by the runs that train, not by `strata rm --help`
    from strata_tools.rm.recipe import StrongRecipe

PSEUDO_LABELS_FILE = "pseudo_labels.jsonl"


@dataclass(frozen=True)
class StrongOptions:
    """One strong-RM training run (what ``strata rm train-strong`` runs). Unset numbers take the zoo's
    recipe (``ZooConfig.rm_strong_*``); ``data`` unset: the zoo's oracle-labelled pairs."""

    data: Path | None = None
    init: str | None = None
    n_bins: int = 11
    steps: int | None = None
    batch_size: int = 16
    lr: float | None = None
    groups_per_step: int | None = None
    pairwise_weight: float = 1.0
    match_pairs: int | None = None
    max_length: int | None = None
    widen: int | None = None
    grow_layers: int | None = None
    grow_steps: int | None = None
    frozen_layers: int = 0
    init_layers: int | None = None
    pseudo_label: bool = True
    max_rollouts: int = 20000
    out: Path | None = None
    seed: int = 0
    device: str = "auto"


@dataclass
class StrongResult:
    entry: Any  # svc_reward.registry.RmVersion of the new version
    loss: float
    metrics: dict[str, float]
    n_pseudo_labelled: int


def _with_recipe_defaults(options: StrongOptions, recipe: ZooRecipe) -> StrongOptions:
    """The options a user left unset taken from the zoo recipe (the ``ZooConfig``), then checked."""
    defaults = {"steps": recipe.rm_strong_train.steps, "lr": recipe.rm_strong_train.lr,
                "groups_per_step": recipe.rm_strong_train.batch_size, "max_length": recipe.rm_max_length,
                "match_pairs": recipe.rm_strong_match_pairs if options.data is None else 0,
                "init_layers": 0 if options.init else recipe.rm_strong_init_layers,
                "widen": 1 if options.init else recipe.rm_strong_widen,
                "grow_layers": 0 if options.init else recipe.rm_strong_grow_layers}
    options = replace(options, **{k: v for k, v in defaults.items() if getattr(options, k) is None})
    if options.match_pairs < 0:
        raise CliError(f"--match-pairs must be at least 0 (0: no match steps), got {options.match_pairs}")
    if options.init_layers < 0:
        raise CliError(f"--init-layers must be at least 0 (0: every block of the init), got {options.init_layers}")
    if options.frozen_layers < 0:
        raise CliError(f"--frozen-layers must be at least 0 (0: the whole trunk trains), got {options.frozen_layers}")
    if options.widen < 1 or options.grow_layers < 0 or (options.grow_steps is not None and options.grow_steps < 1):
        raise CliError(f"--widen must be at least 1, --grow-layers at least 0 and --grow-steps at least 1, got "
                       f"{options.widen}, {options.grow_layers} and {options.grow_steps}")
    return options


def _strong_init(init: str, options: StrongOptions) -> tuple[Any, Any, Path]:
    """The strong RM's start: ``init`` read with its first ``options.init_layers`` blocks (0: all), with a fresh
    head of ``n_bins`` logits, its tokenizer padding right."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from strata.models.loading import ModelLoadError, check_model_dir
    from strata.models.prompts import model_positions
    from strata_tools.rm.recipe import check_init_layers, rm_init_overrides

    try:
        init_dir = check_model_dir(init)
        check_init_layers(init_dir, options.init_layers)
        tokenizer = AutoTokenizer.from_pretrained(init_dir, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(
            init_dir, num_labels=options.n_bins, ignore_mismatched_sizes=True, local_files_only=True,
            **rm_init_overrides(options.init_layers))
    except (ModelLoadError, OSError, ValueError) as exc:
        raise CliError(f"cannot start the strong RM from {init}: {exc}") from exc
    positions = model_positions(model.config)
    if positions is not None and options.max_length > positions:
        raise CliError(f"--max-length {options.max_length} exceeds the {positions} positions of {init_dir}")
    if options.frozen_layers:
        from strata_tools.rm.train import lower_modules

        try:
            lower_modules(model, options.frozen_layers)
        except ValueError as exc:
            raise CliError(f"--frozen-layers {options.frozen_layers} on {init_dir}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer, Path(init_dir)


def _oracle_metrics(rm: Any, max_length: int) -> dict[str, float]:
    """The RM's rank metrics against the oracle on each evaluation split, as ``<metric>/oracle_<split>``."""
    from strata.models.reward import expected_reward
    from strata_tools.rm.distill import rank_metrics

    metrics: dict[str, float] = {}
    for split, (prompts, responses, oracle) in eval_sets().items():
        rewards = expected_reward(score_logits(rm, prompts, responses, max_length, f"eval {split}")).tolist()
        for name, value in rank_metrics(rewards, oracle).items():
            metrics[f"{name}/oracle_{split}"] = value
    return metrics


def _pseudo_label(rm: Any, rows: list[dict[str, Any]], max_length: int, path: Path) -> None:
    """Each logged rollout's score and logits under ``rm``, set on the row and written to ``path``."""
    from strata.models.reward import expected_reward

    if not rows:
        return
    logits = score_logits(rm, [r["prompt"] for r in rows], [r["response"] for r in rows], max_length,
                          "pseudo-labelling")
    for row, reward, row_logits in zip(rows, expected_reward(logits).tolist(), logits.tolist(), strict=True):
        row["score"], row["logits"] = reward, row_logits
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def _strong_recipe(options: StrongOptions, recipe: ZooRecipe, batch_size: int) -> StrongRecipe:
    """The ``StrongRecipe`` for these options: the zoo recipe's growth schedule, the user's steps and rate."""
    from strata.models.training import TrainConfig
    from strata_tools.rm.recipe import StrongRecipe

    grow_train = recipe.rm_strong_grow_train
    if options.grow_steps is not None:
        grow_train = replace(grow_train, steps=options.grow_steps,
                             warmup_steps=min(grow_train.warmup_steps, options.grow_steps))
    return StrongRecipe(
        train=TrainConfig(steps=options.steps, batch_size=batch_size, lr=options.lr,
                          warmup_steps=min(10, options.steps)),
        max_length=options.max_length, pairwise_weight=options.pairwise_weight,
        # A fresh head on a given checkpoint learns at the schedule's rate; on the zoo's init, at the recipe's.
        head_lr_scale=1.0 if options.init else recipe.rm_strong_head_lr_scale,
        widen=options.widen, grow_layers=options.grow_layers, grow_train=replace(grow_train, batch_size=batch_size),
        seed=options.seed, frozen_layers=options.frozen_layers)


def train_strong(options: StrongOptions, settings: Any, zoo: ZooSource,
                 progress: Callable[[str], None] = print) -> StrongResult:
    """Train, evaluate and finalize a strong RM version (R5); pseudo-label logged rollouts when asked."""
    from strata.models.loading import load_reward_model
    from strata.models.prompts import PromptFormat
    from strata.models.reward import save_rm_tokenizer
    from strata_tools.rm.recipe import STUDENT_INIT_DIR, fit_strong, groups_of, rm_init_dir
    from strata_tools.rm.rows import match_training

    models = None if (options.data and options.init) else zoo.models()
    data_path = options.data or models.rm_data
    rows = read_pairs(Path(data_path), need_score=True)
    # The configured preset's recipe even when its zoo is not needed (--data with --init): a ci-preset
    # run grows and trains on as the ci zoo does.
    recipe = models.config if models is not None else zoo.recipe()
    options = _with_recipe_defaults(options, recipe)
    init = options.init or str(rm_init_dir(models, recipe.rm_strong_init or "level1"))
    # --init-layers defaults to the zoo's rm_strong_init_layers for its own init, all of a given --init.
    model, tokenizer, init_dir = _strong_init(init, options)
    progress(f"strong RM: {len(rows)} labelled pairs from {data_path}; init {init_dir} "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), {options.steps} steps")
    rm_format = PromptFormat.of(tokenizer)
    texts = [rm_format.rm_text(r["prompt"], r["response"]) for r in rows]
    grouped = any("group" in r for r in rows)
    strong_recipe = _strong_recipe(options, recipe, options.groups_per_step if grouped else options.batch_size)
    if options.match_pairs:
        progress(f"  + a match step of {options.match_pairs} prompt swaps (suite train prompts) after each step")

    def aids(grown: bool, seed: int) -> dict[str, Any]:
        if not options.match_pairs:
            return {}
        weight = recipe.rm_strong_grow_feature_weight if grown else recipe.rm_strong_feature_weight
        return match_training(rows, load_suite("train"), options.match_pairs, weight, seed)

    started = time.perf_counter()
    scores = [float(r["score"]) for r in rows]
    staging = Path(settings.cache_dir).expanduser() / "rm" / f".staging-{uuid.uuid4().hex[:8]}"
    if strong_recipe.grows:
        progress(f"  then grown x{options.widen} wide, +{options.grow_layers} blocks, "
                 f"{strong_recipe.grow_train.steps} more steps")
    model, loss, growth = fit_strong(model, tokenizer, texts, scores, groups_of(rows) if grouped else None,
                                     strong_recipe, staging / STUDENT_INIT_DIR, "strong RM", aids)
    model.config.problem_type = "single_label_classification"
    model.save_pretrained(staging)
    save_rm_tokenizer(tokenizer, staging, options.max_length)
    strong = load_reward_model(staging, device=options.device)
    metrics = _oracle_metrics(strong, options.max_length)
    pseudo: list[dict[str, Any]] = []
    if options.pseudo_label:
        pseudo, line = rollout_rows(settings, options.max_rollouts)
        progress(line)
        _pseudo_label(strong, pseudo, options.max_length, staging / PSEUDO_LABELS_FILE)
    info = {"metrics": metrics, **growth, "config": {
        **asdict(options), "final_loss": loss, "init": str(init_dir), "data": str(data_path), "n_pairs": len(rows),
        "n_pseudo_labelled": len(pseudo), "train_seconds": round(time.perf_counter() - started, 1),
        "n_params": strong.n_params}}
    del strong
    entry = finalize_version(staging, [staging], "strong", options.out, settings, info)
    return StrongResult(entry, loss, metrics, len(pseudo))
