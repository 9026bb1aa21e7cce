"""Training a binned reward model: two-hot cross-entropy on score bins, an in-group Bradley-Terry
ranking loss, optional feature heads and match steps (``train_reward_model``), and the inputs as
serving reads them (``rm_text_ids``). The strong-RM recipe (``strata_tools.rm.recipe``) calls it for the zoo
build and for ``strata rm train-strong`` alike.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import (
    GPT2ForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from strata.models.prompts import PromptFormat
from strata.models.reward import expected_reward, two_hot
from strata.models.training import ModelShape, TrainConfig, gpt2_config, make_optimizer, optimizer_step

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeatureLabels:
    """Per-text class labels of one auxiliary RM feature (``train_reward_model``); -1 = none."""

    labels: Sequence[int]
    n_classes: int


@dataclass(frozen=True)
class MatchPool:
    """Texts for the match steps of ``train_reward_model``, in pairs: rows 2k and 2k+1 are one answer
    under the prompt it answers and under another prompt, with their oracle scores and feature labels."""

    texts: Sequence[str]
    scores: Sequence[float]
    features: Mapping[str, FeatureLabels]


def new_reward_model(
    tokenizer: PreTrainedTokenizerFast, shape: ModelShape, n_positions: int, n_bins: int, seed: int
) -> GPT2ForSequenceClassification:
    torch.manual_seed(seed)
    return GPT2ForSequenceClassification(gpt2_config(tokenizer, shape, n_positions, num_labels=n_bins))


def rm_text_ids(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int) -> list[list[int]]:
    """Token ids of RM inputs as serving reads them (``strata.models.reward``): with the special tokens
    the tokenizer adds ([CLS] ... [SEP] for a BERT-style trunk; none for the zoo's BPE), truncated."""
    add_special = PromptFormat.of(tokenizer).add_special_tokens
    return tokenizer(list(texts), add_special_tokens=add_special, truncation=True, max_length=max_length)["input_ids"]


def length_buckets(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (sorted by length, then cut)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def collate(encoded: Sequence[Sequence[int]], rows: Sequence[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded input ids and attention mask of ``rows``: (B, T), (B, T)."""
    width = max(1, max(len(encoded[i]) for i in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, i in enumerate(rows):
        ids[j, : len(encoded[i])] = torch.tensor(encoded[i], dtype=torch.long)
        mask[j, : len(encoded[i])] = 1
    return ids, mask


def head_parameters(model: PreTrainedModel) -> frozenset[int]:
    """``id``s of a sequence classifier's parameters outside its base model: the score head."""
    prefix = model.base_model_prefix + "."
    return frozenset(id(p) for name, p in model.named_parameters() if not name.startswith(prefix))


def lower_modules(model: PreTrainedModel, layers: int) -> list[torch.nn.Module]:
    """The trunk's embeddings and its lowest ``layers`` blocks: BERT's ``embeddings`` and ``encoder.layer``,
    GPT-2's ``wte``, ``wpe`` and ``h``. ValueError for another trunk, or a count that leaves no block to train."""
    base: Any = model.base_model
    encoder = getattr(base, "encoder", None)
    blocks = getattr(encoder, "layer", None) if encoder is not None else getattr(base, "h", None)
    if blocks is None or not hasattr(base, "embeddings" if encoder is not None else "wte"):
        raise ValueError(f"frozen layers work on BERT and GPT-2 trunks, not on a {type(base).__name__}: train it "
                         "with none frozen")
    if layers >= len(blocks):
        raise ValueError(f"frozen layers must leave a block of the trunk's {len(blocks)} to train, got {layers}")
    embeddings = [base.embeddings] if encoder is not None else [base.wte, base.wpe]
    return [*embeddings, *blocks[:layers]]


def freeze_lower_layers(model: PreTrainedModel, layers: int) -> int:
    """Stop training the trunk's embeddings and its lowest ``layers`` blocks (``lower_modules``); returns the
    parameters left to train. A pretrained trunk's lower blocks read words and syntax the score needs as they
    are: frozen, the backward pass and the optimiser stop above them."""
    for module in lower_modules(model, layers) if layers > 0 else []:
        module.requires_grad_(False)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def pairwise_loss(rewards: torch.Tensor, scores: torch.Tensor, margin: float) -> torch.Tensor:
    """Bradley-Terry loss over the ordered pairs of one group: (n,) rewards and oracle scores -> scalar.

    Every pair whose oracle scores differ by more than ``margin`` contributes ``-log sigmoid(r_i - r_j)``
    with i the better response (InstructGPT's RM loss); zero when no pair qualifies.
    """
    better = (scores[:, None] - scores[None, :]) > margin  # (n, n): i clearly better than j
    if not bool(better.any()):
        return rewards.new_zeros(())
    return F.softplus(-(rewards[:, None] - rewards[None, :])[better]).mean()


def train_reward_model(
    model: GPT2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerFast,
    texts: Sequence[str],
    scores: Sequence[float],
    max_length: int,
    cfg: TrainConfig,
    seed: int,
    desc: str,
    groups: Sequence[Sequence[int]] | None = None,
    pairwise_weight: float = 0.0,
    pairwise_margin: float = 0.25,
    features: Mapping[str, FeatureLabels] | None = None,
    feature_weight: float = 0.0,
    match_pools: Callable[[int], MatchPool] | None = None,
    match_pairs: int = 0,
    head_lr_scale: float = 1.0,
    frozen_layers: int = 0,
) -> float:
    """Cross-entropy of the RM's bin logits against two-hot targets of the oracle ``scores``, plus,
    with ``groups``, a pairwise ranking loss inside each group.

    Without ``groups`` each step takes ``cfg.batch_size`` texts of similar length. With ``groups``
    (lists of indices into ``texts``: responses to one prompt, typically a reference and degradations
    of it) each step takes ``cfg.batch_size`` whole groups of similar length, and
    ``pairwise_weight`` times the Bradley-Terry loss of each group is added: comparing answers to the
    same prompt that differ in one way teaches what the score depends on far faster than scores of
    unrelated texts (on the zoo task: Spearman 0.70 -> 0.77 at about the same compute).

    Some scores compare two parts of the input: does the answer follow the prompt's intent, is it
    about the prompt's subject? Such a score is an *interaction* of a prompt feature and an answer
    feature; from an untrained head its gradient is the product of two near-zero terms, a saddle the
    losses above do not leave (the zoo's RMs rated an answer the same under any prompt). Two aids:

    - ``features`` (name -> per-text class labels): a linear *feature head* per name reads the pooled
      state the score head reads, and ``feature_weight`` times their cross-entropy is added. Each side
      (the prompt's intent, the answer's subject...) gets a first-order signal. The heads exist only
      during training.
    - ``match_pools`` with ``match_pairs``: after every grouped step, a *match step* on the next
      ``match_pairs`` pairs of the current pool (pool ``k`` is fetched when pool ``k - 1`` runs out):
      each answer under its own prompt and under another (two-hot cross-entropy on their oracle scores,
      Bradley-Terry own > other, and the feature heads on the pool's labels). It has an AdamW of its
      own over the same weights: sharing one, the weak match gradient was scaled down by the strong,
      easy signals of the degradations (task-wise Adam). On the zoo task this took the probe-sized RM
      from Spearman 0.77 to 0.82-0.84 and its prompt match from 0.49 to 0.77-0.88 (docs/model-zoo.md).

    ``head_lr_scale`` multiplies the learning rate of the parameters outside the base model (the score
    head, and the feature heads): a pretrained trunk wants a small rate, its fresh head a large one.
    ``frozen_layers``: the trunk's embeddings and lowest blocks stay as they are (``freeze_lower_layers``);
    on a BERT trunk without match steps their output is computed once per text and the steps run only the
    blocks above (``_FrozenTrunk``).
    """
    rng = random.Random(seed)
    encoded = rm_text_ids(tokenizer, texts, max_length)
    # A batch is a random window of ``batch_size`` units (single texts, or whole groups) in length
    # order, so that padding stays small and any unit can meet any of its length neighbours.
    units = [[i] for i in range(len(texts))] if groups is None else [list(g) for g in groups if g]
    units.sort(key=lambda unit: max(len(encoded[i]) for i in unit))
    window = min(cfg.batch_size, len(units))
    for name, labels in (features or {}).items():
        if len(labels.labels) != len(texts):
            raise ValueError(f"feature {name!r} has {len(labels.labels)} labels for {len(texts)} texts")
    if match_pools is not None and match_pairs < 1:
        raise ValueError(f"match steps need match_pairs >= 1, got {match_pairs}")
    heads = torch.nn.ModuleDict({
        name: torch.nn.Linear(model.config.hidden_size, labels.n_classes) for name, labels in (features or {}).items()
    })
    trained = torch.nn.ModuleList([model, heads])  # the feature heads are optimised alongside, then dropped
    head = head_parameters(model) | {id(p) for p in heads.parameters()}
    ranking_weight = pairwise_weight if groups is not None else 0.0
    # Match steps read other texts, and the feature heads every hidden state: neither runs on the cache.
    cache = match_pools is None and not features
    with _FrozenTrunk(model, frozen_layers, tokenizer, encoded, cache, desc) as trunk:
        loss_ema = _train_steps(model, tokenizer, encoded, scores, units, window, cfg, rng, desc, trunk, heads,
                                trained, head, head_lr_scale, ranking_weight, pairwise_margin, features,
                                feature_weight, _Matcher(match_pools, match_pairs, tokenizer, max_length)
                                if match_pools is not None else None)
    logger.info("%s: %d steps%s, final loss %.3f", desc, cfg.steps,
                f" (+ {cfg.steps} match steps of {match_pairs} pairs)" if match_pools is not None else "", loss_ema)
    return loss_ema


def _train_steps(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, encoded: Sequence[Sequence[int]],
                 scores: Sequence[float], units: Sequence[Sequence[int]], window: int, cfg: TrainConfig,
                 rng: random.Random, desc: str, trunk: _FrozenTrunk, heads: torch.nn.ModuleDict,
                 trained: torch.nn.Module, head: frozenset[int], head_lr_scale: float, ranking_weight: float,
                 pairwise_margin: float, features: Mapping[str, FeatureLabels] | None, feature_weight: float,
                 matcher: _Matcher | None) -> float:
    """``train_reward_model``'s steps once its units, heads and frozen trunk are set; the final loss EMA.
    ``ranking_weight``: the in-group Bradley-Terry loss's (0: none)."""
    n_bins = int(model.config.num_labels)
    optimizer = make_optimizer(trained, cfg, head, head_lr_scale)
    match_optimizer = make_optimizer(trained, cfg, head, head_lr_scale) if matcher is not None else None
    trunk.train()
    loss_ema = float("nan")
    bar = tqdm(range(cfg.steps), desc=desc, unit="step", leave=False)
    for step in bar:
        start = rng.randrange(len(units) - window + 1)
        chosen = units[start : start + window]
        rows = [i for g in chosen for i in g]
        target_scores = torch.tensor([scores[i] for i in rows], dtype=torch.float32)  # (B,)
        trunk.feed(rows)
        logits, pooled = _score(model, tokenizer, [encoded[i] for i in rows], bool(heads))
        loss = -(two_hot(target_scores, n_bins) * F.log_softmax(logits, dim=-1)).sum(-1).mean()
        if heads and feature_weight > 0:
            loss = loss + feature_weight * _features_loss(heads, pooled, {
                name: [labels.labels[i] for i in rows] for name, labels in (features or {}).items()})
        if ranking_weight > 0:
            rewards = expected_reward(logits)  # (B,)
            bounds = [0, *itertools.accumulate(len(g) for g in chosen)]
            ranking = torch.stack([
                pairwise_loss(rewards[a:b], target_scores[a:b], pairwise_margin)
                for a, b in itertools.pairwise(bounds)
            ]).mean()
            loss = loss + ranking_weight * ranking
        loss_ema = optimizer_step(trained, optimizer, loss, cfg, step, loss_ema)
        if matcher is not None and match_optimizer is not None:
            ids, match_scores, match_labels = matcher.next_batch()
            match_logits, match_pooled = _score(model, tokenizer, ids, bool(heads))
            rewards = expected_reward(match_logits)  # (2P,): own, other, own, other...
            match_loss = (-(two_hot(match_scores, n_bins) * F.log_softmax(match_logits, dim=-1)).sum(-1).mean()
                          + F.softplus(-(rewards[0::2] - rewards[1::2])).mean())
            if heads and feature_weight > 0:
                match_loss = match_loss + feature_weight * _features_loss(heads, match_pooled, match_labels)
            optimizer_step(trained, match_optimizer, match_loss, cfg, step, float("nan"))
        bar.set_postfix(loss=f"{loss_ema:.3f}", refresh=False)  # drawn at the bar's own pace
    model.eval()
    return loss_ema


class _CachedOutput(torch.nn.Module):
    """Stands in for a trunk's embeddings: returns the batch of hidden states it was fed (any arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.next: torch.Tensor | None = None

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        out, self.next = self.next, None
        if out is None:
            raise RuntimeError("the frozen trunk's cached output was not fed before this forward pass")
        return out


class _FrozenTrunk:
    """A training run's frozen trunk (``freeze_lower_layers``), and on a BERT trunk with ``cache`` its lower
    part's output per text, computed once in eval mode: the model's embeddings are swapped for those states
    and its block list cut to the blocks above, so a step runs only what trains. Frozen modules run in eval
    mode either way (no dropout where nothing learns). Every weight's ``requires_grad`` and the model's
    modules are as they came when the run ends, or when setting up fails."""

    def __init__(self, model: PreTrainedModel, layers: int, tokenizer: PreTrainedTokenizerFast,
                 encoded: Sequence[Sequence[int]], cache: bool, desc: str) -> None:
        self.model, self.layers, self.tokenizer, self.encoded, self.desc = model, layers, tokenizer, encoded, desc
        self.cache = cache and layers > 0 and getattr(model.base_model, "encoder", None) is not None
        self.frozen: list[torch.nn.Module] = []
        self.states: list[torch.Tensor] = []
        self.stand_in = _CachedOutput()
        self.swapped = False

    def __enter__(self) -> _FrozenTrunk:
        self.was_frozen = [p for p in self.model.parameters() if not p.requires_grad]
        try:
            trainable = freeze_lower_layers(self.model, self.layers)
            if self.layers <= 0:
                return self
            self.frozen = lower_modules(self.model, self.layers)
            size = sum(map(len, self.encoded)) * self.model.config.hidden_size * 4
            if self.cache and size > _CACHE_LIMIT_BYTES:
                logger.info("%s: the frozen blocks' output would take %.1f GB: run them at each step instead",
                            self.desc, size / 1e9)
                self.cache = False
            if self.cache:
                self._swap_in_cache()
        except BaseException:
            self.__exit__()
            raise
        logger.info("%s: embeddings and the lowest %d blocks frozen%s, %.1fM parameters train", self.desc,
                    self.layers, f" (their output cached per text, {size / 1e9:.1f} GB)" if self.cache else "",
                    trainable / 1e6)
        return self

    def _swap_in_cache(self) -> None:
        base: Any = self.model.base_model
        blocks = base.encoder.layer
        base.encoder.layer = blocks[: self.layers]
        try:
            self.states = self._lower_states()
        finally:
            base.encoder.layer = blocks
        self.embeddings, self.blocks = base.embeddings, blocks
        base.embeddings, base.encoder.layer = self.stand_in, blocks[self.layers:]
        self.swapped = True

    def _lower_states(self) -> list[torch.Tensor]:
        """Each text's hidden states after the frozen blocks (T_i, H), in eval mode, in length-sorted chunks."""
        states: list[torch.Tensor] = [torch.empty(0)] * len(self.encoded)
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for rows in length_buckets([len(ids) for ids in self.encoded], 64):
                    x, mask = collate(self.encoded, rows, self.tokenizer.pad_token_id)
                    hidden = self.model.base_model(input_ids=x, attention_mask=mask).last_hidden_state
                    for j, i in enumerate(rows):
                        states[i] = hidden[j, : len(self.encoded[i])].clone()
        finally:
            self.model.train(training)
        return states

    def train(self) -> None:
        """The model in training mode, its frozen modules in eval mode."""
        self.model.train()
        for module in self.frozen:
            module.eval()

    def feed(self, rows: Sequence[int]) -> None:
        """The next forward pass's frozen output: these texts' cached states, right-padded as ``_score`` pads."""
        if not self.swapped:
            return
        chosen = [self.states[i] for i in rows]
        batch = chosen[0].new_zeros(len(chosen), max(len(s) for s in chosen), chosen[0].shape[-1])
        for j, state in enumerate(chosen):
            batch[j, : len(state)] = state
        self.stand_in.next = batch

    def __exit__(self, *exc: object) -> None:
        if self.swapped:
            base: Any = self.model.base_model
            base.embeddings, base.encoder.layer = self.embeddings, self.blocks
            self.states, self.swapped = [], False
        for param in self.model.parameters():
            param.requires_grad_(True)
        for param in self.was_frozen:
            param.requires_grad_(False)


# Above this the frozen blocks' outputs are not cached (fp32; the default zoo's strong RM data holds ~1.7 GB).
_CACHE_LIMIT_BYTES = 6 * 2**30


def _score(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, ids: Sequence[Sequence[int]],
           pooled: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Bin logits (B, n_bins) of right-padded token lists, and the pooled last hidden state (B, H) the
    score head reads when ``pooled`` (for the feature heads)."""
    x, mask = collate(ids, range(len(ids)), tokenizer.pad_token_id)  # (B, T), right-padded
    out = model(input_ids=x, attention_mask=mask, output_hidden_states=pooled)
    if not pooled:
        return out.logits, None
    return out.logits, out.hidden_states[-1][torch.arange(len(ids)), mask.sum(1) - 1]


def _features_loss(heads: torch.nn.ModuleDict, pooled: torch.Tensor | None,
                   labels: Mapping[str, Sequence[int]]) -> torch.Tensor:
    """Summed cross-entropy of the feature heads; label -1 (no such feature in this text) is left out."""
    assert pooled is not None, "feature heads need the pooled state"
    losses = []
    for name, head in heads.items():
        target = torch.tensor(labels[name], dtype=torch.long)
        if bool((target >= 0).any()):
            losses.append(F.cross_entropy(head(pooled), target, ignore_index=-1))
    return torch.stack(losses).sum() if losses else pooled.new_zeros(())


class _Matcher:
    """Serves the match steps' batches: the next ``pairs`` pairs of the current pool, in order,
    tokenised once per pool; pool ``k + 1`` is fetched when pool ``k`` runs out."""

    def __init__(self, pools: Callable[[int], MatchPool], pairs: int, tokenizer: PreTrainedTokenizerFast,
                 max_length: int) -> None:
        self.pools, self.pairs, self.tokenizer, self.max_length = pools, pairs, tokenizer, max_length
        self.index = -1
        self.position = 0
        self.pool: MatchPool | None = None
        self.ids: list[list[int]] = []

    def _next_pool(self) -> None:
        self.index += 1
        pool = self.pools(self.index)
        if len(pool.texts) < 2 * self.pairs or len(pool.texts) % 2 or len(pool.scores) != len(pool.texts):
            raise ValueError(f"match pool {self.index} must hold pairs of texts with their scores, at least "
                             f"{self.pairs} pairs; got {len(pool.texts)} texts and {len(pool.scores)} scores")
        for name, labels in pool.features.items():
            if len(labels.labels) != len(pool.texts):
                raise ValueError(f"match pool feature {name!r} has {len(labels.labels)} labels for "
                                 f"{len(pool.texts)} texts")
        self.pool, self.position = pool, 0
        self.ids = rm_text_ids(self.tokenizer, pool.texts, self.max_length)

    def next_batch(self) -> tuple[list[list[int]], torch.Tensor, dict[str, list[int]]]:
        if self.pool is None or self.position + 2 * self.pairs > len(self.pool.texts):
            self._next_pool()
        assert self.pool is not None
        rows = range(self.position, self.position + 2 * self.pairs)
        self.position += 2 * self.pairs
        scores = torch.tensor([self.pool.scores[i] for i in rows], dtype=torch.float32)
        labels = {name: [feature.labels[i] for i in rows] for name, feature in self.pool.features.items()}
        return [self.ids[i] for i in rows], scores, labels
