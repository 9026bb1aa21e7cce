"""Distillation of the strong RM into a light RM (R6). Pure torch: no Kafka, Redis or gRPC.

What is matched: a Strata RM's head gives logits over score bins on [0, 5] (``strata.models.reward``,
11 bins by default), and its reward is the expected score under their softmax. The light RM is
trained to fit the strong RM's whole *distribution* over those bins, not only its mean: per
(prompt, response) the loss is

    KL(p_strong || p_light) = sum_b p_strong[b] * (log p_strong[b] - log p_light[b]),
    p = softmax(logits / T)

with a distillation temperature ``T`` (Hinton et al. 2015, "Distilling the Knowledge in a Neural
Network"): T > 1 softens both distributions so the light RM also learns how the strong RM spreads
its mass over the neighbouring bins; the batch loss is multiplied by T^2 so gradient sizes do not
depend on T. A distribution (rather than a mean and variance) keeps multimodal judgements ("either
2 or 4") that a Gaussian would blur, and it is what svc_reward's scoring temperature acts on (R8).

The light RM is a small GPT-2 sequence classifier sharing the strong RM's tokenizer (see
``docs/reward-models.md`` for the sizes); it trains from scratch, on the strong RM's logits for
pseudo-labelled pairs, with length-bucketed batches (little padding), AdamW, warm-up then cosine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from strata.contract.template import RM_MAX_LENGTH
from strata.models.training import ModelShape
from strata_tools.rm.train import collate, length_buckets, rm_text_ids

# --- the loss -------------------------------------------------------------------------------------


def kl_per_pair(strong_logits: torch.Tensor, light_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(N, bins), (N, bins) -> (N,) KL(softmax(strong / T) || softmax(light / T)) in nats."""
    if temperature <= 0:
        raise ValueError("distillation temperature must be > 0")
    if strong_logits.shape != light_logits.shape:
        raise ValueError(f"strong logits {tuple(strong_logits.shape)} and light logits "
                         f"{tuple(light_logits.shape)} must have the same shape (same score bins)")
    log_p = F.log_softmax(strong_logits.float() / temperature, dim=-1)  # (N, bins) teacher
    log_q = F.log_softmax(light_logits.float() / temperature, dim=-1)  # (N, bins) student
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def distill_loss(strong_logits: torch.Tensor, light_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Batch loss: T^2 * mean over pairs of KL(strong || light) (Hinton's scaling)."""
    return temperature**2 * kl_per_pair(strong_logits, light_logits, temperature).mean()


# --- the training loop ----------------------------------------------------------------------------


@dataclass(frozen=True)
class DistillConfig:
    """Everything one distillation run depends on; stored with the light RM it produces."""

    shape: ModelShape = field(default_factory=lambda: ModelShape(n_embd=64, n_layer=2, n_head=2))
    steps: int = 900
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 40
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    temperature: float = 2.0  # distillation temperature T (not svc_reward's scoring temperature)
    max_length: int = RM_MAX_LENGTH  # tokens of the RM input the light RM reads (as many as the zoo's strong RM)
    seed: int = 0


def lr_at(step: int, cfg: DistillConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to lr/10."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def train_light(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    teacher_logits: torch.Tensor,
    cfg: DistillConfig,
    on_step: Callable[[int, float], None] | None = None,
) -> float:
    """Fit ``model`` (a sequence classifier over the same bins) to the teacher's logits.

    ``texts`` are RM inputs (``format_rm_input``); ``teacher_logits`` is (N, bins). Trains in place
    and returns the final loss (an exponential moving average); ``on_step(step, loss)`` reports
    progress.
    """
    if len(texts) != teacher_logits.shape[0]:
        raise ValueError("one row of teacher logits per text")
    if model.config.num_labels != teacher_logits.shape[1]:
        raise ValueError(f"the light RM has {model.config.num_labels} bins, the strong RM {teacher_logits.shape[1]}")
    rng = random.Random(cfg.seed)
    encoded = rm_text_ids(tokenizer, texts, cfg.max_length)
    buckets = length_buckets([len(e) for e in encoded], cfg.batch_size)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    model.train()
    loss_ema = float("nan")
    for step in range(cfg.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)
        rows = rng.choice(buckets)
        ids, mask = collate(encoded, rows, tokenizer.pad_token_id)  # (B, T)
        light = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits  # (B, bins)
        loss = distill_loss(teacher_logits[rows].to(light.device), light, cfg.temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        loss_ema = loss.item() if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * loss.item()
        if on_step is not None:
            on_step(step, loss_ema)
    model.eval()
    return loss_ema


def in_length_order(
    score: Callable[[list[str], list[str]], torch.Tensor],
    prompts: Sequence[str],
    responses: Sequence[str],
    chunk: int = 256,
    on_chunk: Callable[[int], None] | None = None,
) -> torch.Tensor:
    """``score(prompts, responses) -> (n, bins)`` applied chunk by chunk in length order (less padding).

    Returns the rows in the original order; ``on_chunk(n)`` reports how many pairs were done.
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + len(responses[i]))
    parts: list[torch.Tensor] = []
    for start in range(0, len(order), chunk):
        rows = order[start : start + chunk]
        parts.append(score([prompts[i] for i in rows], [responses[i] for i in rows]))
        if on_chunk is not None:
            on_chunk(len(rows))
    if not parts:
        return torch.zeros(0, 0)
    stacked = torch.cat(parts)  # (N, bins) in length order
    out = torch.empty_like(stacked)
    out[torch.tensor(order)] = stacked
    return out


# --- evaluation -----------------------------------------------------------------------------------


def rank_metrics(predicted: Sequence[float], reference: Sequence[float]) -> dict[str, float]:
    """Spearman and Pearson correlation of ``predicted`` against ``reference`` (nan when constant)."""
    from scipy.stats import pearsonr, spearmanr

    if len(predicted) != len(reference):
        raise ValueError("predicted and reference must have the same length")
    if len(predicted) < 2 or len(set(predicted)) < 2 or len(set(reference)) < 2:
        return {"spearman": float("nan"), "pearson": float("nan")}
    return {"spearman": float(spearmanr(predicted, reference).statistic),
            "pearson": float(pearsonr(predicted, reference).statistic)}


def comparison_metrics(
    light: dict[str, Sequence[float]], strong: dict[str, Sequence[float]], oracle: dict[str, Sequence[float]],
) -> dict[str, float]:
    """Per split (``eval``, ``fresh``...): the light RM against the strong RM and the oracle, and the
    strong RM against the oracle. Keys: ``spearman/strong_eval``, ``pearson/oracle_fresh``,
    ``strong/spearman/oracle_eval``...
    """
    metrics: dict[str, float] = {}
    for split in light:
        for name, value in rank_metrics(light[split], strong[split]).items():
            metrics[f"{name}/strong_{split}"] = value
        for name, value in rank_metrics(light[split], oracle[split]).items():
            metrics[f"{name}/oracle_{split}"] = value
        for name, value in rank_metrics(strong[split], oracle[split]).items():
            metrics[f"strong/{name}/oracle_{split}"] = value
    return metrics
