"""The zoo probe's forward with each prompt read once: its continuations share the prompt's keys and values.

The likelihood method scores every canonical direction as a continuation of the same query
(``svc_probe.core``). Read as six full rows, the query is computed six times, and on a CPU the
transformers forward adds a fixed cost per call that is as large as the compute of a short row
(docs/performance.md). This module runs GPT-2's arithmetic directly on the model's own weights,
one packed row per prompt: the query, then every continuation after it, each continuation's tokens
attending to the query and causally to themselves, never to another continuation, with the
positions they would have right after the query. The query is computed once, and one forward
serves all of a prompt's rows.

It computes what ``GPT2LMHeadModel`` computes for ``query + continuation`` (equal to ~1e-5 on the
zoo's probe, ``tests/svc_probe/test_prefix.py``), for the GPT-2 configurations :func:`unsupported`
accepts; anything else takes the transformers forward. Pure tensor code, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def unsupported(model: torch.nn.Module) -> str | None:
    """Why this model cannot take the shared-prefix forward; None when it can."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) != "gpt2":
        return "not a GPT-2 model"
    if config.activation_function not in (*_GELU_TANH, "gelu"):
        return f"activation {config.activation_function!r}"
    if config.scale_attn_by_inverse_layer_idx or not config.scale_attn_weights or config.add_cross_attention:
        return "a GPT-2 attention variant"
    if model.training:
        return "the model is in training mode"
    return None


@dataclass(frozen=True)
class PrefixLogits:
    """Next-token logits of every continuation row (row r = prompt r // C, continuation r % C).

    ``predict[r, t]`` are the logits that predict continuation token t (t = 0 from the prompt's last
    position); ``after[r]`` the logits after the row's last token.
    """

    predict: torch.Tensor  # (N, W, V), W the longest continuation
    after: torch.Tensor  # (N, V)


def _layer_norm(x: torch.Tensor, module: torch.nn.LayerNorm) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), module.weight, module.bias, module.eps)


def _linear(x: torch.Tensor, conv1d: torch.nn.Module) -> torch.Tensor:
    """GPT-2's ``Conv1D``: x @ weight + bias with weight stored (in, out)."""
    return torch.addmm(conv1d.bias, x.reshape(-1, x.shape[-1]), conv1d.weight).view(*x.shape[:-1], -1)


def _block(block: torch.nn.Module, x: torch.Tensor, n_head: int, mask: torch.Tensor, gelu: str) -> torch.Tensor:
    """One GPT-2 block on x (B, T, E) with a boolean attention mask (B, 1, T, T): True where a query may look."""
    b, t, _ = x.shape
    qkv = _linear(_layer_norm(x, block.ln_1), block.attn.c_attn).view(b, t, 3, n_head, -1)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, d)
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    x = x + _linear(a.transpose(1, 2).reshape(b, t, -1), block.attn.c_proj)
    h = _linear(_layer_norm(x, block.ln_2), block.mlp.c_fc)
    return x + _linear(F.gelu(h, approximate=gelu), block.mlp.c_proj)


@torch.no_grad()
def prefix_shared_logits(model: torch.nn.Module, contexts: Sequence[Sequence[int]],
                         continuations: Sequence[Sequence[int]], pad: int) -> PrefixLogits:
    """Logits of every (context i, continuation j) row, each context read once (see the module docstring).

    Every context and continuation must be non-empty; rows are ordered context-major.
    """
    if not contexts or not continuations or any(not c for c in (*contexts, *continuations)):
        raise ValueError("prefix_shared_logits needs non-empty contexts and continuations")
    transformer = model.transformer
    device = transformer.wte.weight.device
    gelu = "tanh" if model.config.activation_function in _GELU_TANH else "none"
    n_ctx, n_cont = len(contexts), len(continuations)

    # One packed row per context: [context, continuation 1, ..., continuation C], right padded.
    # segment 0 is the context and j + 1 continuation j; position ids restart after the context
    # for every continuation, as if each followed the context alone.
    seg_of: list[int] = [j + 1 for j, k in enumerate(continuations) for _ in k]
    step_of: list[int] = [t for k in continuations for t in range(len(k))]
    tail = [token for k in continuations for token in k]
    width = max(len(c) for c in contexts) + len(tail)
    ids = torch.full((n_ctx, width), pad, dtype=torch.long)
    segment = torch.full((n_ctx, width), -1, dtype=torch.long)  # -1: padding
    position = torch.zeros((n_ctx, width), dtype=torch.long)
    for i, context in enumerate(contexts):
        n = len(context)
        ids[i, : n + len(tail)] = torch.tensor([*context, *tail])
        segment[i, :n] = 0
        segment[i, n: n + len(tail)] = torch.tensor(seg_of)
        position[i, :n] = torch.arange(n)
        position[i, n: n + len(tail)] = n + torch.tensor(step_of)
    ids, segment = ids.to(device), segment.to(device)
    position = position.clamp(max=model.config.n_positions - 1).to(device)
    order = torch.arange(width, device=device)
    # A token sees earlier tokens of the context and of its own continuation (padding sees itself).
    mask = ((order[None, :] <= order[:, None])[None]
            & ((segment[:, None, :] == 0) | (segment[:, None, :] == segment[:, :, None]))
            & (segment[:, None, :] >= 0)) | torch.eye(width, dtype=torch.bool, device=device)[None]
    x = transformer.wte(ids) + transformer.wpe(position)
    for block in transformer.h:
        x = _block(block, x, model.config.n_head, mask[:, None], gelu)
    logits = model.lm_head(_layer_norm(x, transformer.ln_f))  # (P, T, V): position t predicts t + 1

    # Row r = (i, j): continuation j of context i starts at packed index len_i + start_j.
    starts = torch.tensor([0, *torch.tensor([len(k) for k in continuations]).cumsum(0).tolist()[:-1]])
    lengths = torch.tensor([len(k) for k in continuations])
    ctx_len = torch.tensor([len(c) for c in contexts])
    cont_width = int(lengths.max())
    owner = torch.arange(n_ctx).repeat_interleave(n_cont)  # (N,)
    first = (ctx_len[owner] + starts.repeat(n_ctx))  # (N,): packed index of each row's first token
    steps = torch.arange(cont_width)
    # token t of a row is predicted by the context's last position (t = 0) or by token t - 1 of the row
    at = torch.where(steps[None, :] == 0, ctx_len[owner][:, None] - 1, first[:, None] + steps[None, :] - 1)
    at = torch.minimum(at, (first + lengths.repeat(n_ctx) - 1)[:, None])  # past a row's end: unused
    predict = logits[owner[:, None].to(device), at.to(device)]  # (N, W, V)
    after = logits[owner.to(device), (first + lengths.repeat(n_ctx) - 1).to(device)]  # (N, V)
    return PrefixLogits(predict, after)
