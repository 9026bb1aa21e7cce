"""Distilling a light RM version from a strong RM (R6, R8): ``DistillOptions``, the pairs it is fitted on
(the zoo's RM pairs and prompt swaps, the user's files, the rollout log) and their augmentation, the
members fitted by KL to the strong RM's bins, their metrics, and ``distill_version``, which
``strata rm distill`` and ``strata bench rm`` run (the RM loop runs ``run_distill``). The zoo builds its
own light RM (``strata_tools.zoo.build``) with the same ``fit_light`` (``strata_tools.rm.recipe``)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from strata.contract.template import RM_MAX_LENGTH
from strata.errors import CliError
from strata_tools.rm.augment import KINDS, augment_responses
from strata_tools.rm.lifecycle import (
    eval_sets,
    eval_swaps,
    mean_rewards,
    read_pairs,
    rollout_rows,
    score_logits,
)
from strata_tools.rm.models import ZooModels, ZooSource
from strata_tools.rm.refresh import is_held_out
from strata_tools.rm.versions import finalize_version, promote_version, serving_light
from strata_tools.task.seal import check_sealed
from strata_tools.task.suite import load_suite


@dataclass(frozen=True)
class DistillOptions:
    """One distillation run (what `strata rm distill` and `strata bench rm --distill` run).

    ``init``: ``auto`` starts from the strong RM's student init (the zoo's strong RM keeps its trunk
    before growth; so does a grown ``strata rm train-strong``) and else from a fresh model of
    ``n_embd`` x ``n_layer``; ``fresh``; or a directory (e.g. the light RM in service, to re-distil).
    ``steps`` and ``lr`` override the schedule: from an init, the zoo's light-RM schedule
    (``LightRecipe.of_zoo``, its warm-up, weight decay and clip included); from scratch,
    ``FRESH_LIGHT_TRAIN``, a longer, faster one (``strata_tools.rm.recipe``). ``swaps``: prompt swaps
    of the suite's train prompts (0 without zoo pairs).
    """

    strong: str | None = None  # directory; None = the zoo's strong RM
    data: tuple[str, ...] = ()  # extra JSONL files of {prompt, response}
    zoo_pairs: bool = True
    rollout_log: bool = True
    max_rollouts: int = 5000
    max_pairs: int = 3000
    swaps: int | None = None  # None: the zoo's rm_light_distill_swaps with zoo pairs, else 0
    augment: tuple[str, ...] = ("synonym", "reorder")
    augment_fraction: float = 0.3
    members: int = 1
    init: str = "auto"
    # Blocks of the init kept (its first N); None: with ``auto``, the strong RM's zoo recipe
    # (``rm_light_layers``) when it has one, else all.
    init_layers: int | None = None
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 2
    steps: int | None = None
    batch_size: int = 32
    lr: float | None = None
    temperature: float = 2.0
    max_length: int = RM_MAX_LENGTH  # what the zoo's RMs read (ZooConfig.rm_max_length); the teacher sees no more
    hold_out: float = 0.0  # share of the rollout log's prompts kept out of training, to compare versions on
    seed: int = 0
    device: str = "auto"

    def validate(self) -> None:
        """Raise a CliError naming the option that cannot work."""
        if unknown := set(self.augment) - set(KINDS):
            raise CliError(f"unknown augmentation(s) {sorted(unknown)}: use {', '.join(KINDS)} or none")
        if self.members < 1:
            raise CliError("--members must be at least 1")
        if self.init_layers is not None and (self.init_layers < 1 or self.init == "fresh"):
            raise CliError(f"--init-layers must be at least 1 and needs an init to take blocks from, got "
                           f"{self.init_layers} with --init {self.init}")
        if not 0.0 <= self.hold_out < 1.0:
            raise CliError(f"--hold-out must be in [0, 1), got {self.hold_out}")
        if self.init not in ("auto", "fresh") and not (Path(self.init) / "config.json").is_file():
            raise CliError(f"--init {self.init}: not a model directory (no config.json); use auto, fresh or a "
                           "sequence-classification RM directory")

    def key(self) -> str:
        """Hash of what determines the light RM (for caching a bench's distillation)."""
        payload = {k: v for k, v in asdict(self).items() if k != "device"}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class DistillResult:
    staging: Path
    members: list[Path]
    metrics: dict[str, float]
    info: dict[str, Any]
    strong_path: Path
    strong_version: str
    # The rollout log's held-out pairs (``hold_out``) and the strong RM's rewards for them.
    held_out: tuple[list[str], list[str], list[float]] = ([], [], [])


def held_out_prompt(prompt: str, share: float) -> bool:
    """Whether a rollout's prompt is in the held-out share (by its content hash: stable across runs)."""
    return share > 0 and is_held_out(prompt, share)


def _student(init: str, strong: Any, strong_path: Path, options: DistillOptions, n_bins: int, seed: int) -> Any:
    """The model a light RM starts from, and what it is: ``fresh`` or the directory it was loaded from."""
    from transformers import AutoModelForSequenceClassification

    from strata.models.prompts import model_positions
    from strata.models.training import ModelShape
    from strata_tools.rm.recipe import check_init_layers, rm_init_overrides, student_init_dir
    from strata_tools.rm.train import new_reward_model

    layers = options.init_layers
    if init == "auto":
        found = student_init_dir(strong_path)
        init = str(found) if found is not None else "fresh"
        if layers is None and found is not None:  # the zoo's light RM is the first rm_light_layers blocks
            layers = ((strong.zoo_info or {}).get("config") or {}).get("rm_light_layers") or None
    if init == "fresh":
        shape = ModelShape(options.n_embd, options.n_layer, options.n_head)
        n_positions = max(256, options.max_length)  # svc_reward reads up to 256 tokens by default
        return new_reward_model(strong.tokenizer, shape, n_positions, n_bins, seed), "fresh"
    try:
        check_init_layers(init, layers or 0)
        model = AutoModelForSequenceClassification.from_pretrained(init, local_files_only=True,
                                                                   **rm_init_overrides(layers or 0))
    except (OSError, ValueError) as exc:
        raise CliError(f"--init {init}: not a sequence-classification RM ({exc})") from exc
    if model.config.num_labels != n_bins:
        raise CliError(f"--init {init} has {model.config.num_labels} score bins, the strong RM {n_bins}")
    positions = model_positions(model.config)
    if positions is not None and positions < options.max_length:
        raise CliError(f"--max-length {options.max_length} exceeds the {positions} positions of {init}")
    return model, init


def _distill_sources(options: DistillOptions, zoo: ZooModels | None, settings: Any
                     ) -> tuple[list[tuple[str, str]], dict[str, Any], tuple[list[str], list[str]]]:
    """The distinct (prompt, response) pairs to pseudo-label, how many came from each source, and the
    rollout log's held-out pairs: the zoo's RM pairs and prompt swaps, the user's files, the rollout log."""
    pairs: list[tuple[str, str]] = []
    sources: dict[str, Any] = {}
    if options.zoo_pairs:
        from strata_tools.rm.rows import distill_pairs

        swaps = zoo.config.rm_light_distill_swaps if options.swaps is None else options.swaps
        zoo_rows = read_pairs(zoo.rm_data, need_score=False)
        prompts, responses, counts = distill_pairs(zoo_rows, load_suite("train"), options.max_pairs, swaps,
                                                   options.seed)
        pairs += list(zip(prompts, responses, strict=True))
        sources |= {"zoo_pairs": counts["rm_data"], "prompt_swaps": counts["prompt_swaps"]}
    for path in options.data:
        rows = read_pairs(Path(path), need_score=False)
        pairs += [(r["prompt"], r["response"]) for r in rows]
        sources[str(path)] = len(rows)

    check_sealed((prompt for prompt, _ in pairs), "the light RM's distillation pairs")
    held_prompts: list[str] = []
    held_responses: list[str] = []
    if options.rollout_log:
        rows, line = rollout_rows(settings, options.max_rollouts)
        print(line)
        for row in rows:
            if held_out_prompt(row["prompt"], options.hold_out):
                held_prompts.append(row["prompt"])
                held_responses.append(row["response"])
            else:
                pairs.append((row["prompt"], row["response"]))
        sources["rollout_log"] = len(rows) - len(held_prompts)
        if options.hold_out:
            sources["rollout_log_held_out"] = len(held_prompts)
    pairs = list(dict.fromkeys(pairs))  # distinct, order kept
    if not pairs:
        raise CliError("no pairs to distil on: enable --zoo-pairs, pass --data, or fill the rollout log")
    return pairs, sources, (held_prompts, held_responses)


def _augment_pairs(pairs: list[tuple[str, str]], options: DistillOptions) -> int:
    """Perturbed copies of a share of ``pairs``, appended to it (R8's adversarial augmentation); how many."""
    if not options.augment or options.augment_fraction <= 0:
        return 0
    rng = random.Random(options.seed)
    chosen = rng.sample(range(len(pairs)), round(options.augment_fraction * len(pairs)))
    copies = augment_responses([pairs[i][1] for i in chosen], options.augment, 1, options.seed)
    pairs += [(pairs[chosen[c.index]][0], c.response) for c in copies]
    return len(copies)


def _fit_light_members(options: DistillOptions, zoo: ZooModels | None, strong: Any, strong_path: Path,
                       texts: list[str], teacher: Any, staging: Path) -> tuple[list[Path], list[float], str]:
    """Each light RM member fitted by KL to the teacher's bin distributions and saved under ``staging``;
    their directories, final losses and what the last one started from."""
    from strata.models.reward import save_rm_tokenizer
    from strata_tools.rm.recipe import FRESH_LIGHT_TRAIN, RM_LIGHT_TRAIN, LightRecipe, fit_light

    # From an init, the zoo's whole schedule (warm-up, weight decay and clip too); a fresh model, its own.
    warm_train = LightRecipe.of_zoo(zoo.config).train if zoo is not None else RM_LIGHT_TRAIN
    members: list[Path] = []
    losses: list[float] = []
    started_from = ""
    for member in range(options.members):
        model, started_from = _student(options.init, strong, strong_path, options, teacher.shape[1],
                                       options.seed + member)
        train = warm_train if started_from != "fresh" else FRESH_LIGHT_TRAIN
        train = replace(train, steps=options.steps or train.steps, lr=options.lr or train.lr,
                        batch_size=options.batch_size)
        recipe = LightRecipe(train, options.max_length, options.temperature, options.seed + member)
        model.config.pad_token_id = strong.tokenizer.pad_token_id
        losses.append(fit_light(model, strong.tokenizer, texts, teacher, recipe,
                                f"light RM {member + 1}/{options.members}"))
        out = staging if options.members == 1 else staging / f"member-{member}"
        model.config.problem_type = "single_label_classification"
        model.save_pretrained(out)
        save_rm_tokenizer(strong.tokenizer, out, options.max_length)
        members.append(out)
    return members, losses, started_from


def _distill_metrics(light_rms: list[Any], strong: Any, held: tuple[list[str], list[str]], max_length: int,
                     cache_dir: Path) -> tuple[dict[str, float], list[float]]:
    """Light vs strong and vs the oracle on the eval and fresh splits, the prompt match on eval prompt
    swaps, and light vs strong on the rollout log's held-out pairs; with the strong RM's scores of those."""
    from strata.models.reward import expected_reward, prompt_match
    from strata_tools.rm.distill import comparison_metrics, rank_metrics

    light_scores, strong_scores, oracle_scores = {}, {}, {}
    for split, (p, r, oracle) in eval_sets().items():
        strong_scores[split] = expected_reward(score_logits(strong, p, r, max_length, f"strong {split}",
                                                            cache_dir)).tolist()
        light_scores[split] = mean_rewards(light_rms, p, r, max_length, f"light {split}")
        oracle_scores[split] = oracle
    metrics = comparison_metrics(light_scores, strong_scores, oracle_scores)
    match_swaps = eval_swaps()
    metrics["match/light_eval"] = prompt_match(light_rms, *match_swaps, max_length)
    metrics["match/strong_eval"] = prompt_match([strong], *match_swaps, max_length)
    held_prompts, held_responses = held
    held_strong: list[float] = []
    if held_prompts:
        held_strong = expected_reward(score_logits(strong, held_prompts, held_responses, max_length,
                                                   "strong held-out", cache_dir)).tolist()
        metrics |= {f"{name}/strong_log": value for name, value in rank_metrics(
            mean_rewards(light_rms, held_prompts, held_responses, max_length, "light held-out"),
            held_strong).items()}
    return metrics, held_strong


def run_distill(options: DistillOptions, settings: Any, zoo: ZooSource, staging: Path) -> DistillResult:
    """Pseudo-label pairs with the strong RM, fit light RM(s) to its bin distributions, evaluate. The zoo's
    models are read (and the zoo built) for its strong RM (no ``strong``) or its pairs (``zoo_pairs``)."""
    from strata.models.loading import ModelLoadError, load_reward_model
    from strata.models.prompts import PromptFormat
    from svc_reward.registry import describe

    models = zoo.models() if (options.strong is None or options.zoo_pairs) else None
    strong_path = Path(options.strong) if options.strong else models.rm_strong
    try:
        strong = load_reward_model(strong_path, device=options.device)
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc
    if strong.model.config.num_labels < 2:
        raise CliError(f"{strong_path} is a regression RM (1 logit): distillation needs score-bin logits")
    strong_version = describe("strong", [strong_path]).version
    cache_dir = Path(settings.cache_dir).expanduser() / "rm" / "logits"

    # 1. Pairs to pseudo-label; 2. adversarial augmentation: perturbed copies, re-scored like the rest.
    pairs, sources, (held_prompts, held_responses) = _distill_sources(options, models, settings)
    augmented = _augment_pairs(pairs, options)
    prompts, responses = [p for p, _ in pairs], [r for _, r in pairs]
    print(f"distilling {strong_path} ({strong.n_params / 1e6:.1f}M params) on {len(pairs)} pairs "
          f"({augmented} augmented); sources {sources}")

    # 3. The strong RM's bin distributions: the targets (cached by weights and texts).
    teacher = score_logits(strong, prompts, responses, options.max_length, "strong RM pseudo-labels", cache_dir)
    rm_format = PromptFormat.of(strong.tokenizer)  # the light RMs share the strong RM's tokenizer
    texts = [rm_format.rm_text(p, r) for p, r in pairs]

    # 4. Light RM(s): from the student init (or fresh), on the strong RM's tokenizer, fitted by KL.
    members, losses, started_from = _fit_light_members(options, models, strong, strong_path, texts, teacher, staging)

    # 5. Evaluation on held-out prompts.
    light_rms = [load_reward_model(m, device=options.device) for m in members]
    metrics, held_strong = _distill_metrics(light_rms, strong, (held_prompts, held_responses), options.max_length,
                                            cache_dir)
    info = {
        "metrics": metrics, "parent": strong_version,
        "config": {**asdict(options), "strong": str(strong_path), "final_kl": losses, "n_pairs": len(pairs),
                   "n_augmented": augmented, "sources": sources, "light_params": light_rms[0].n_params,
                   "strong_params": strong.n_params, "init": started_from,
                   "loss": "T^2 * KL(strong || light) over score bins"},
    }
    return DistillResult(staging, members, metrics, info, strong_path, strong_version,
                         (held_prompts, held_responses, held_strong))


def better_than_current(current: tuple[str, list[Path]], entry: Any, result: DistillResult,
                         options: DistillOptions) -> bool:
    """Whether the new light RM ranks the held-out logged pairs closer to the strong RM than the one in
    service does (Spearman), printing both."""
    from strata.models.loading import load_reward_model
    from strata_tools.rm.distill import rank_metrics

    prompts, responses, strong = result.held_out
    version, paths = current
    serving = [load_reward_model(p, device=options.device) for p in paths]
    before = rank_metrics(mean_rewards(serving, prompts, responses, options.max_length, "in service"),
                          strong)["spearman"]
    after = result.metrics["spearman/strong_log"]
    better = after > before
    print(f"held-out logged pairs ({len(prompts)}): Spearman vs the strong RM {before:.3f} ({version}, in service) "
          f"-> {after:.3f} ({entry.version}): {'better' if better else 'not better, keeping ' + version}")
    return better


def resolve_strong(spec: str | None, registry: Any) -> str | None:
    """A strong RM directory: ``spec`` itself, or the directory of the registered strong version it names."""
    if not spec or Path(spec).expanduser().exists():
        return spec
    if registry is None:
        raise CliError(f"no directory {spec}; to name a registered version, leave --register on")
    from svc_reward.registry import UnknownVersionError

    try:
        entry = registry.get(spec)
    except UnknownVersionError as exc:
        raise CliError(f"{spec} is neither a directory nor a registered version (strata rm list)") from exc
    if entry.kind != "strong":
        raise CliError(f"{spec} is a {entry.kind} version; --strong needs a strong one")
    return str(entry.path)


def distill_version(options: DistillOptions, settings: Any, zoo: ZooSource, registry: Any, *,
                    out: Path | None = None, from_log: bool = False, promote: bool = False,
                    promote_if_better: bool = True) -> Any:
    """Distil, write the version directory, register it (with a registry) and maybe promote it.

    ``from_log``: one turn of the loop (R6): re-distil the light RM in service on newly logged
    rollouts labelled by the strong RM, and promote the new version if it agrees better with the
    strong RM on held-out logged prompts (unless ``promote_if_better`` is off).
    """
    options = replace(options, strong=resolve_strong(options.strong, registry))
    options.validate()
    current = None
    if from_log:
        if not options.rollout_log:
            raise CliError("--from-log reads the rollout log: drop --no-rollout-log")
        current = serving_light(registry, zoo)
        if options.members != 1 or len(current[1]) != 1:
            raise CliError("--from-log re-distils a single light RM (the one in service is an ensemble, or "
                           "--members was given): use --init with one member instead")
        options = replace(options, init=str(current[1][0]) if options.init == "auto" else options.init,
                          hold_out=options.hold_out or 0.2)
        print(f"re-distilling {current[0]} (in service) from the rollout log; {options.hold_out:.0%} of its "
              "prompts held out")
    staging = Path(settings.cache_dir).expanduser() / "rm" / f".staging-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    try:
        result = run_distill(options, settings, zoo, staging)
        if from_log and not result.held_out[0]:
            raise CliError("the rollout log has no held-out prompts to compare the versions on: run more "
                           "rollouts first (or raise --hold-out)")
        result.info["config"]["distill_seconds"] = round(time.perf_counter() - started, 1)
        entry = finalize_version(staging, result.members, "light", out, settings, result.info)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    where = Path(entry.path).parent if len(entry.paths) > 1 else entry.path
    print(f"light RM {entry.version} ({len(entry.paths)} member(s)) at {where}, distilled from "
          f"{result.strong_version} in {time.perf_counter() - started:.0f}s")
    for key in sorted(result.metrics):
        print(f"  {key:32s} {result.metrics[key]:.4f}")
    if current is not None:
        better = better_than_current(current, entry, result, options)
        promote = better and promote_if_better
        if better and not promote:
            print("not promoting it (--no-promote-if-better)")
    if registry is not None:
        registry.register(entry)
        print(f"registered {entry.version}; serve it with: strata rm promote {entry.version}")
        if promote:
            promote_version(registry, settings, entry.version, verify=True)
    return entry
