"""What every training loop here shares: model shapes, the schedule (linear warm-up, cosine decay to a
tenth), AdamW with decay on matrices only and a faster head, and one clipped optimiser step.

The zoo's LMs (``strata_tools.zoo.train``) and the reward models (``strata_tools.rm.train``, ``strata_tools.rm.recipe``)
train with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GPT2Config, PreTrainedTokenizerFast


@dataclass(frozen=True)
class ModelShape:
    n_embd: int
    n_layer: int
    n_head: int


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int
    lr: float
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0


def gpt2_config(tokenizer: PreTrainedTokenizerFast, shape: ModelShape, n_positions: int, **extra: Any) -> GPT2Config:
    # Dropout is off for these short pretraining runs; rollout dropout (R17) is set at generation time.
    return GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))  # cosine down to lr/10


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, head: frozenset[int] = frozenset(),
               head_lr_scale: float = 1.0) -> torch.optim.Optimizer:
    """AdamW, weight decay on matrices only; the parameters in ``head`` (by ``id``) learn at
    ``head_lr_scale`` times the schedule's rate (a fresh head on a pretrained trunk)."""
    groups = []
    for in_head, scale in ((False, 1.0), (True, head_lr_scale)):
        params = [p for p in model.parameters() if (id(p) in head) == in_head and p.requires_grad]
        groups += [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay, "lr_scale": scale},
                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0, "lr_scale": scale}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(0.9, 0.95))


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor, cfg: TrainConfig,
                   step: int, loss_ema: float) -> float:
    """Optimiser step ``step`` of the schedule (warm-up, cosine; clipped gradients); returns the loss EMA."""
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr_at(step, cfg) * param_group.get("lr_scale", 1.0)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.item() if math.isnan(loss_ema) else 0.95 * loss_ema + 0.05 * loss.item()
