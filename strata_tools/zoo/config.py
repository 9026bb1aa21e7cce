"""What a zoo build is made of: ``ZooConfig`` (every size, step count and seed; its hash names the zoo),
its default shapes and schedules, the ``default`` and ``ci`` presets, and the stage keys (``stage_key``:
what each stage reads) under which ``strata_tools.zoo.build`` reuses a stage across zoos."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from strata.contract.template import RM_MAX_LENGTH
from strata.models.pretrained import TRUNKS
from strata.models.training import ModelShape, TrainConfig
from strata_tools.rm.recipe import RM_LIGHT_TRAIN

# Bump when a code change alters what a given config builds; it is part of the cache key.
# 3: torch is seeded at the start of every stage (a stage no longer depends on which stages ran before it).
# 4: the sealed test split took one subject per topic out of train (strata_tools.task.suite).
ZOO_FORMAT_VERSION = "4"
ROLES: tuple[str, ...] = ("tokenizer", "probe", "level1", "level2", "rm_data", "rm_strong", "rm_light")
# What each stage reads: the ZooConfig fields and the earlier stages whose output it uses (an RM also
# uses the LM named by its ``*_init`` field). Every stage reads ``seed``. Keep in step with the stages.
STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "tokenizer": ("vocab_size", "lm_responses_per_prompt"),
    "probe": ("probe", "probe_train", "probe_block_size", "n_positions"),
    "level1": ("level1", "level1_train", "block_size", "n_positions", "lm_responses_per_prompt"),
    "level2": ("level2", "level2_train", "level2_grow_layers", "level2_grow_train", "block_size", "n_positions",
               "lm_responses_per_prompt"),
    "rm_data": ("rm_group_size", "rm_model_samples", "rm_perturbed_samples", "sample_max_new_tokens"),
    "rm_strong": ("rm_strong_init", "rm_strong", "rm_strong_init_layers", "rm_strong_train", "rm_n_bins",
                  "rm_max_length", "rm_pairwise_weight", "n_positions", "rm_strong_match_pairs",
                  "rm_strong_feature_weight", "rm_strong_widen", "rm_strong_grow_layers", "rm_strong_grow_train",
                  "rm_strong_grow_feature_weight", "rm_strong_head_lr_scale"),
    "rm_light": ("rm_light_train", "rm_light_distill_pairs", "rm_light_distill_swaps", "rm_light_temperature",
                 "rm_max_length", "rm_light_layers"),
}
STAGE_UPSTREAM: dict[str, tuple[str, ...]] = {
    "tokenizer": (), "probe": ("tokenizer",), "level1": ("tokenizer",), "level2": ("tokenizer",),
    "rm_data": ("level1", "level2"), "rm_strong": ("rm_data",),
    "rm_light": ("rm_data", "rm_strong"),
}


def stage_key(config: dict[str, Any], role: str) -> str:
    """Cache key of one stage, from a zoo config as ``asdict`` gives it (as recorded in ``strata_zoo.json``)."""
    upstream = list(STAGE_UPSTREAM[role])
    init = config.get(f"{role}_init") if role.startswith("rm_") else None
    if init in STAGE_UPSTREAM:  # a zoo LM; a pretrained trunk (``PRETRAINED_INITS``) is named in the fields
        upstream.append(init)
    payload = {
        "format": ZOO_FORMAT_VERSION,
        "role": role,
        "fields": {name: config[name] for name in ("seed", *STAGE_FIELDS[role])},
        "upstream": {name: stage_key(config, name) for name in upstream},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


# RM trunks that come pretrained from a PyPI wheel (``strata.models.pretrained``), with their depth.
PRETRAINED_INITS: dict[str, int] = {name: trunk.layers for name, trunk in TRUNKS.items()}  # name -> depth

# Default shapes and schedules (frozen dataclasses, shared safely as defaults).
PROBE_SHAPE = ModelShape(n_embd=128, n_layer=4, n_head=4)  # ~1M parameters
PROBE_TRAIN = TrainConfig(steps=120, batch_size=32, lr=3e-3, warmup_steps=10)
LEVEL1_SHAPE = ModelShape(n_embd=256, n_layer=6, n_head=4)  # ~5M: Level-1 and the PPO policy
LEVEL1_TRAIN = TrainConfig(steps=80, batch_size=16, lr=2e-3)
LEVEL2_SHAPE = ModelShape(n_embd=384, n_layer=6, n_head=6)  # ~12M: Level-2 before it grows
LEVEL2_TRAIN = TrainConfig(steps=120, batch_size=16, lr=1.5e-3)
LEVEL2_GROW_LAYERS = 10  # then deepened to 16 x 384, ~29M, and trained on (``train.deepen``)
LEVEL2_GROW_TRAIN = TrainConfig(steps=32, batch_size=16, lr=1e-3, warmup_steps=5)
# The strong RM: a cross-encoder on all-MiniLM-L6-v2 (pretrained on English; the zoo's own LMs read only
# the zoo's task, and RMs built on them ranked Level-1's answers at Spearman 0.20, docs/reward-models.md),
# 1 200 grouped steps at lr 5e-5 with its fresh score head at 20x (docs/model-zoo.md; still learning at
# 800: docs/reward-models.md).
RM_STRONG_TRAIN = TrainConfig(steps=1200, batch_size=4, lr=5e-5, warmup_steps=40)
RM_STRONG_HEAD_LR_SCALE = 20.0
# Then it widens 2x (``train.widen_bert``, the same function in a 6 x 768 model, ~67M) so that it costs
# more than the light RM: ~4x MiniLM per token (3.6x measured). No steps after growth.
RM_STRONG_WIDEN = 2
RM_STRONG_GROW_TRAIN = TrainConfig(steps=0, batch_size=4, lr=5e-5, warmup_steps=0)
# The light RM: the strong RM before growth (6 x 384), fitted gently by KL to the widened strong RM's bin
# distributions on RM pairs and prompt swaps it labels (R6). Its first two blocks, distilled 600 steps
# at 1e-3, copied the strong RM at 0.78 and ranked Level-1's answers at 0.21 (the strong RM: 0.53);
# docs/model-zoo.md. A light RM that reads is worth more than a fast blind one; the ratio is ~4x.
# Its schedule, RM_LIGHT_TRAIN, is the RM recipe's (strata_tools.rm.recipe): ``strata rm`` uses it without a zoo.
RM_LIGHT_LAYERS = 0


@dataclass(frozen=True)
class ZooConfig:
    """Every size, step count and seed of a zoo build (its hash names the cache directory)."""

    preset: str = "default"
    seed: int = 0
    vocab_size: int = 2048
    n_positions: int = 256  # longest prompt + response a zoo LM handles
    block_size: int = 128  # pretraining window (a prompt and its response fit in ~90 tokens)
    lm_responses_per_prompt: int = 3  # reference responses per train prompt in the LM corpus
    probe: ModelShape = PROBE_SHAPE
    probe_train: TrainConfig = PROBE_TRAIN
    probe_block_size: int = 64
    level1: ModelShape = LEVEL1_SHAPE
    level1_train: TrainConfig = LEVEL1_TRAIN
    level2: ModelShape = LEVEL2_SHAPE
    level2_train: TrainConfig = LEVEL2_TRAIN
    # Level-2 is trained at the ``level2`` shape, then grows this many identity-initialised blocks
    # and trains on (0: no growth): a ~30M model that starts where the 12M one ended, which two CPU
    # cores could not train from scratch in the build budget.
    level2_grow_layers: int = LEVEL2_GROW_LAYERS
    level2_grow_train: TrainConfig = LEVEL2_GROW_TRAIN
    rm_group_size: int = 4  # per train prompt: a reference and this many minus one degradations of it
    rm_model_samples: int = 600  # responses sampled from each of Level-1 and Level-2 for RM data (on-policy)
    # Each of those samples also joins its group as a near miss (the article's §5.1): its words swapped or
    # its sentences reordered, re-scored by the oracle. The best source of label per label measured
    # (`strata rm sources`: +0.038 Level-1 Spearman on the default zoo, +0.058 on the ci zoo).
    rm_perturbed_samples: bool = True
    rm_pairwise_weight: float = 1.0  # weight of the in-group ranking loss (0: scores only)
    rm_n_bins: int = 11  # RM logits over 0, 0.5, ..., 5; reward = expected value
    # RM input tokens, saved as the tokenizer's model_max_length (serving truncates alike). All of nearly
    # every answer: at 128, a third of the repeated and most of the too-long answers were cut before
    # what the oracle punishes in them.
    rm_max_length: int = RM_MAX_LENGTH
    # RM backbone: a pretrained trunk (``PRETRAINED_INITS``: "minilm"), a zoo LM ("probe", "level1",
    # "level2"; the probe reads the prompt's intent, one side of the prompt-answer match) or "" (scratch).
    rm_strong_init: str = "minilm"
    rm_strong: ModelShape = LEVEL1_SHAPE  # used only when rm_strong_init is "" (else the init LM's)
    # The strong RM reads with the init LM's first blocks only (0: all): fine-tuning all of the grown
    # Level-2 (29M) would take the RM stage past the build budget.
    rm_strong_init_layers: int = 0
    rm_strong_train: TrainConfig = RM_STRONG_TRAIN
    # Match steps (train_reward_model): pairs of one reference answer under its own and another train
    # prompt per step, with an optimiser of their own (0: none); and the weight of the feature heads
    # (prompt and answer intent, topic and subject) on both kinds of step.
    rm_strong_match_pairs: int = 0
    rm_strong_feature_weight: float = 0.0
    # After those steps the strong RM grows: every width times ``rm_strong_widen`` (1: none) and
    # ``rm_strong_grow_layers`` more blocks (0: none), then ``rm_strong_grow_train`` steps of the same
    # recipe at that size. The model before growth is saved as its student init (``STUDENT_INIT_DIR``).
    rm_strong_widen: int = RM_STRONG_WIDEN
    rm_strong_grow_layers: int = 0
    rm_strong_grow_train: TrainConfig = RM_STRONG_GROW_TRAIN
    rm_strong_grow_feature_weight: float = 0.0  # feature heads after growth (they start fresh: 0, none)
    # The score head's learning rate over the trunk's (a pretrained trunk wants ~5e-5, its fresh head ~1e-3).
    rm_strong_head_lr_scale: float = RM_STRONG_HEAD_LR_SCALE
    # The light RM is distilled from the strong RM (R6): it starts from the strong RM's student init and
    # fits, by KL at ``rm_light_temperature``, the strong RM's bin distributions on this many RM pairs
    # (sampled) and this many prompt swaps of train prompts (a reference answer under its own prompt and
    # under another: what carries the prompt match).
    rm_light_train: TrainConfig = RM_LIGHT_TRAIN
    rm_light_distill_pairs: int = 2000
    rm_light_distill_swaps: int = 500
    rm_light_temperature: float = 2.0
    # The light RM's start: the strong RM before growth (or itself, when it did not grow); N > 0 keeps
    # only its first N blocks, with its embeddings and head (0: all of them).
    rm_light_layers: int = RM_LIGHT_LAYERS
    sample_max_new_tokens: int = 80

    def __post_init__(self) -> None:
        # Checked here, not minutes into a build: both would fail (or silently train random blocks) late.
        if self.rm_max_length > self.n_positions:
            raise ValueError(f"rm_max_length ({self.rm_max_length}) exceeds n_positions ({self.n_positions}): "
                             "the RMs have no position embeddings past n_positions")
        init_depths = {"probe": self.probe.n_layer, "level1": self.level1.n_layer,
                       "level2": self.level2.n_layer + self.level2_grow_layers, **PRETRAINED_INITS}
        init, layers = self.rm_strong_init, self.rm_strong_init_layers
        if init and init not in init_depths:
            raise ValueError(f"rm_strong_init must be one of {', '.join(init_depths)} or '' (scratch), got {init!r}")
        if init and layers > init_depths[init]:
            raise ValueError(f"rm_strong_init_layers ({layers}) exceeds the {init} LM's {init_depths[init]} layers")
        if self.rm_strong_widen < 1 or self.rm_strong_grow_layers < 0:
            raise ValueError(f"rm_strong_widen must be >= 1 and rm_strong_grow_layers >= 0, got "
                             f"{self.rm_strong_widen} and {self.rm_strong_grow_layers}")
        grows = self.rm_strong_widen > 1 or self.rm_strong_grow_layers > 0
        if init in PRETRAINED_INITS and self.rm_strong_grow_layers:
            raise ValueError(f"a pretrained trunk ({init}) widens but does not deepen (identity blocks are "
                             "GPT-2's): set rm_strong_grow_layers=0")
        strong_depth = (layers or init_depths[init]) if init else self.rm_strong.n_layer
        if self.rm_light_layers < 0 or (self.rm_light_layers and self.rm_light_layers >= strong_depth):
            raise ValueError(f"rm_light_layers must be 0 or fewer than the strong RM's {strong_depth} blocks, got "
                             f"{self.rm_light_layers}")
        if self.rm_light_layers == 0 and not grows:
            # The light RM starts from the strong RM's trunk before growth: without growth there is none
            # (and a light RM as costly as its teacher saves nothing).
            raise ValueError("the strong RM must grow (rm_strong_widen > 1 or rm_strong_grow_layers > 0), or the "
                             "light RM start from its first blocks (rm_light_layers > 0)")

    def config_hash(self) -> str:
        payload = json.dumps({"format": ZOO_FORMAT_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _ci_preset() -> ZooConfig:
    """Small and fast (a few minutes on 2 cores): for plumbing tests, not for quality claims."""
    small = ModelShape(n_embd=64, n_layer=2, n_head=2)
    return ZooConfig(
        preset="ci",
        vocab_size=1024,
        lm_responses_per_prompt=1,
        probe=small,
        # The probe must clear min_confidence on its top direction, or every prompt goes to Level-2.
        probe_train=TrainConfig(steps=300, batch_size=32, lr=3e-3, warmup_steps=5),
        level1=ModelShape(n_embd=96, n_layer=2, n_head=2),
        # Enough steps to write language-like text: the PPO tests need a policy whose reward can move.
        level1_train=TrainConfig(steps=200, batch_size=16, lr=3e-3, warmup_steps=5),
        level2=ModelShape(n_embd=128, n_layer=3, n_head=4),
        level2_train=TrainConfig(steps=240, batch_size=16, lr=3e-3, warmup_steps=5),
        level2_grow_layers=0,
        # On-policy samples are what the PPO tests' light RM scores: many of them (tiny models sample fast).
        rm_model_samples=300,
        # A GPT-2 RM on Level-1's trunk: a pretrained one trains ~1 s a step here, past this preset's budget.
        rm_strong_init="level1",
        rm_strong_init_layers=0,
        rm_strong_head_lr_scale=1.0,
        rm_strong=ModelShape(n_embd=96, n_layer=2, n_head=2),
        rm_strong_train=TrainConfig(steps=150, batch_size=4, lr=1e-3, warmup_steps=5),
        rm_strong_match_pairs=0,  # plumbing: the match steps are tested on their own and in the micro build
        rm_strong_feature_weight=0.0,
        rm_strong_widen=2,
        rm_strong_grow_layers=1,
        rm_strong_grow_train=TrainConfig(steps=20, batch_size=4, lr=2e-4, warmup_steps=2),
        rm_light_layers=0,  # the light RM is the strong RM's trunk before growth
        rm_light_train=TrainConfig(steps=150, batch_size=32, lr=5e-4, warmup_steps=10),
        rm_light_distill_pairs=600,
        rm_light_distill_swaps=150,
        sample_max_new_tokens=48,
    )


PRESETS: dict[str, Callable[[], ZooConfig]] = {"default": ZooConfig, "ci": _ci_preset}


def with_overrides(config: ZooConfig, **changes: Any) -> ZooConfig:
    """A copy of ``config`` with some fields changed (for tests and experiments)."""
    return replace(config, **changes)
