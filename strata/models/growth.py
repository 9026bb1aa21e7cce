"""Growing a trained model into a larger one that computes the same function (Net2Net-style): more
GPT-2 blocks (``deepen``), or every width multiplied (``widen`` for GPT-2, ``widen_bert`` for a BERT
trunk). The zoo grows Level-2 and the strong RM with it; ``strata rm train-strong`` grows its RMs.
"""

from __future__ import annotations

import copy
import math
from typing import cast

import torch
from transformers import (
    GPT2ForSequenceClassification,
    GPT2PreTrainedModel,
    PreTrainedModel,
)
from transformers.pytorch_utils import Conv1D


def deepen(model: GPT2PreTrainedModel, extra_layers: int, seed: int) -> GPT2PreTrainedModel:
    """``model`` (a GPT-2 LM or sequence classifier) with ``extra_layers`` new blocks on top, computing
    exactly the same function.

    The new blocks start with zero output projections (attention and MLP ``c_proj``), so each adds
    nothing to the residual stream until trained (as in ReZero/Fixup); the rest is copied. Training
    the deeper model from there is the cheap way to a bigger LM on a small compute budget
    (progressive stacking): it starts where the trained one ends instead of from noise.
    """
    if extra_layers < 1:
        raise ValueError(f"extra_layers must be at least 1, got {extra_layers}")
    config = copy.deepcopy(model.config)
    config.n_layer = model.config.n_layer + extra_layers
    torch.manual_seed(seed)
    deeper = type(model)(config)
    result = deeper.load_state_dict(model.state_dict(), strict=False)
    if result.unexpected_keys:  # every trained weight must land somewhere
        raise ValueError(f"cannot deepen: weights with no place in the deeper model: {result.unexpected_keys}")
    with torch.no_grad():
        for index in range(model.config.n_layer, config.n_layer):
            for name in ("attn.c_proj", "mlp.c_proj"):
                projection = cast(Conv1D, deeper.get_submodule(f"transformer.h.{index}.{name}"))
                projection.weight.zero_()
                projection.bias.zero_()
    deeper.tie_weights()
    return deeper


def widen(model: GPT2PreTrainedModel, factor: int, seed: int, noise: float = 1e-3) -> GPT2PreTrainedModel:
    """``model`` with every width multiplied by ``factor`` (residual stream, heads, MLP), computing the
    same function up to ``noise`` (Net2WiderNet, Chen et al. 2016, for GPT-2).

    The residual stream becomes ``factor`` copies of itself: LayerNorm's mean and variance over copies
    are those of the original, so every LayerNorm output is the copied original too. A linear layer
    reading the stream takes its original rows divided by ``factor`` in each copy (the copies sum back
    to the original input); one writing to it, or to the MLP's hidden units, repeats its columns. Each
    head keeps its place and gets ``factor`` times the dimensions, with queries scaled by
    ``1/sqrt(factor)`` so that ``q.k / sqrt(head_dim)`` is unchanged. Copies that start equal get
    equal gradients and would stay copies, so ``noise`` (relative to each weight's scale, seeded)
    breaks the tie. The number of heads is kept.
    """
    if factor < 2:
        raise ValueError(f"factor must be at least 2, got {factor}")
    if not isinstance(model, GPT2ForSequenceClassification):
        # An LM's output head is tied to its input embedding: one matrix cannot both write the copies
        # and read them back divided by ``factor``.
        raise ValueError(f"widen takes a GPT-2 sequence classifier (a reward model), got {type(model).__name__}")
    old = model.config
    d, n_head = old.n_embd, old.n_head
    head_dim = d // n_head
    config = copy.deepcopy(old)
    config.n_embd = d * factor
    if old.n_inner:
        config.n_inner = old.n_inner * factor
    wider = type(model)(config)

    def read(weight: torch.Tensor, dim: int) -> torch.Tensor:  # a weight reading the stream along ``dim``
        return torch.cat([weight / factor] * factor, dim=dim)

    def write(weight: torch.Tensor, dim: int) -> torch.Tensor:  # a weight writing to a widened output
        return torch.cat([weight] * factor, dim=dim)

    def per_head(weight: torch.Tensor) -> torch.Tensor:  # (..., d) in head order -> (..., factor * d)
        heads = weight.reshape(*weight.shape[:-1], n_head, 1, head_dim)
        return heads.expand(*weight.shape[:-1], n_head, factor, head_dim).reshape(*weight.shape[:-1], d * factor)

    source = model.state_dict()
    target: dict[str, torch.Tensor] = {}
    for name, value in source.items():
        if name.endswith(("wte.weight", "wpe.weight")):
            target[name] = write(value, 1)
        elif name.endswith(("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "ln_f.weight", "ln_f.bias")):
            target[name] = write(value, 0)
        elif name.endswith("attn.c_attn.weight") or name.endswith("attn.c_attn.bias"):
            q, k, v = value.split(d, dim=-1)
            q = q / math.sqrt(factor)
            parts = [per_head(part) for part in (q, k, v)]
            joined = torch.cat(parts, dim=-1)
            target[name] = read(joined, 0) if value.dim() == 2 else joined
        elif name.endswith("attn.c_proj.weight"):  # (d in head order, d) -> (factor * d, factor * d)
            rows = value.reshape(n_head, 1, head_dim, d).expand(n_head, factor, head_dim, d).reshape(d * factor, d)
            target[name] = write(rows / factor, 1)
        elif name.endswith(("attn.c_proj.bias", "mlp.c_proj.bias")):
            target[name] = write(value, 0)
        elif name.endswith("mlp.c_fc.weight"):
            target[name] = write(read(value, 0), 1)
        elif name.endswith("mlp.c_fc.bias"):
            target[name] = write(value, 0)
        elif name.endswith("mlp.c_proj.weight"):
            target[name] = write(read(value, 0), 1)
        elif name == "score.weight":  # (labels, d): reads the stream
            target[name] = read(value, 1)
        elif name.endswith((".attn.bias", ".attn.masked_bias")):
            target[name] = value
        else:
            raise ValueError(f"cannot widen: no rule for weight {name!r}")
    _load_widened(wider, target, noise, seed)
    wider.tie_weights()
    return wider


def _load_widened(wider: PreTrainedModel, target: dict[str, torch.Tensor], noise: float, seed: int) -> None:
    """Load the widened weights into ``wider``, each matrix plus ``noise`` times its scale of seeded
    Gaussian noise (in ``target``'s order, so a seed gives the same model); every weight needs a source."""
    generator = torch.Generator().manual_seed(seed)
    for name, value in target.items():
        if noise > 0 and value.dim() >= 2 and value.is_floating_point():
            scale = float(value.std()) or 1.0
            target[name] = value + noise * scale * torch.randn(value.shape, generator=generator)
    missing = [key for key in wider.state_dict() if key not in target]
    if missing:
        raise ValueError(f"cannot widen: no source for {missing}")
    wider.load_state_dict(target, strict=False)


def widen_bert(model: PreTrainedModel, factor: int, seed: int, noise: float = 1e-3) -> PreTrainedModel:
    """A BERT sequence classifier with every width times ``factor``, computing the same function up to
    ``noise``: :func:`widen`'s Net2WiderNet for BERT's post-LayerNorm blocks and ``(out, in)`` Linears.

    As there, the residual stream becomes ``factor`` copies of itself (a post-LayerNorm over copies
    gives the copied output), a Linear reading it takes its columns divided by ``factor`` per copy, one
    writing to it repeats its rows, each head keeps its place with ``factor`` times the dimensions and
    queries scaled by ``1/sqrt(factor)``, and seeded ``noise`` breaks the copies' tie.
    """
    if factor < 2:
        raise ValueError(f"factor must be at least 2, got {factor}")
    old = model.config
    if old.model_type != "bert":
        raise ValueError(f"widen_bert takes a BERT sequence classifier, got model type {old.model_type!r}")
    d, n_head = old.hidden_size, old.num_attention_heads
    head_dim = d // n_head
    config = copy.deepcopy(old)
    config.hidden_size, config.intermediate_size = d * factor, old.intermediate_size * factor
    wider = type(model)(config)

    def read(weight: torch.Tensor) -> torch.Tensor:  # a Linear's input columns reading copies
        return torch.cat([weight / factor] * factor, dim=1)

    def write(weight: torch.Tensor, dim: int = 0) -> torch.Tensor:  # rows (or a vector) writing copies
        return torch.cat([weight] * factor, dim=dim)

    def per_head(weight: torch.Tensor) -> torch.Tensor:  # (d in head order, ...) -> (factor * d, ...)
        rest = weight.shape[1:]
        heads = weight.reshape(n_head, 1, head_dim, *rest)
        return heads.expand(n_head, factor, head_dim, *rest).reshape(d * factor, *rest)

    target: dict[str, torch.Tensor] = {}
    for name, value in model.state_dict().items():
        leaf = name.rsplit(".", 2)[-2:]  # e.g. ["query", "weight"]
        if name.endswith(("_embeddings.weight",)):
            target[name] = write(value, 1)
        elif leaf[0] == "LayerNorm":
            target[name] = write(value)
        elif leaf[0] in ("query", "key", "value"):
            widened = per_head(value) / (math.sqrt(factor) if leaf[0] == "query" else 1.0)
            target[name] = read(widened) if leaf[1] == "weight" else widened
        elif ".attention.output.dense." in name:  # reads the heads' outputs, writes the stream
            if leaf[1] == "weight":  # (d, d in head order) -> (factor * d, factor * d)
                columns = per_head(value.T).T / factor
                target[name] = write(columns)
            else:
                target[name] = write(value)
        elif leaf[0] == "dense":  # intermediate, output and pooler: read copies, write copies
            target[name] = write(read(value)) if leaf[1] == "weight" else write(value)
        elif name.startswith("classifier.") or name.startswith("score."):
            target[name] = read(value) if leaf[1] == "weight" else value
        elif name.endswith("position_ids") or name.endswith("token_type_ids"):
            target[name] = value
        else:
            raise ValueError(f"cannot widen: no rule for weight {name!r}")
    _load_widened(wider, target, noise, seed)
    return wider
