"""How a reward model is made: the one recipe the zoo build and ``strata rm`` both run.

- the strong RM (R5): ``StrongRecipe`` (typed: the schedule, the ranking loss's weight, the head's
  rate, the growth) and ``fit_strong``: train on labelled rows, save the model before growth as the
  *student init*, grow it (``strata.models.growth``: the same function at ~4-10x the cost) and train on;
- the light RM (R6): its start, ``student_init_dir`` (the strong RM before growth) and
  ``rm_init_overrides`` (its first N blocks); ``LightRecipe`` (typed: the schedule, the temperature) and
  ``fit_light``, the distillation (its loss and loop are ``strata_tools.rm.distill``);
- scoring pairs in length order (``score_in_length_order``), what every labelling pass uses.

The zoo supplies its task's data (oracle-labelled rows, prompt swaps, feature labels:
``strata_tools.rm.rows``); ``strata rm`` supplies a user's. Nothing here imports the zoo.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import AutoConfig, GPT2ForSequenceClassification, PreTrainedModel, PreTrainedTokenizerBase

from strata.contract.checksums import version_id, weights_checksum
from strata.errors import CliError
from strata.models.growth import deepen, widen, widen_bert
from strata.models.loading import ZOO_INFO_FILE
from strata.models.pretrained import TRUNKS, trunk_dir
from strata.models.reward import reward_logits, save_rm_tokenizer
from strata.models.training import TrainConfig
from strata_tools.rm.distill import DistillConfig, in_length_order, train_light
from strata_tools.rm.models import ZooModels
from strata_tools.rm.train import train_reward_model

# Keyword arguments of ``train_reward_model`` for the feature heads and match steps of one phase
# (``grown``: the phase after growth), drawn with ``seed``; the zoo's come from its task.
TrainingAids = Callable[[bool, int], dict[str, Any]]
# The light RM's distillation schedule (R6): the zoo's default (``ZooConfig.rm_light_train``) and what
# ``strata rm`` distils with when no zoo init names one.
RM_LIGHT_TRAIN = TrainConfig(steps=150, batch_size=32, lr=5e-5, warmup_steps=10)
# What ``strata rm distill`` trains a fresh light RM (no init to start from) with: longer and faster.
FRESH_LIGHT_TRAIN = TrainConfig(steps=700, batch_size=32, lr=3e-3, warmup_steps=40, weight_decay=0.01)


@dataclass(frozen=True)
class StrongRecipe:
    """How the strong RM trains on labelled rows: one schedule, then (``widen`` > 1 or ``grow_layers``)
    growth from its student init and ``grow_train`` more steps at the grown size."""

    train: TrainConfig
    max_length: int
    pairwise_weight: float = 1.0  # in-group Bradley-Terry (grouped rows only)
    head_lr_scale: float = 1.0  # the score head's rate over the trunk's (a fresh head on a pretrained trunk)
    widen: int = 1
    grow_layers: int = 0
    grow_train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=0, batch_size=4, lr=5e-5))
    seed: int = 0
    frozen_layers: int = 0  # the trunk's embeddings and lowest blocks do not train (before growth)

    @property
    def grows(self) -> bool:
        return self.widen > 1 or self.grow_layers > 0

    @classmethod
    def of_zoo(cls, config: Any) -> StrongRecipe:
        """The recipe of a ``ZooConfig`` (its ``rm_strong_*`` fields)."""
        return cls(train=config.rm_strong_train, max_length=config.rm_max_length,
                   pairwise_weight=config.rm_pairwise_weight, head_lr_scale=config.rm_strong_head_lr_scale,
                   widen=config.rm_strong_widen, grow_layers=config.rm_strong_grow_layers,
                   grow_train=config.rm_strong_grow_train, seed=config.seed)


def fit_strong(model: PreTrainedModel, tokenizer: Any, texts: Sequence[str], scores: Sequence[float],
               groups: Sequence[Sequence[int]] | None, recipe: StrongRecipe, student_dir: Path, desc: str,
               aids: TrainingAids | None = None) -> tuple[PreTrainedModel, float, dict[str, Any]]:
    """Train ``model`` on ``texts`` and their ``scores`` (0-5) by ``recipe``; when it grows, save the
    model before growth in ``student_dir`` first. Returns the final model, its loss, and what the strong
    RM records about its growth (``student_init``, ``grown_from``, ``loss_before_growth``)."""
    def extra(grown: bool, seed: int) -> dict[str, Any]:
        return aids(grown, seed) if aids is not None else {}

    loss = train_reward_model(model, tokenizer, texts, scores, recipe.max_length, recipe.train, recipe.seed, desc,
                              groups=groups, pairwise_weight=recipe.pairwise_weight,
                              head_lr_scale=recipe.head_lr_scale, frozen_layers=recipe.frozen_layers,
                              **extra(False, recipe.seed))
    info: dict[str, Any] = {}
    if not recipe.grows:
        return model, loss, info
    model, info = grow_from_student_init(model, tokenizer, student_dir, recipe.max_length, recipe.widen,
                                         recipe.grow_layers, recipe.seed + 2)
    info["loss_before_growth"] = loss
    if recipe.grow_train.steps:  # 0: the grown RM is the trained one, grown (the same function)
        size = f"{model.config.num_hidden_layers} x {model.config.hidden_size}"
        loss = train_reward_model(model, tokenizer, texts, scores, recipe.max_length, recipe.grow_train,
                                  recipe.seed + 1, f"{desc} (grown to {size})", groups=groups,
                                  pairwise_weight=recipe.pairwise_weight, head_lr_scale=recipe.head_lr_scale,
                                  **extra(True, recipe.seed + 1))
    return model, loss, info


@dataclass(frozen=True)
class LightRecipe:
    """How the light RM is distilled from the strong RM's bin logits: one schedule, fitting
    softmax(logits / ``temperature``) by KL on ``max_length`` tokens of each RM input."""

    train: TrainConfig
    max_length: int
    temperature: float = 2.0  # the distillation's T (not svc_reward's scoring temperature)
    seed: int = 0

    @classmethod
    def of_zoo(cls, config: Any) -> LightRecipe:
        """The recipe of a ``ZooConfig`` (its ``rm_light_*`` fields)."""
        return cls(train=config.rm_light_train, max_length=config.rm_max_length,
                   temperature=config.rm_light_temperature, seed=config.seed)

    def distill_config(self) -> DistillConfig:
        """The distillation loop's settings: all of the schedule, the temperature, the length, the seed."""
        train = self.train
        return DistillConfig(steps=train.steps, batch_size=train.batch_size, lr=train.lr,
                             warmup_steps=train.warmup_steps, weight_decay=train.weight_decay,
                             grad_clip=train.grad_clip, temperature=self.temperature, max_length=self.max_length,
                             seed=self.seed)


def fit_light(student: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
              teacher_logits: torch.Tensor, recipe: LightRecipe, desc: str, progress: bool = True) -> float:
    """Fit ``student`` (a sequence classifier over the teacher's bins) to ``teacher_logits`` (N, bins) of
    ``texts`` (RM inputs) by ``recipe``, behind a progress bar with the KL every 20 steps. Returns the
    final loss (an exponential moving average of T^2 x KL)."""
    distill = recipe.distill_config()
    with tqdm(total=distill.steps, desc=desc, unit="step", leave=False, disable=not progress) as bar:
        def report(step: int, kl: float) -> None:
            bar.update(1)
            if step % 20 == 0:
                bar.set_postfix(kl=f"{kl:.4f}", refresh=False)

        return train_light(student, tokenizer, texts, teacher_logits, distill, report)


STUDENT_INIT_DIR = "student_init"


def grow_from_student_init(model: PreTrainedModel, tokenizer: Any, student_dir: Path, max_length: int, widen_by: int,
                           extra_layers: int, seed: int) -> tuple[PreTrainedModel, dict[str, Any]]:
    """Save ``model`` (with its tokenizer, reading ``max_length`` tokens) as the student init in
    ``student_dir``, then grow it: ``widen_by`` times every width, ``extra_layers`` more blocks, the
    same function. Returns the grown model and what the strong RM records about it (``student_init``
    relative to its own directory, ``grown_from``); the zoo's build and ``strata rm train-strong`` share it."""
    model.config.problem_type = "single_label_classification"
    model.save_pretrained(student_dir)
    save_rm_tokenizer(tokenizer, student_dir, max_length)
    info = {"student_init": student_dir.name,
            "grown_from": {"n_embd": model.config.hidden_size, "n_layer": model.config.num_hidden_layers,
                           "n_params": sum(p.numel() for p in model.parameters())}}
    if widen_by > 1:
        model = widen_bert(model, widen_by, seed) if model.config.model_type == "bert" else widen(model, widen_by, seed)
    if extra_layers:
        if not isinstance(model, GPT2ForSequenceClassification):
            raise ValueError(f"only a GPT-2 RM deepens (identity blocks); {model.config.model_type} widens only")
        model = deepen(model, extra_layers, seed + 1)
    return model, info


def student_init_dir(strong_dir: Path) -> Path | None:
    """Where a strong RM keeps the model a light RM distilled from it starts from, if it has one: the
    ``student_init`` of its ``strata_zoo.json`` or ``strata_rm.json`` (relative to it)."""
    for name in (ZOO_INFO_FILE, "strata_rm.json"):
        info_file = Path(strong_dir) / name
        relative = json.loads(info_file.read_text()).get("student_init") if info_file.is_file() else None
        if relative and (Path(strong_dir) / relative / "config.json").is_file():
            return Path(strong_dir) / relative
    return None


def teacher_version(strong_dir: Path) -> str:
    """The registry version of a strong RM directory (``strong-<checksum>``), as a light RM records it."""
    return version_id("strong", weights_checksum([strong_dir]))


def score_in_length_order(rm: Any, prompts: Sequence[str], responses: Sequence[str], max_length: int,
                          desc: str, batch_size: int = 32, progress: bool = True) -> torch.Tensor:
    """An RM's bin logits (N, bins) for the pairs, scored in length order (little padding) behind a
    progress bar, returned in the pairs' order: the strong RM labelling the light RM's pairs here, and
    every scoring pass of ``strata rm`` (``strata_tools.rm.lifecycle.score_logits`` adds a disk cache)."""
    with tqdm(total=len(prompts), desc=desc, unit="pair", leave=False, disable=not progress) as bar:
        return in_length_order(lambda p, r: reward_logits(rm, p, r, batch_size, max_length), prompts, responses,
                               chunk=256, on_chunk=bar.update)


def rm_init_dir(zoo: ZooModels, init: str) -> Path:
    """Where the strong RM of ``zoo``'s recipe starts: a zoo LM's directory, or a pretrained trunk's."""
    return trunk_dir(init) if init in TRUNKS else Path(getattr(zoo, init))


def rm_init_overrides(init_layers: int) -> dict[str, int]:
    """``from_pretrained`` config overrides that keep an init model's first ``init_layers`` blocks (0: all);
    ``num_hidden_layers`` is every architecture's name for it (GPT-2 maps it to ``n_layer``)."""
    return {"num_hidden_layers": init_layers} if init_layers else {}


def check_init_layers(init_dir: str | Path, init_layers: int) -> None:
    """CliError when ``init_layers`` asks for more blocks than the checkpoint at ``init_dir`` has: the
    ``rm_init_overrides`` of such a count would start the extra blocks at random."""
    if not init_layers:
        return  # every block: nothing to read
    depth = getattr(AutoConfig.from_pretrained(init_dir, local_files_only=True), "num_hidden_layers", None)
    if isinstance(depth, int) and init_layers > depth:
        raise CliError(f"--init-layers {init_layers} exceeds the {depth} blocks of {init_dir}")


def groups_of(rows: list[dict[str, Any]]) -> list[list[int]]:
    """Row indices grouped by their ``group`` field (rows without one are groups of their own)."""
    groups: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.get("group", f"row-{i}"), []).append(i)
    return list(groups.values())
