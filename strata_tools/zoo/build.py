"""Build the model zoo: tokenizer, probe, Level-1/policy and Level-2 LMs, strong and light RMs.

Everything is trained here, offline, from the prompt suite (``strata_tools.task.suite``) and corpora
generated from it (``strata_tools.task.corpus``); nothing is downloaded. The result lives under
``<cache_dir>/zoo/<config-hash>/``, one ``save_pretrained`` directory per model with its tokenizer
and a ``strata_zoo.json`` (role, resolved config, losses, timings), so every model loads with the
same ``from_pretrained`` calls as a user's checkpoint (``strata.models.loading``).

Stages are built in order and each is reused when present, so an interrupted build resumes and a
second build (or a fresh clone on the same machine) costs nothing. A stage missing from this zoo is
also copied from another zoo in the same cache whose stage has the same key (``stage_key``: the
config fields the stage reads and the keys of the stages it builds on), so a changed RM recipe
retrains the RMs, not the LMs. ``ensure_zoo(settings)`` is the entry point for code and tests;
``strata models build`` is the one for people.

The config, its presets and the stage keys are ``strata_tools.zoo.config``; the RM stages' data
(pair rows, distillation pairs, feature labels, match pools) is ``strata_tools.rm.rows``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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
from strata.contract.models import write_manifest
from strata.contract.template import format_rm_input
from strata.models.generation import SamplingConfig, generate
from strata.models.growth import deepen
from strata.models.loading import ZOO_INFO_FILE, load_causal_lm, load_reward_model
from strata.models.reward import save_rm_tokenizer
from strata.models.training import ModelShape, TrainConfig
from strata_tools.rm.recipe import (
    STUDENT_INIT_DIR,
    LightRecipe,
    StrongRecipe,
    fit_light,
    fit_strong,
    groups_of,
    rm_init_dir,
    rm_init_overrides,
    score_in_length_order,
    student_init_dir,
    teacher_version,
)
from strata_tools.rm.rows import distill_pairs, match_training, near_miss_rows, pair_row
from strata_tools.rm.train import new_reward_model
from strata_tools.task import corpus
from strata_tools.task.seal import check_sealed
from strata_tools.task.suite import load_suite
from strata_tools.zoo.config import PRESETS, PRETRAINED_INITS, ROLES, ZOO_FORMAT_VERSION, ZooConfig, stage_key
from strata_tools.zoo.train import new_causal_lm, pack_texts, train_causal_lm, train_tokenizer

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class ZooOnDemand:
    """The zoo of ``settings`` for the RM runs (``strata_tools.rm.models.ZooSource``): ``models()`` is
    ``ensure_zoo`` (it builds the zoo if need be), called only by a run that reads its models or data;
    ``recipe()`` is the preset's config, built or not."""

    settings: StrataSettings | None = None

    def models(self) -> ZooPaths:
        return ensure_zoo(self.settings)

    def recipe(self) -> ZooConfig:
        return resolve_config(as_zoo_settings(self.settings))


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
        rows = [pair_row(p.record, p.response, p.kind, g) for g, group in enumerate(groups) for p in group]
        group_of = {group[0].record.id: g for g, group in enumerate(groups)}
        rng = random.Random(self.cfg.seed + 1)
        for role, path in (("level1", self.paths.level1), ("level2", self.paths.level2)):
            records = rng.sample(self.train_records, self.cfg.rm_model_samples)
            lm = load_causal_lm(path, device="cpu")
            directions = [corpus.sample_directions(r, rng) for r in records]
            sampling = SamplingConfig(max_new_tokens=self.cfg.sample_max_new_tokens, seed=self.cfg.seed)
            generations = generate(lm, [r.text for r in records], directions, sampling)
            samples = [pair_row(r, g.text, f"sample:{role}", group_of[r.id])
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
        texts = [format_rm_input(p, r) for p, r in zip(prompts, responses, strict=True)]
        loss = fit_light(student, teacher.tokenizer, texts, teacher_logits, LightRecipe.of_zoo(cfg),
                         "rm_light (distilling)", self.progress)
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
