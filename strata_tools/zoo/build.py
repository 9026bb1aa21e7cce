"""Build the model zoo: tokenizer, probe, Level-1/policy and Level-2 LMs, strong and light RMs.

Everything is trained here, offline, from the prompt suite (``strata_tools.zoo.suite``) and corpora
generated from it (``strata_tools.zoo.corpus``); nothing is downloaded. The result lives under
``<cache_dir>/zoo/<config-hash>/``, one ``save_pretrained`` directory per model with its tokenizer
and a ``strata_zoo.json`` (role, resolved config, losses, timings), so every model loads with the
same ``from_pretrained`` calls as a user's checkpoint (``strata.models.loading``).

Stages are built in order and each is reused when present, so an interrupted build resumes and a
second build (or a fresh clone on the same machine) costs nothing. A stage missing from this zoo is
also copied from another zoo in the same cache whose stage has the same key (``stage_key``: the
config fields the stage reads and the keys of the stages it builds on), so a changed RM recipe
retrains the RMs, not the LMs. ``ensure_zoo(settings)`` is the entry point for code and tests;
``strata models build`` is the one for people.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import Field
from tqdm import tqdm
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from strata.config import StrataSettings
from strata.contract.directions import DIRECTION_NAMES
from strata.contract.models import write_manifest
from strata.contract.template import RM_MAX_LENGTH, format_rm_input
from strata.models.generation import SamplingConfig, generate
from strata.models.growth import deepen
from strata.models.loading import ZOO_INFO_FILE, load_causal_lm, load_reward_model
from strata.models.pretrained import TRUNKS, trunk_dir
from strata.models.reward import save_rm_tokenizer
from strata.models.training import ModelShape, TrainConfig
from strata_tools.rm.augment import perturb_each
from strata_tools.rm.recipe import (
    STUDENT_INIT_DIR,
    StrongRecipe,
    fit_strong,
    groups_of,
    rm_init_overrides,
    score_in_length_order,
    student_init_dir,
    teacher_version,
)
from strata_tools.rm.train import FeatureLabels, MatchPool, new_reward_model
from strata_tools.zoo import corpus
from strata_tools.zoo.lexicon import TOPICS
from strata_tools.zoo.oracle import SUBJECT_NAMES, answer_features, oracle_score
from strata_tools.zoo.seal import check_sealed
from strata_tools.zoo.suite import PromptRecord, load_suite
from strata_tools.zoo.train import new_causal_lm, pack_texts, train_causal_lm, train_tokenizer

logger = logging.getLogger(__name__)

# Bump when a code change alters what a given config builds; it is part of the cache key.
# 3: torch is seeded at the start of every stage (a stage no longer depends on which stages ran before it).
# 4: the sealed test split took one subject per topic out of train (strata_tools.zoo.suite).
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
RM_LIGHT_LAYERS = 0
RM_LIGHT_TRAIN = TrainConfig(steps=150, batch_size=32, lr=5e-5, warmup_steps=10)


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


class ZooSettings(StrataSettings):
    """Which zoo to build and where: ``STRATA_ZOO_PRESET`` (default|ci), ``STRATA_CACHE_DIR``."""

    zoo_threads: int = Field(0, ge=0, description="torch CPU threads for the build; 0 = all cores")


def resolve_config(settings: ZooSettings) -> ZooConfig:
    if settings.zoo_preset not in PRESETS:
        raise ValueError(f"unknown zoo preset {settings.zoo_preset!r}; known: {', '.join(PRESETS)}")
    return PRESETS[settings.zoo_preset]()


@dataclass(frozen=True)
class ZooPaths:
    """Where a built zoo's models are; each is a ``from_pretrained`` directory."""

    root: Path
    tokenizer: Path
    probe: Path
    level1: Path
    level2: Path
    rm_data: Path  # oracle-labelled (prompt, response) pairs used to train the RMs (JSONL)
    rm_strong: Path
    rm_light: Path
    config: ZooConfig = field(default_factory=ZooConfig)

    @property
    def policy(self) -> Path:
        """The PPO policy starts as the Level-1 generator."""
        return self.level1

    @property
    def strong_rm(self) -> Path:  # the name the reward service's settings use
        return self.rm_strong

    @property
    def light_rm(self) -> Path:
        return self.rm_light

    @classmethod
    def under(cls, root: Path, config: ZooConfig) -> ZooPaths:
        return cls(root, *(root / role for role in ROLES[:4]), root / "rm_data" / "pairs.jsonl",
                   root / "rm_strong", root / "rm_light", config)

    def is_complete(self) -> bool:
        return (self.root / "manifest.json").is_file()


def zoo_root(settings: ZooSettings, config: ZooConfig) -> Path:
    return Path(settings.cache_dir).expanduser() / "zoo" / config.config_hash()


def as_zoo_settings(settings: StrataSettings | None = None) -> ZooSettings:
    """``ZooSettings`` for any Strata settings object: its cache dir and zoo preset."""
    if isinstance(settings, ZooSettings):
        return settings
    if settings is None:
        return ZooSettings()
    return ZooSettings(cache_dir=settings.cache_dir, zoo_preset=settings.zoo_preset)


def zoo_paths(settings: StrataSettings | None = None) -> ZooPaths:
    """Paths of the zoo for ``settings`` (built or not)."""
    zoo_settings = as_zoo_settings(settings)
    config = resolve_config(zoo_settings)
    return ZooPaths.under(zoo_root(zoo_settings, config), config)


def ensure_zoo(settings: StrataSettings | None = None, *, force: bool = False, progress: bool = True) -> ZooPaths:
    """Build the zoo if it is not in the cache yet (or ``force``), and return its paths.

    Any service's settings object works (only ``cache_dir`` is read from it); the preset comes from
    ``STRATA_ZOO_PRESET`` unless ``settings`` is a ``ZooSettings``.
    """
    zoo_settings = as_zoo_settings(settings)
    paths = zoo_paths(zoo_settings)
    if paths.is_complete() and not force:
        logger.info("zoo %s (%s) already built at %s", paths.config.config_hash(), paths.config.preset, paths.root)
    else:
        if force and paths.root.exists():
            shutil.rmtree(paths.root)
        ZooBuilder(paths, zoo_settings.zoo_threads, progress, reuse_other_zoos=not force).build()
    # Services find a built zoo through this manifest (strata.contract.models); they never build one.
    write_manifest(zoo_settings.cache_dir, paths.config.preset, paths.config.config_hash(), {
        "probe": paths.probe, "level1": paths.level1, "level2": paths.level2,
        "rm_light": paths.rm_light, "rm_strong": paths.rm_strong,
    })
    return paths


class ZooBuilder:
    """Runs the build stages in order; each stage writes to a temporary directory and renames it."""

    def __init__(self, paths: ZooPaths, threads: int = 0, progress: bool = True, reuse_other_zoos: bool = True) -> None:
        self.paths = paths
        self.cfg = paths.config
        self.threads = threads or os.cpu_count() or 1
        self.progress = progress
        self.reuse_other_zoos = reuse_other_zoos
        self.timings: dict[str, float] = {}  # stages built by this run (not reused)
        self.copied: dict[str, Path] = {}  # stages copied from another zoo: role -> that stage's directory

    def build(self) -> None:
        torch.set_num_threads(self.threads)
        self.paths.root.mkdir(parents=True, exist_ok=True)
        logger.info("building zoo %s (preset %s) in %s", self.cfg.config_hash(), self.cfg.preset, self.paths.root)
        self.train_records = load_suite("train")
        check_sealed((r.text for r in self.train_records), "the zoo's training prompts")
        stages: list[tuple[str, Path, Callable[[Path], dict[str, Any]]]] = [
            ("tokenizer", self.paths.tokenizer, self._tokenizer),
            ("probe", self.paths.probe, self._probe),
            ("level1", self.paths.level1, lambda out: self._lm(out, "level1", self.cfg.level1, self.cfg.level1_train)),
            ("level2", self.paths.level2, lambda out: self._lm(
                out, "level2", self.cfg.level2, self.cfg.level2_train, self.cfg.level2_grow_layers,
                self.cfg.level2_grow_train)),
            ("rm_data", self.paths.rm_data.parent, self._rm_data),
            ("rm_strong", self.paths.rm_strong, self._rm_strong),
            ("rm_light", self.paths.rm_light, self._rm_light),
        ]
        started = time.perf_counter()
        bar = tqdm(stages, desc="strata zoo", unit="stage", disable=not self.progress)
        for role, out, run in bar:
            bar.set_postfix(stage=role)
            if (out / ZOO_INFO_FILE).is_file():
                logger.info("zoo stage %s: reusing %s", role, out)
                continue
            t0 = time.perf_counter()
            tmp = out.with_name(out.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            key = stage_key(asdict(self.cfg), role)
            source = self._same_stage_elsewhere(role, key) if self.reuse_other_zoos else None
            if source is not None:
                shutil.copytree(source, tmp)
                info = {**json.loads((source / ZOO_INFO_FILE).read_text()), "copied_from": str(source)}
                self.copied[role] = source
                logger.info("zoo stage %s: copied from %s (same stage key %s)", role, source, key)
            else:
                tmp.mkdir(parents=True)
                torch.manual_seed(self.cfg.seed)  # a stage's result depends on its key alone, not on what ran before it
                info = run(tmp)
                self.timings[role] = time.perf_counter() - t0
                info = {**info, "build_seconds": round(self.timings[role], 2)}
            info = {**info, "role": role, "config_hash": self.cfg.config_hash(), "config": asdict(self.cfg),
                    "stage_key": key}
            (tmp / ZOO_INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            if role in self.timings:
                logger.info("zoo stage %s done in %.1fs", role, self.timings[role])
        manifest = {
            "config_hash": self.cfg.config_hash(),
            "config": asdict(self.cfg),
            "format": ZOO_FORMAT_VERSION,
            "stage_seconds": {k: round(v, 2) for k, v in self.timings.items()},
            "stages_copied_from": {k: str(v) for k, v in self.copied.items()},
            "build_seconds": round(time.perf_counter() - started, 2),
        }
        (self.paths.root / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))

    def _same_stage_elsewhere(self, role: str, key: str) -> Path | None:
        """A finished ``role`` stage with stage key ``key`` in another zoo of the same cache, if any."""
        for info_file in sorted(self.paths.root.parent.glob(f"*/{role}/{ZOO_INFO_FILE}")):
            stage_dir = info_file.parent
            if stage_dir.parent == self.paths.root:
                continue
            try:
                info = json.loads(info_file.read_text())
            except (OSError, ValueError):
                continue  # unreadable: not a stage to trust
            if info.get("stage_key") == key:
                return stage_dir
        return None

    # --- stages ------------------------------------------------------------------------------------

    def _tokenizer_texts(self) -> list[str]:
        return corpus.lm_texts(self.train_records, self.cfg.lm_responses_per_prompt, self.cfg.seed)

    def _load_tokenizer(self) -> PreTrainedTokenizerFast:
        return AutoTokenizer.from_pretrained(self.paths.tokenizer, local_files_only=True)

    def _tokenizer(self, out: Path) -> dict[str, Any]:
        texts = self._tokenizer_texts() + corpus.probe_texts(self.train_records, self.cfg.seed)
        tokenizer = train_tokenizer(texts, self.cfg.vocab_size)
        tokenizer.save_pretrained(out)
        return {"vocab_size": len(tokenizer), "n_texts": len(texts)}

    def _save_lm(self, model: PreTrainedModel, out: Path, model_max_length: int | None = None,
                 tokenizer: PreTrainedTokenizerBase | None = None) -> int:
        """Save ``model`` with ``tokenizer`` (default: the zoo's); an RM's reads ``model_max_length`` tokens."""
        model.save_pretrained(out)
        tokenizer = tokenizer or self._load_tokenizer()
        if model_max_length is None:
            tokenizer.save_pretrained(out)
        else:
            save_rm_tokenizer(tokenizer, out, model_max_length)  # what the RM was trained to read
        return sum(p.numel() for p in model.parameters())

    def _probe(self, out: Path) -> dict[str, Any]:
        tokenizer = self._load_tokenizer()
        stream = pack_texts(tokenizer, corpus.probe_texts(self.train_records, self.cfg.seed))
        model = new_causal_lm(tokenizer, self.cfg.probe, self.cfg.n_positions, self.cfg.seed)
        loss = train_causal_lm(model, stream, self.cfg.probe_block_size, self.cfg.probe_train, self.cfg.seed, "probe")
        return {"n_params": self._save_lm(model, out), "final_loss": loss, "train_tokens": len(stream)}

    def _lm(self, out: Path, role: str, shape: ModelShape, train: TrainConfig, grow_layers: int = 0,
            grow_train: TrainConfig | None = None) -> dict[str, Any]:
        """A causal LM of ``shape`` trained on the LM corpus; with ``grow_layers``, then deepened by that
        many blocks and trained on for ``grow_train``."""
        tokenizer = self._load_tokenizer()
        stream = pack_texts(tokenizer, self._tokenizer_texts())
        model = new_causal_lm(tokenizer, shape, self.cfg.n_positions, self.cfg.seed)
        loss = train_causal_lm(model, stream, self.cfg.block_size, train, self.cfg.seed, role)
        info: dict[str, Any] = {"train_tokens": len(stream)}
        if grow_layers:
            assert grow_train is not None, "growing needs its training schedule"
            info |= {"grown_from": asdict(shape), "loss_before_growth": loss}
            model = deepen(model, grow_layers, self.cfg.seed + 1)
            loss = train_causal_lm(model, stream, self.cfg.block_size, grow_train, self.cfg.seed + 1,
                                   f"{role} (grown to {model.config.n_layer} layers)")
        return {"n_params": self._save_lm(model, out), "final_loss": loss, **info}

    def _rm_data(self, out: Path) -> dict[str, Any]:
        """Oracle-labelled answers in groups (one per train prompt): a reference and degradations of it,
        plus, for some prompts, a Level-1 and a Level-2 sample and a perturbed copy of each joining that
        prompt's group."""
        groups = corpus.rm_groups(self.train_records, self.cfg.rm_group_size, self.cfg.seed)
        rows = [_pair_row(p.record, p.response, p.kind, g) for g, group in enumerate(groups) for p in group]
        group_of = {group[0].record.id: g for g, group in enumerate(groups)}
        rng = random.Random(self.cfg.seed + 1)
        for role, path in (("level1", self.paths.level1), ("level2", self.paths.level2)):
            records = rng.sample(self.train_records, self.cfg.rm_model_samples)
            lm = load_causal_lm(path, device="cpu")
            directions = [corpus.sample_directions(r, rng) for r in records]
            sampling = SamplingConfig(max_new_tokens=self.cfg.sample_max_new_tokens, seed=self.cfg.seed)
            generations = generate(lm, [r.text for r in records], directions, sampling)
            samples = [_pair_row(r, g.text, f"sample:{role}", group_of[r.id])
                       for r, g in zip(records, generations, strict=True)]
            rows += samples
            if self.cfg.rm_perturbed_samples:
                rows += near_miss_rows(samples, {r.id: r for r in records}, self.cfg.seed + 2)
        with (out / self.paths.rm_data.name).open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        scores = [row["score"] for row in rows]
        return {"n_pairs": len(rows), "n_groups": len(groups), "mean_score": sum(scores) / len(scores)}

    def _rm_rows(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.paths.rm_data.open(encoding="utf-8")]

    def _rm_strong(self, out: Path) -> dict[str, Any]:
        """The strong RM: the recipe below at the init LM's size, then grown and trained on at ~10x."""
        cfg = self.cfg
        tokenizer = self._load_tokenizer()
        if cfg.rm_strong_init:
            # Reward model initialised from a trained LM's transformer (InstructGPT-style) or a pretrained
            # trunk (a cross-encoder, with its own tokenizer); the head over score bins starts fresh.
            init_path = rm_init_dir(self.paths, cfg.rm_strong_init)  # a role ZooConfig.__post_init__ allows
            if cfg.rm_strong_init in PRETRAINED_INITS:
                tokenizer = AutoTokenizer.from_pretrained(init_path, local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(
                init_path, num_labels=cfg.rm_n_bins, local_files_only=True,
                **rm_init_overrides(cfg.rm_strong_init_layers))
        else:
            model = new_reward_model(tokenizer, cfg.rm_strong, cfg.n_positions, cfg.rm_n_bins, cfg.seed)
        rows = self._rm_rows()
        texts = [format_rm_input(row["prompt"], row["response"]) for row in rows]
        scores = [row["score"] for row in rows]
        recipe = StrongRecipe.of_zoo(cfg)

        def aids(grown: bool, seed: int) -> dict[str, Any]:
            weight = cfg.rm_strong_grow_feature_weight if grown else cfg.rm_strong_feature_weight
            return match_training(rows, self.train_records, cfg.rm_strong_match_pairs, weight, seed)

        model, loss, info = fit_strong(model, tokenizer, texts, scores, groups_of(rows), recipe, out / STUDENT_INIT_DIR,
                                       "rm_strong", aids)
        loss_recipe = f"two-hot cross-entropy + {cfg.rm_pairwise_weight:g} x in-group Bradley-Terry"
        if cfg.rm_strong_feature_weight > 0:
            loss_recipe += f" + {cfg.rm_strong_feature_weight:g} x feature heads"
        if cfg.rm_strong_match_pairs:
            loss_recipe += f"; a match step of {cfg.rm_strong_match_pairs} prompt swaps after each step (own AdamW)"
        if recipe.grows:
            size = f"{model.config.num_hidden_layers} x {model.config.hidden_size}"
            loss_recipe += (f"; then grown to {size} and trained on for {cfg.rm_strong_grow_train.steps} steps"
                            f"{'' if cfg.rm_strong_grow_feature_weight > 0 else ' without feature heads'}")
        model.config.problem_type = "single_label_classification"
        return {"n_params": self._save_lm(model, out, cfg.rm_max_length, tokenizer), "final_loss": loss,
                "n_bins": cfg.rm_n_bins, "max_length": cfg.rm_max_length, "init": cfg.rm_strong_init or "scratch",
                "n_layer": model.config.num_hidden_layers, "n_embd": model.config.hidden_size,
                "reward": "expected value over bins 0..5", "loss": loss_recipe, **info}

    def _rm_light(self, out: Path) -> dict[str, Any]:
        """The light RM, distilled from the strong RM (R6): its student init fitted to its bin
        distributions by KL on RM pairs and prompt swaps that the strong RM labels."""
        from strata_tools.rm.distill import DistillConfig, train_light

        cfg = self.cfg
        teacher = load_reward_model(self.paths.rm_strong, device="cpu")
        # The teacher before growth (its student init), or the teacher itself when it did not grow; with
        # ``rm_light_layers``, only the first blocks of it (embeddings and head kept).
        grown_from = student_init_dir(self.paths.rm_strong)
        if grown_from is None and not cfg.rm_light_layers:
            raise ValueError(f"the strong RM at {self.paths.rm_strong} has no student init: the light RM is "
                             "distilled from it, starting from its pre-growth trunk (rm_strong_widen/grow_layers)")
        init = f"rm_strong{'/' + STUDENT_INIT_DIR if grown_from else ''}"
        if cfg.rm_light_layers:
            init += f" (first {cfg.rm_light_layers} blocks)"
        student = AutoModelForSequenceClassification.from_pretrained(
            grown_from or self.paths.rm_strong, local_files_only=True, **rm_init_overrides(cfg.rm_light_layers))
        prompts, responses, sources = distill_pairs(self._rm_rows(), self.train_records, cfg.rm_light_distill_pairs,
                                                    cfg.rm_light_distill_swaps, cfg.seed)
        started = time.perf_counter()
        teacher_logits = score_in_length_order(teacher, prompts, responses, cfg.rm_max_length, "strong RM labels",
                                               progress=self.progress)
        label_seconds = time.perf_counter() - started
        distill = DistillConfig(steps=cfg.rm_light_train.steps, batch_size=cfg.rm_light_train.batch_size,
                                lr=cfg.rm_light_train.lr, warmup_steps=cfg.rm_light_train.warmup_steps,
                                weight_decay=cfg.rm_light_train.weight_decay, grad_clip=cfg.rm_light_train.grad_clip,
                                temperature=cfg.rm_light_temperature, max_length=cfg.rm_max_length, seed=cfg.seed)
        texts = [format_rm_input(p, r) for p, r in zip(prompts, responses, strict=True)]
        with tqdm(total=distill.steps, desc="rm_light (distilling)", unit="step", leave=False,
                  disable=not self.progress) as bar:
            loss = train_light(student, teacher.tokenizer, texts, teacher_logits, distill,
                               lambda step, kl: bar.update(1))
        student.config.problem_type = "single_label_classification"
        # A pretrained trunk's RMs read with its own tokenizer; the zoo's GPT-2 RMs with the zoo's.
        tokenizer = teacher.tokenizer if cfg.rm_strong_init in PRETRAINED_INITS else None
        return {"n_params": self._save_lm(student, out, cfg.rm_max_length, tokenizer), "final_loss": loss,
                "n_bins": cfg.rm_n_bins, "max_length": cfg.rm_max_length, "init": init,
                "n_layer": student.config.num_hidden_layers, "n_embd": student.config.hidden_size,
                "teacher": teacher_version(self.paths.rm_strong), "teacher_params": teacher.n_params,
                "distill_pairs": sources, "label_seconds": round(label_seconds, 1),
                "reward": "expected value over bins 0..5",
                "loss": f"{cfg.rm_light_temperature:g}^2 x KL(strong || light) over score bins"}


def distill_pairs(rows: list[dict[str, Any]], train_records: list[PromptRecord], n_pairs: int, n_swaps: int,
                  seed: int) -> tuple[list[str], list[str], dict[str, int]]:
    """(prompt, response) pairs for the strong RM to label: ``n_pairs`` RM data rows (seeded sample; 0:
    all) and ``n_swaps`` prompt swaps (a train prompt's reference answer under it and under another),
    with how many of each."""
    rng = random.Random(seed + 7)
    sample = rows if not n_pairs or n_pairs >= len(rows) else rng.sample(rows, n_pairs)
    prompts = [row["prompt"] for row in sample]
    responses = [row["response"] for row in sample]
    swaps = corpus.prompt_swaps(train_records, seed + 8) if n_swaps else []
    swaps = swaps if n_swaps >= len(swaps) else rng.sample(swaps, n_swaps)
    for swap in swaps:
        prompts += [swap.record.text, swap.other.text]
        responses += [swap.response, swap.response]
    return prompts, responses, {"rm_data": len(sample), "prompt_swaps": len(swaps)}


def rm_init_dir(paths: ZooPaths, init: str) -> Path:
    """Where the strong RM of ``paths``' recipe starts: a zoo LM's directory, or a pretrained trunk's."""
    return trunk_dir(init) if init in PRETRAINED_INITS else Path(getattr(paths, init))


def rm_features(rows: list[dict[str, Any]]) -> dict[str, FeatureLabels]:
    """The feature heads' labels for RM data rows: the prompt's intent, topic and subject (from the
    suite; -1 for a prompt not in it) and the answer's own (``oracle.answer_features``; -1 when
    unclear). Topics (8) are learned long before subjects (80) and already tell an off-topic answer."""
    records = {record.id: record for record in load_suite()}
    intents = {name: i for i, name in enumerate(DIRECTION_NAMES)}
    subjects = {name: i for i, name in enumerate(SUBJECT_NAMES)}
    topics = {topic.name: i for i, topic in enumerate(TOPICS)}
    topic_of = {subject.name: topic.name for topic in TOPICS for subject in topic.subjects}
    labels: dict[str, list[int]] = {f"{side}_{what}": [] for side in ("prompt", "answer")
                                    for what in ("intent", "topic", "subject")}
    for row in rows:
        record = records.get(row.get("prompt_id", ""))
        answer_intent, answer_subject = answer_features(row["response"])
        labels["prompt_intent"].append(intents[record.intent] if record else -1)
        labels["prompt_topic"].append(topics[record.topic] if record else -1)
        labels["prompt_subject"].append(subjects[record.subject] if record else -1)
        labels["answer_intent"].append(intents[answer_intent] if answer_intent else -1)
        labels["answer_topic"].append(topics[topic_of[answer_subject]] if answer_subject else -1)
        labels["answer_subject"].append(subjects[answer_subject] if answer_subject else -1)
    n_classes = {"intent": len(intents), "topic": len(topics), "subject": len(subjects)}
    return {name: FeatureLabels(values, n_classes[name.split("_")[1]]) for name, values in labels.items()}


def match_training(rows: list[dict[str, Any]], train_records: list[PromptRecord], match_pairs: int,
                   feature_weight: float, seed: int) -> dict[str, Any]:
    """``train_reward_model``'s keyword arguments for the feature heads (labels of ``rows``) and the
    match steps (pool ``k`` drawn from ``train_records`` with seed ``seed + 100 + k``); empty when
    both are off. The build and ``strata rm train-strong`` share it, so the CLI trains the zoo's RM."""
    aids: dict[str, Any] = {}
    if feature_weight > 0:
        aids |= {"features": rm_features(rows), "feature_weight": feature_weight}
    if match_pairs:
        aids |= {"match_pools": lambda k: match_pool(train_records, seed + 100 + k), "match_pairs": match_pairs}
    return aids


def match_pool(records: list[PromptRecord], seed: int) -> MatchPool:
    """The match steps' texts: per record a reference answer under its own prompt and under another
    (``corpus.prompt_swaps``: same subject, other intent, or same intent, other subject), in pairs,
    with oracle scores and feature labels."""
    rows = []
    for swap in corpus.prompt_swaps(records, seed):
        rows += [_pair_row(swap.record, swap.response, "reference", -1),
                 _pair_row(swap.other, swap.response, swap.kind, -1)]
    return MatchPool([format_rm_input(row["prompt"], row["response"]) for row in rows],
                     [row["score"] for row in rows], rm_features(rows))


def near_miss_rows(samples: list[dict[str, Any]], records: dict[str, PromptRecord], seed: int) -> list[dict[str, Any]]:
    """A near miss of each sample row where it has one (``augment.perturb_each``), re-scored by the
    oracle, in the sample's group; its kind ``perturbed:<tier>`` for a ``sample:<tier>`` row."""
    texts = perturb_each([row["response"] for row in samples], seed)
    return [_pair_row(records[row["prompt_id"]], text, row["kind"].replace("sample:", "perturbed:", 1), row["group"])
            for row, text in zip(samples, texts, strict=True) if text is not None]


def _pair_row(record: PromptRecord, response: str, kind: str, group: int) -> dict[str, Any]:
    return {"prompt_id": record.id, "prompt": record.text, "response": response, "kind": kind, "group": group,
            "score": oracle_score(record, response)}


def with_overrides(config: ZooConfig, **changes: Any) -> ZooConfig:
    """A copy of ``config`` with some fields changed (for tests and experiments)."""
    return replace(config, **changes)
