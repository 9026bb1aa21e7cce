"""``strata rm``: train the strong RM, distil light RMs, register versions, promote one (R5-R8).

    strata rm train-strong [--data pairs.jsonl] [--init DIR]   strong RM on (prompt, response, score)
    strata rm distill [--strong DIR|VERSION] [--members 3]      light RM(s) fitted to the strong RM
    strata rm distill --from-log                                one turn of the loop: re-distil, promote if better
    strata rm promote <version>                                 svc_reward swaps to it between batches
    strata rm list [--kind light] [--json]

Artifacts go to ``<cache_dir>/rm/<version>/`` (one ``save_pretrained`` directory, or ``member-<i>``
directories for an ensemble) with ``strata_rm.json`` (kind, version, checksum, metrics, the resolved
config, data sources). Versions are registered in Redis (``svc_reward.registry``); ``promote``
publishes ``strata.rm.updated``. Training and distillation are offline processes: svc_reward keeps
serving its current version meanwhile and swaps only on ``promote``.

The functions below (data collection, teacher logits, the distillation run, evaluation sets) are
also what ``strata bench rm`` runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from strata.cli.main import CliError, read_jsonl
from strata.contract.template import RM_MAX_LENGTH

log = logging.getLogger(__name__)

RM_INFO_FILE = "strata_rm.json"
PSEUDO_LABELS_FILE = "pseudo_labels.jsonl"
EVAL_SEED = 7  # synthetic (prompt, response) pairs of the eval and fresh splits, one per prompt
EVAL_SPLITS: tuple[str, ...] = ("eval", "fresh")


# --- parser ---------------------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("rm", help="reward models: train the strong RM, distil, promote (R5-R8)")
    sub = parser.add_subparsers(dest="rm_command", metavar="SUBCOMMAND", required=True)

    strong = sub.add_parser("train-strong", help="train the strong RM on (prompt, response, score) data (R5)")
    strong.add_argument("--data", type=Path, default=None,
                        help="JSONL of {prompt, response, score} with scores on 0-5 (default: the zoo's "
                             "oracle-labelled pairs)")
    strong.add_argument("--init", default=None,
                        help="checkpoint to start from: a causal LM (its transformer; the score-bin head starts "
                             "fresh) or a sequence-classification RM (default: the zoo's rm_strong_init LM, the probe, "
                             "read with its first rm_strong_init_layers blocks, 0: all)")
    strong.add_argument("--n-bins", type=int, default=11, help="score bins on [0, 5] (reward = expected value)")
    # Unset numbers default to the zoo's own strong-RM recipe (ZooConfig.rm_strong_train, rm_max_length).
    strong.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the zoo's recipe)")
    strong.add_argument("--batch-size", type=int, default=16, help="pairs per step (ungrouped data)")
    strong.add_argument("--lr", type=float, default=None, help="peak AdamW learning rate (default: the zoo's)")
    strong.add_argument("--groups-per-step", type=int, default=None,
                        help="with grouped data (rows with a 'group' field: answers to one prompt), groups per step "
                             "(default: the zoo's)")
    strong.add_argument("--pairwise-weight", type=float, default=1.0,
                        help="weight of the in-group Bradley-Terry ranking loss (grouped data only; 0: scores only)")
    strong.add_argument("--match-pairs", type=int, default=None,
                        help="prompt swaps per match step, with feature heads, after every step (the zoo's "
                             "recipe; the swaps and labels come from the prompt suite, so the default is the zoo's "
                             "with the zoo's data and 0 with --data)")
    strong.add_argument("--max-length", type=int, default=None,
                        help="tokens of (prompt, response) read, saved as the tokenizer's model_max_length so that "
                             "serving reads the same (default: the zoo's)")
    strong.add_argument("--widen", type=int, default=None,
                        help="after training, multiply every width by this (1: no growth; default: the zoo's "
                             "rm_strong_widen from the zoo's init, 1 with --init)")
    strong.add_argument("--grow-layers", type=int, default=None,
                        help="after training, add this many blocks (default: the zoo's rm_strong_grow_layers from the "
                             "zoo's init, 0 with --init); a grown RM trains on for the zoo's rm_strong_grow_train "
                             "steps and keeps the model before growth as the student init of `strata rm distill`")
    strong.add_argument("--grow-steps", type=int, default=None,
                        help="steps after growth (default: the zoo's rm_strong_grow_train steps)")
    strong.add_argument("--pseudo-label", action=argparse.BooleanOptionalAction, default=True,
                        help="score historical rollouts (rollout log + content store) with the new RM and write "
                             f"{PSEUDO_LABELS_FILE} next to it")
    strong.add_argument("--max-rollouts", type=int, default=20000, help="newest rollouts to pseudo-label")
    _add_common(strong)
    strong.set_defaults(func=_train_strong)

    distill = sub.add_parser("distill", help="distil the strong RM into a light RM or ensemble (R6, R8)")
    distill.add_argument("--strong", default=None,
                         help="strong RM directory or registered strong version (default: the zoo's strong RM)")
    distill.add_argument("--data", type=Path, action="append", default=[],
                         help="extra JSONL of {prompt, response} to pseudo-label (repeatable; scores are ignored)")
    distill.add_argument("--zoo-pairs", action=argparse.BooleanOptionalAction, default=True,
                         help="include the zoo's RM training pairs")
    distill.add_argument("--rollout-log", action=argparse.BooleanOptionalAction, default=True,
                         help="include historical rollouts from the rollout log (skipped if Kafka/Redis are down)")
    distill.add_argument("--max-rollouts", type=int, default=5000, help="newest rollouts taken from the log")
    distill.add_argument("--max-pairs", type=int, default=3000,
                         help="zoo RM pairs pseudo-labelled (a seeded sample; 0 = all)")
    distill.add_argument("--swaps", type=int, default=None,
                         help="prompt swaps of the suite's train prompts (an answer under its prompt and under "
                              "another: what teaches the prompt match; default: the zoo's with --zoo-pairs)")
    distill.add_argument("--augment", default="synonym,reorder",
                         help="adversarial augmentations: synonym, reorder (comma-separated) or none")
    distill.add_argument("--augment-fraction", type=float, default=0.3,
                         help="share of the pairs that get one augmented copy per augmentation")
    distill.add_argument("--members", type=int, default=1, help="light RMs in the ensemble (R8 suggests 3)")
    defaults = DistillOptions()
    distill.add_argument("--init", default=defaults.init,
                         help="what the light RM starts from: auto (the strong RM's student init, its trunk before "
                              "growth, when it has one; else fresh), fresh (--n-embd x --n-layer), or a directory")
    distill.add_argument("--n-embd", type=int, default=defaults.n_embd, help="light RM width (fresh init)")
    distill.add_argument("--n-layer", type=int, default=defaults.n_layer, help="light RM transformer blocks (fresh)")
    distill.add_argument("--n-head", type=int, default=defaults.n_head, help="light RM attention heads (fresh)")
    distill.add_argument("--steps", type=int, default=None,
                         help="optimizer steps per light RM (default: the zoo's from an init, 700 fresh)")
    distill.add_argument("--batch-size", type=int, default=defaults.batch_size, help="pairs per step")
    distill.add_argument("--lr", type=float, default=None,
                         help="peak AdamW learning rate (default: the zoo's from an init, 3e-3 fresh)")
    distill.add_argument("--temperature", type=float, default=defaults.temperature,
                         help="distillation temperature T of KL(strong || light) (not the scoring temperature)")
    distill.add_argument("--max-length", type=int, default=defaults.max_length,
                         help="tokens of (prompt, response) read")
    distill.add_argument("--promote", action="store_true", help="promote the new version right away")
    distill.add_argument("--from-log", action="store_true",
                         help="one turn of the distillation loop: re-distil the light RM in service (promoted, else "
                              "the zoo's) on new rollouts from the rollout log labelled by the strong RM, and promote "
                              "it (hot swap) if it agrees better with the strong RM on held-out logged prompts")
    distill.add_argument("--hold-out", type=float, default=0.0,
                         help="share of the rollout log's prompts kept out of training to compare on "
                              "(default 0; 0.2 with --from-log)")
    distill.add_argument("--no-promote-if-better", dest="promote_if_better", action="store_false",
                         help="with --from-log: register the new version but do not promote it")
    _add_common(distill)
    distill.set_defaults(func=_distill)

    promote = sub.add_parser("promote", help="publish a light version; every svc_reward swaps to it (R7)")
    promote.add_argument("version", help="a light version from `strata rm list`")
    promote.add_argument("--no-verify", dest="verify", action="store_false",
                         help="skip the checksum check here (the replicas still check it)")
    promote.set_defaults(func=_promote)

    listing = sub.add_parser("list", help="registered RM versions, newest first")
    listing.add_argument("--kind", choices=("strong", "light"), default=None)
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=_list)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="output directory (default <cache_dir>/rm/<version>)")
    parser.add_argument("--register", action=argparse.BooleanOptionalAction, default=True,
                        help="register the version in Redis (needs `strata infra up` or STRATA_REDIS_URL)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")


# --- shared helpers -------------------------------------------------------------------------------


def _settings() -> Any:
    from strata.zoo.build import ZooSettings

    return ZooSettings()


def _zoo(settings: Any) -> Any:
    from strata.zoo.build import ensure_zoo

    return ensure_zoo(settings)


def _set_threads(threads: int | None) -> None:
    import torch

    torch.set_num_threads(threads or os.cpu_count() or 1)


def open_registry(settings: Any) -> Any:
    """The registry on the configured Redis, or a CliError saying how to get one."""
    import redis

    from svc_reward.registry import RmRegistry

    client = redis.Redis.from_url(settings.redis_address, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise CliError(f"Redis at {settings.redis_address} does not answer ({exc}): run `strata infra up`, set "
                       "STRATA_REDIS_URL, or pass --no-register") from exc
    return RmRegistry(client)


def read_pairs(path: Path, need_score: bool) -> list[dict[str, Any]]:
    """Rows of a JSONL file of {prompt, response[, score]}, checked line by line."""
    rows: list[dict[str, Any]] = []
    for number, row in read_jsonl(path):
        if not isinstance(row, dict):
            raise CliError(f"{path}:{number}: expected an object with prompt and response")
        for key in ("prompt", "response"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                raise CliError(f"{path}:{number}: {key!r} must be a non-empty string")
        if need_score:
            score = row.get("score")
            if not isinstance(score, int | float) or not 0.0 <= float(score) <= 5.0:
                raise CliError(f"{path}:{number}: 'score' must be a number in [0, 5], got {score!r}")
        rows.append(row)
    if not rows:
        raise CliError(f"{path} holds no pairs")
    return rows


def eval_sets(seed: int = EVAL_SEED) -> dict[str, tuple[list[str], list[str], list[float]]]:
    """Per held-out split: prompts, synthetic responses of mixed quality, and their oracle scores."""
    from strata.zoo.corpus import rm_pairs
    from strata.zoo.oracle import oracle_score
    from strata.zoo.suite import load_suite

    sets = {}
    for split in EVAL_SPLITS:
        pairs = rm_pairs(load_suite(split), 1, seed)
        sets[split] = ([p.record.text for p in pairs], [p.response for p in pairs],
                       [oracle_score(p.record, p.response) for p in pairs])
    return sets


def score_logits(rm: Any, prompts: Sequence[str], responses: Sequence[str], max_length: int, desc: str,
                 cache_dir: Path | None = None, batch_size: int = 32) -> Any:
    """RM logits (N, bins) for the pairs, in length order with a progress bar; cached on disk by
    (weights checksum, max_length, texts) when ``cache_dir`` is given."""
    import torch

    from strata.contract.checksums import weights_checksum
    from strata.zoo.build import score_in_length_order

    cache_file = None
    if cache_dir is not None:
        digest = hashlib.sha256(f"{weights_checksum([rm.path])}:{max_length}".encode())
        for prompt, response in zip(prompts, responses, strict=True):
            digest.update(prompt.encode() + b"\0" + response.encode() + b"\1")
        cache_file = Path(cache_dir) / f"{digest.hexdigest()[:24]}.pt"
        if cache_file.is_file():
            return torch.load(cache_file)
    logits = score_in_length_order(rm, prompts, responses, max_length, desc, batch_size)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        torch.save(logits, cache_file)
    return logits


def mean_rewards(rms: Sequence[Any], prompts: Sequence[str], responses: Sequence[str], max_length: int,
                 desc: str) -> list[float]:
    """Rewards of the pairs under an RM or ensemble (mean of the members' expected scores, R8)."""
    import torch

    from strata.models.reward import expected_reward

    return torch.stack([expected_reward(score_logits(rm, prompts, responses, max_length, desc))
                        for rm in rms]).mean(dim=0).tolist()


class SourceUnavailableError(Exception):
    """Kafka or Redis could not be read; historical rollouts are skipped."""


def historical_rollouts(settings: Any, limit: int, timeout_s: float = 30.0) -> tuple[list[dict[str, Any]], int]:
    """The newest ``limit`` distinct (prompt, response) pairs of the rollout log, with their texts from
    the content store. Returns the rows and how many were logged but have expired from the store."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.errors import KafkaError

    from strata.bus import decode, topics
    from strata.content_store import ContentNotFoundError, ContentStore, StoreUnavailableError

    try:
        consumer = KafkaConsumer(bootstrap_servers=settings.kafka_address, group_id=None, enable_auto_commit=False,
                                 request_timeout_ms=15_000, bootstrap_timeout_ms=5_000)
    except KafkaError as exc:
        raise SourceUnavailableError(f"Kafka at {settings.kafka_address}: {exc}") from exc
    logged: dict[tuple[str, str], float] = {}
    try:
        partitions = [TopicPartition(topics.ROLLOUT_LOG.name, p)
                      for p in sorted(consumer.partitions_for_topic(topics.ROLLOUT_LOG.name) or ())]
        if not partitions or limit <= 0:
            return [], 0
        consumer.assign(partitions)
        begin, end = consumer.beginning_offsets(partitions), consumer.end_offsets(partitions)
        per_partition = max(1, limit // len(partitions))
        for tp in partitions:
            consumer.seek(tp, max(begin[tp], end[tp] - per_partition))
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in partitions) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    event = decode(topics.ROLLOUT_LOG, record.value, record.key)
                    logged[(event.prompt_hash, event.response_hash)] = event.reward
    except KafkaError as exc:
        raise SourceUnavailableError(f"rollout log on {settings.kafka_address}: {exc}") from exc
    finally:
        consumer.close()
    store = ContentStore.from_url(settings.redis_address, settings.content_ttl_s, settings.content_max_bytes)
    rows, expired = [], 0
    try:
        for (prompt_hash, response_hash), reward in list(logged.items())[-limit:]:
            try:
                prompt, response = store.get_text(prompt_hash), store.get_text(response_hash)
            except ContentNotFoundError:
                expired += 1
                continue
            rows.append({"prompt_hash": prompt_hash, "response_hash": response_hash, "prompt": prompt,
                         "response": response, "logged_reward": reward})
    except StoreUnavailableError as exc:
        raise SourceUnavailableError(f"content store at {settings.redis_address}: {exc}") from exc
    return rows, expired


def _rollout_rows(settings: Any, limit: int) -> tuple[list[dict[str, Any]], str]:
    """Historical rollouts, or none with a line saying why."""
    try:
        rows, expired = historical_rollouts(settings, limit)
    except SourceUnavailableError as exc:
        return [], f"rollout log skipped ({exc})"
    return rows, f"rollout log: {len(rows)} pairs ({expired} expired from the content store)"


def finalize_version(staging: Path, members: Sequence[Path], kind: str, out: Path | None, settings: Any,
                     info: dict[str, Any]) -> Any:
    """Move ``staging`` to its final directory, named by the version, and write ``strata_rm.json``.

    Returns the ``RmVersion`` describing the final directories.
    """
    from strata.contract.checksums import version_id, weights_checksum
    from svc_reward.registry import describe

    version = version_id(kind, weights_checksum(members))
    target = out or Path(settings.cache_dir).expanduser() / "rm" / version
    if target.exists():
        if not (target / RM_INFO_FILE).is_file():
            raise CliError(f"{target} exists and is not an RM version directory; pass another --out")
        shutil.rmtree(target)  # same version (same weights) built again
    target.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    final_members = [target / m.relative_to(staging) for m in members]
    entry = describe(kind, final_members, info.get("metrics"), info.get("parent"), info.get("config"))
    (target / RM_INFO_FILE).write_text(json.dumps({**info, "kind": kind, "version": entry.version,
                                                   "checksum": entry.checksum, "paths": list(entry.paths)},
                                                  indent=2, sort_keys=True, default=str))
    return entry


def _print_metrics(metrics: dict[str, float]) -> None:
    for key in sorted(metrics):
        print(f"  {key:32s} {metrics[key]:.4f}")


# --- train-strong ---------------------------------------------------------------------------------


def _train_strong(args: argparse.Namespace) -> int:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from strata.contract.template import format_rm_input
    from strata.models.loading import ModelLoadError, check_model_dir, load_reward_model
    from strata.models.reward import expected_reward, save_rm_tokenizer
    from strata.zoo.build import (
        STUDENT_INIT_DIR,
        ZooConfig,
        groups_of,
        grow_from_student_init,
        match_training,
        rm_init_overrides,
    )
    from strata.zoo.suite import load_suite
    from strata.zoo.train import TrainConfig, train_reward_model
    from svc_reward.distill import rank_metrics

    settings = _settings()
    registry = open_registry(settings) if args.register else None
    _set_threads(args.threads)
    zoo = None if (args.data and args.init) else _zoo(settings)
    data_path = args.data or zoo.rm_data
    rows = read_pairs(Path(data_path), need_score=True)
    recipe = zoo.config if zoo is not None else ZooConfig()
    for name, value in (("steps", recipe.rm_strong_train.steps), ("lr", recipe.rm_strong_train.lr),
                        ("groups_per_step", recipe.rm_strong_train.batch_size), ("max_length", recipe.rm_max_length)):
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.match_pairs is None:
        args.match_pairs = recipe.rm_strong_match_pairs if args.data is None else 0
    if args.match_pairs < 0:
        raise CliError(f"--match-pairs must be at least 0 (0: no match steps), got {args.match_pairs}")
    if args.widen is None:
        args.widen = 1 if args.init else recipe.rm_strong_widen
    if args.grow_layers is None:
        args.grow_layers = 0 if args.init else recipe.rm_strong_grow_layers
    if args.widen < 1 or args.grow_layers < 0 or (args.grow_steps is not None and args.grow_steps < 1):
        raise CliError(f"--widen must be at least 1, --grow-layers at least 0 and --grow-steps at least 1, got "
                       f"{args.widen}, {args.grow_layers} and {args.grow_steps}")
    init = args.init or str(getattr(zoo, recipe.rm_strong_init or "level1"))
    # The zoo's init LM is read with the recipe's first blocks (rm_strong_init_layers); a given --init whole.
    overrides = {} if args.init else rm_init_overrides(recipe.rm_strong_init_layers)
    try:
        init_dir = check_model_dir(init)
        tokenizer = AutoTokenizer.from_pretrained(init_dir, local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(
            init_dir, num_labels=args.n_bins, ignore_mismatched_sizes=True, local_files_only=True, **overrides)
    except (ModelLoadError, OSError, ValueError) as exc:
        raise CliError(f"cannot start the strong RM from {init}: {exc}") from exc
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None and args.max_length > positions:
        raise CliError(f"--max-length {args.max_length} exceeds the {positions} positions of {init_dir}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    model.config.pad_token_id = tokenizer.pad_token_id
    print(f"strong RM: {len(rows)} labelled pairs from {data_path}; init {init_dir} "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), {args.steps} steps")
    texts = [format_rm_input(r["prompt"], r["response"]) for r in rows]
    grouped = any("group" in r for r in rows)
    cfg = TrainConfig(steps=args.steps, batch_size=args.groups_per_step if grouped else args.batch_size, lr=args.lr,
                      warmup_steps=min(10, args.steps))
    match: dict[str, Any] = {}
    if args.match_pairs:
        match = match_training(rows, load_suite("train"), args.match_pairs, recipe.rm_strong_feature_weight, args.seed)
        print(f"  + a match step of {args.match_pairs} prompt swaps (suite train prompts) after each step")
    started = time.perf_counter()
    scores = [float(r["score"]) for r in rows]
    loss = train_reward_model(model, tokenizer, texts, scores, args.max_length, cfg,
                              args.seed, "strong RM", groups=groups_of(rows) if grouped else None,
                              pairwise_weight=args.pairwise_weight, **match)
    model.config.problem_type = "single_label_classification"
    staging = Path(settings.cache_dir).expanduser() / "rm" / f".staging-{uuid.uuid4().hex[:8]}"
    growth: dict[str, Any] = {}
    if args.widen > 1 or args.grow_layers:
        # The model before growth is what a light RM distilled from this one starts from.
        model, growth = grow_from_student_init(model, tokenizer, staging / STUDENT_INIT_DIR, args.max_length,
                                               args.widen, args.grow_layers, args.seed + 2)
        grow_cfg = recipe.rm_strong_grow_train
        if args.grow_steps is not None:
            grow_cfg = replace(grow_cfg, steps=args.grow_steps,
                               warmup_steps=min(grow_cfg.warmup_steps, args.grow_steps))
        print(f"  grown to {model.config.n_layer} x {model.config.n_embd} "
              f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), {grow_cfg.steps} more steps")
        if args.match_pairs:
            match = match_training(rows, load_suite("train"), args.match_pairs,
                                   recipe.rm_strong_grow_feature_weight, args.seed + 1)
        loss = train_reward_model(model, tokenizer, texts, scores, args.max_length,
                                  replace(grow_cfg, batch_size=cfg.batch_size), args.seed + 1, "strong RM (grown)",
                                  groups=groups_of(rows) if grouped else None, pairwise_weight=args.pairwise_weight,
                                  **match)
        model.config.problem_type = "single_label_classification"
    model.save_pretrained(staging)
    save_rm_tokenizer(tokenizer, staging, args.max_length)
    strong = load_reward_model(staging, device=args.device)
    metrics: dict[str, float] = {}
    for split, (prompts, responses, oracle) in eval_sets().items():
        rewards = expected_reward(score_logits(strong, prompts, responses, args.max_length, f"eval {split}")).tolist()
        for name, value in rank_metrics(rewards, oracle).items():
            metrics[f"{name}/oracle_{split}"] = value
    pseudo: list[dict[str, Any]] = []
    if args.pseudo_label:
        pseudo, line = _rollout_rows(settings, args.max_rollouts)
        print(line)
        if pseudo:
            logits = score_logits(strong, [r["prompt"] for r in pseudo], [r["response"] for r in pseudo],
                                  args.max_length, "pseudo-labelling")
            for row, reward, row_logits in zip(pseudo, expected_reward(logits).tolist(), logits.tolist(), strict=True):
                row["score"], row["logits"] = reward, row_logits
            with (staging / PSEUDO_LABELS_FILE).open("w", encoding="utf-8") as fh:
                for row in pseudo:
                    fh.write(json.dumps(row) + "\n")
    info = {"metrics": metrics, **growth,
            "config": {**vars(args), "func": None, "final_loss": loss, "init": str(init_dir),
                                           "data": str(data_path), "n_pairs": len(rows), "n_pseudo_labelled":
                                           len(pseudo), "train_seconds": round(time.perf_counter() - started, 1),
                                           "n_params": strong.n_params}}
    del strong
    entry = finalize_version(staging, [staging], "strong", args.out, settings, info)
    print(f"strong RM {entry.version} at {entry.path} (final loss {loss:.3f})")
    _print_metrics(metrics)
    if pseudo:
        print(f"  pseudo-labels: {len(pseudo)} rollouts -> {Path(entry.path) / PSEUDO_LABELS_FILE}")
    if registry is not None:
        registry.register(entry)
        print(f"registered {entry.version} (strata rm list)")
    return 0


# --- distill --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistillOptions:
    """One distillation run (what `strata rm distill` and `strata bench rm --distill` run).

    ``init``: ``auto`` starts from the strong RM's student init (the zoo's strong RM keeps its trunk
    before growth; so does a grown ``strata rm train-strong``) and else from a fresh model of
    ``n_embd`` x ``n_layer``; ``fresh``; or a directory (e.g. the light RM in service, to re-distil).
    ``steps`` and ``lr`` default to the zoo's light-RM recipe from an init, to a longer, faster
    schedule from scratch. ``swaps``: prompt swaps of the suite's train prompts (0 without zoo pairs).
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
    from strata.hashing import content_hash

    return share > 0 and int(content_hash(prompt)[:8], 16) / 0xFFFFFFFF < share


def eval_swaps(split: str = "eval", seed: int = EVAL_SEED) -> tuple[list[str], list[str], list[str]]:
    """Prompt swaps of a held-out split: responses, their own prompts, other prompts (prompt match)."""
    from strata.zoo.corpus import prompt_swaps
    from strata.zoo.suite import load_suite

    records = load_suite(split)
    swaps = prompt_swaps(records, seed, records)
    return [s.response for s in swaps], [s.record.text for s in swaps], [s.other.text for s in swaps]


def _student(init: str, strong: Any, strong_path: Path, options: DistillOptions, n_bins: int, seed: int) -> Any:
    """The model a light RM starts from, and what it is: ``fresh`` or the directory it was loaded from."""
    from transformers import GPT2ForSequenceClassification

    from strata.zoo.build import student_init_dir
    from strata.zoo.train import ModelShape, new_reward_model

    if init == "auto":
        found = student_init_dir(strong_path)
        init = str(found) if found is not None else "fresh"
    if init == "fresh":
        shape = ModelShape(options.n_embd, options.n_layer, options.n_head)
        n_positions = max(256, options.max_length)  # svc_reward reads up to 256 tokens by default
        return new_reward_model(strong.tokenizer, shape, n_positions, n_bins, seed), "fresh"
    try:
        model = GPT2ForSequenceClassification.from_pretrained(init, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CliError(f"--init {init}: not a GPT-2 sequence-classification RM ({exc})") from exc
    if model.config.num_labels != n_bins:
        raise CliError(f"--init {init} has {model.config.num_labels} score bins, the strong RM {n_bins}")
    if model.config.n_positions < options.max_length:
        raise CliError(f"--max-length {options.max_length} exceeds the {model.config.n_positions} positions of {init}")
    return model, init


def run_distill(options: DistillOptions, settings: Any, staging: Path) -> DistillResult:
    """Pseudo-label pairs with the strong RM, fit light RM(s) to its bin distributions, evaluate."""
    from tqdm import tqdm

    from strata.contract.template import format_rm_input
    from strata.models.loading import ModelLoadError, load_reward_model
    from strata.models.reward import expected_reward, prompt_match, save_rm_tokenizer
    from svc_reward.augment import augment_responses
    from svc_reward.distill import DistillConfig, comparison_metrics, rank_metrics, train_light
    from svc_reward.registry import describe

    zoo = _zoo(settings) if (options.strong is None or options.zoo_pairs) else None
    strong_path = Path(options.strong) if options.strong else zoo.rm_strong
    try:
        strong = load_reward_model(strong_path, device=options.device)
    except ModelLoadError as exc:
        raise CliError(str(exc)) from exc
    if strong.model.config.num_labels < 2:
        raise CliError(f"{strong_path} is a regression RM (1 logit): distillation needs score-bin logits")
    strong_version = describe("strong", [strong_path]).version
    cache_dir = Path(settings.cache_dir).expanduser() / "rm" / "logits"

    # 1. Pairs to pseudo-label: the zoo's RM pairs and prompt swaps, the user's files, historical rollouts.
    pairs: list[tuple[str, str]] = []
    sources: dict[str, Any] = {}
    rng = random.Random(options.seed)
    if options.zoo_pairs:
        from strata.zoo.build import distill_pairs
        from strata.zoo.suite import load_suite

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
    held_prompts: list[str] = []
    held_responses: list[str] = []
    if options.rollout_log:
        rows, line = _rollout_rows(settings, options.max_rollouts)
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
    # 2. Adversarial augmentation: perturbed copies, re-scored by the strong RM like the rest.
    augmented = 0
    if options.augment and options.augment_fraction > 0:
        chosen = rng.sample(range(len(pairs)), round(options.augment_fraction * len(pairs)))
        copies = augment_responses([pairs[i][1] for i in chosen], options.augment, 1, options.seed)
        pairs += [(pairs[chosen[c.index]][0], c.response) for c in copies]
        augmented = len(copies)
    prompts, responses = [p for p, _ in pairs], [r for _, r in pairs]
    print(f"distilling {strong_path} ({strong.n_params / 1e6:.1f}M params) on {len(pairs)} pairs "
          f"({augmented} augmented); sources {sources}")

    # 3. The strong RM's bin distributions: the targets (cached by weights and texts).
    teacher = score_logits(strong, prompts, responses, options.max_length, "strong RM pseudo-labels", cache_dir)
    texts = [format_rm_input(p, r) for p, r in pairs]

    # 4. Light RM(s): from the student init (or fresh), on the strong RM's tokenizer, fitted by KL.
    from strata.zoo.build import RM_LIGHT_TRAIN

    zoo_recipe = zoo.config.rm_light_train if zoo is not None else RM_LIGHT_TRAIN  # the schedule from an init
    members: list[Path] = []
    losses: list[float] = []
    started_from = ""
    for member in range(options.members):
        model, started_from = _student(options.init, strong, strong_path, options, teacher.shape[1],
                                       options.seed + member)
        warm = started_from != "fresh"
        steps = options.steps or (zoo_recipe.steps if warm else 700)
        lr = options.lr or (zoo_recipe.lr if warm else 3e-3)
        cfg = DistillConfig(steps=steps, batch_size=options.batch_size, lr=lr, temperature=options.temperature,
                            max_length=options.max_length, seed=options.seed + member)
        model.config.pad_token_id = strong.tokenizer.pad_token_id
        with tqdm(total=cfg.steps, desc=f"light RM {member + 1}/{options.members}", unit="step", leave=False) as bar:
            def report(step: int, loss: float, bar: Any = bar) -> None:
                bar.update(1)
                if step % 20 == 0:
                    bar.set_postfix(kl=f"{loss:.4f}")

            losses.append(train_light(model, strong.tokenizer, texts, teacher, cfg, report))
        out = staging if options.members == 1 else staging / f"member-{member}"
        model.config.problem_type = "single_label_classification"
        model.save_pretrained(out)
        save_rm_tokenizer(strong.tokenizer, out, options.max_length)
        members.append(out)

    # 5. Evaluation on held-out prompts: light vs strong and vs the oracle, eval and fresh splits; the
    # prompt match on eval prompt swaps; the rollout log's held-out pairs.
    light_rms = [load_reward_model(m, device=options.device) for m in members]
    light_scores, strong_scores, oracle_scores = {}, {}, {}
    for split, (p, r, oracle) in eval_sets().items():
        strong_scores[split] = expected_reward(score_logits(strong, p, r, options.max_length, f"strong {split}",
                                                            cache_dir)).tolist()
        light_scores[split] = mean_rewards(light_rms, p, r, options.max_length, f"light {split}")
        oracle_scores[split] = oracle
    metrics = comparison_metrics(light_scores, strong_scores, oracle_scores)
    match_swaps = eval_swaps()
    metrics["match/light_eval"] = prompt_match(light_rms, *match_swaps, options.max_length)
    metrics["match/strong_eval"] = prompt_match([strong], *match_swaps, options.max_length)
    held_strong: list[float] = []
    if held_prompts:
        held_strong = expected_reward(score_logits(strong, held_prompts, held_responses, options.max_length,
                                                   "strong held-out", cache_dir)).tolist()
        metrics |= {f"{name}/strong_log": value for name, value in rank_metrics(
            mean_rewards(light_rms, held_prompts, held_responses, options.max_length, "light held-out"),
            held_strong).items()}
    info = {
        "metrics": metrics, "parent": strong_version,
        "config": {**asdict(options), "strong": str(strong_path), "final_kl": losses, "n_pairs": len(pairs),
                   "n_augmented": augmented, "sources": sources, "light_params": light_rms[0].n_params,
                   "strong_params": strong.n_params, "init": started_from,
                   "loss": "T^2 * KL(strong || light) over score bins"},
    }
    return DistillResult(staging, members, metrics, info, strong_path, strong_version,
                         (held_prompts, held_responses, held_strong))


def serving_light(registry: Any, settings: Any) -> tuple[str, list[Path]]:
    """The light RM svc_reward serves: the version promoted last, else the zoo's (its default)."""
    promoted = registry.promoted() if registry is not None else None
    if promoted:
        return promoted, [Path(p) for p in registry.get(promoted).paths]
    from svc_reward.registry import describe

    path = _zoo(settings).rm_light
    return describe("light", [path]).version, [path]


def _distill(args: argparse.Namespace) -> int:
    settings = _settings()
    registry = open_registry(settings) if (args.register or args.promote or args.from_log) else None
    _set_threads(args.threads)
    strong = args.strong
    if strong and not Path(strong).expanduser().exists():
        # A registered strong version rather than a directory.
        if registry is None:
            raise CliError(f"no directory {strong}; to name a registered version, leave --register on")
        from svc_reward.registry import UnknownVersionError

        try:
            entry = registry.get(strong)
        except UnknownVersionError as exc:
            raise CliError(f"{strong} is neither a directory nor a registered version (strata rm list)") from exc
        if entry.kind != "strong":
            raise CliError(f"{strong} is a {entry.kind} version; --strong needs a strong one")
        strong = entry.path
    augment = tuple(a.strip() for a in args.augment.split(",") if a.strip() and a.strip() != "none")
    from svc_reward.augment import KINDS

    if unknown := set(augment) - set(KINDS):
        raise CliError(f"unknown augmentation(s) {sorted(unknown)}: use {', '.join(KINDS)} or none")
    if args.members < 1:
        raise CliError("--members must be at least 1")
    if not 0.0 <= args.hold_out < 1.0:
        raise CliError(f"--hold-out must be in [0, 1), got {args.hold_out}")
    if args.init not in ("auto", "fresh") and not (Path(args.init) / "config.json").is_file():
        raise CliError(f"--init {args.init}: not a model directory (no config.json); use auto, fresh or a "
                       "sequence-classification RM directory")
    init, hold_out, current = args.init, args.hold_out, None
    if args.from_log:
        # One turn of the loop: re-distil the light RM in service on newly logged rollouts labelled by
        # the strong RM; promote it if it agrees better with the strong RM on held-out logged prompts.
        if not args.rollout_log:
            raise CliError("--from-log reads the rollout log: drop --no-rollout-log")
        current = serving_light(registry, settings)
        if args.members != 1 or len(current[1]) != 1:
            raise CliError("--from-log re-distils a single light RM (the one in service is an ensemble, or "
                           "--members was given): use --init with one member instead")
        init = str(current[1][0]) if init == "auto" else init
        hold_out = hold_out or 0.2
        print(f"re-distilling {current[0]} (in service) from the rollout log; {hold_out:.0%} of its prompts held out")
    options = DistillOptions(
        strong=strong, data=tuple(str(p) for p in args.data), zoo_pairs=args.zoo_pairs,
        rollout_log=args.rollout_log, max_rollouts=args.max_rollouts, max_pairs=args.max_pairs, swaps=args.swaps,
        augment=augment, augment_fraction=args.augment_fraction, members=args.members, init=init,
        n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head, steps=args.steps, batch_size=args.batch_size,
        lr=args.lr, temperature=args.temperature, max_length=args.max_length, hold_out=hold_out, seed=args.seed,
        device=args.device,
    )
    staging = Path(settings.cache_dir).expanduser() / "rm" / f".staging-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    try:
        result = run_distill(options, settings, staging)
        if args.from_log and not result.held_out[0]:
            raise CliError("the rollout log has no held-out prompts to compare the versions on: run more "
                           "rollouts first (or raise --hold-out)")
        result.info["config"]["distill_seconds"] = round(time.perf_counter() - started, 1)
        entry = finalize_version(staging, result.members, "light", args.out, settings, result.info)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    where = Path(entry.path).parent if len(entry.paths) > 1 else entry.path
    print(f"light RM {entry.version} ({len(entry.paths)} member(s)) at {where}, distilled from "
          f"{result.strong_version} in {time.perf_counter() - started:.0f}s")
    _print_metrics(result.metrics)
    promote = args.promote
    if current is not None:
        better = _better_than_current(current, entry, result, options)
        promote = better and args.promote_if_better
        if better and not promote:
            print("not promoting it (--no-promote-if-better)")
    if registry is not None:
        registry.register(entry)
        print(f"registered {entry.version}; serve it with: strata rm promote {entry.version}")
        if promote:
            _promote_version(registry, settings, entry.version, verify=True)
    return 0


def _better_than_current(current: tuple[str, list[Path]], entry: Any, result: DistillResult,
                         options: DistillOptions) -> bool:
    """Whether the new light RM ranks the held-out logged pairs closer to the strong RM than the one in
    service does (Spearman), printing both."""
    from strata.models.loading import load_reward_model
    from svc_reward.distill import rank_metrics

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


# --- promote, list --------------------------------------------------------------------------------


def _promote_version(registry: Any, settings: Any, version: str, verify: bool) -> None:
    from strata.bus import Publisher, PublishError
    from svc_reward.registry import RegistryError

    try:
        publisher = Publisher(settings.kafka_address, client_id="strata-rm-promote")
    except Exception as exc:  # kafka-python raises NoBrokersAvailable and friends
        raise CliError(f"Kafka at {settings.kafka_address} does not answer ({exc}): run `strata infra up`") from exc
    try:
        event = registry.promote(version, publisher, verify=verify)
    except RegistryError as exc:
        raise CliError(str(exc)) from exc
    except PublishError as exc:
        raise CliError(f"the promotion was not acknowledged by Kafka: {exc}") from exc
    finally:
        publisher.close()
    print(f"promoted {event.rm_version}: svc_reward replicas swap to it between batches "
          f"({len(event.ensemble_paths)} member(s), checksum {event.checksum[:12]})")


def _promote(args: argparse.Namespace) -> int:
    settings = _settings()
    _promote_version(open_registry(settings), settings, args.version, args.verify)
    return 0


def _list(args: argparse.Namespace) -> int:
    settings = _settings()
    registry = open_registry(settings)
    entries = registry.list(args.kind)
    promoted = registry.promoted()
    if args.json:
        print(json.dumps([asdict(e) | {"serving": e.version == promoted} for e in entries], indent=2, default=str))
        return 0
    if not entries:
        print("no RM versions registered yet: strata rm train-strong / strata rm distill")
        return 0
    print(f"  {'version':20s} {'kind':6s} {'registered':19s} {'members':>7s} {'spearman/strong':>15s} "
          f"{'spearman/oracle':>15s}  {'distilled from':20s} path")
    for e in entries:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.registered_at))
        vs_strong = e.metrics.get("spearman/strong_eval")
        vs_oracle = e.metrics.get("spearman/oracle_eval")
        print(f"{'*' if e.version == promoted else ' '} {e.version:20s} {e.kind:6s} {when:19s} {len(e.paths):>7d} "
              f"{_fmt(vs_strong):>15s} {_fmt(vs_oracle):>15s}  {e.parent or '-':20s} {e.path}")
    if promoted:
        print(f"* promoted last (what svc_reward serves): {promoted}")
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
