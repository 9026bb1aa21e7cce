"""The Level-0 probe's directions head (issue 25): a linear classifier on the probe LM's last hidden state.

The zoo's probe scores each direction by the likelihood of its name after the zoo's text template
(``svc_probe.core``); a user's own LM has never seen that template, so its likelihoods mean nothing.
The head asks the LM only to read the prompt, as it would be asked it (``PromptFormat.query_text``:
its chat template with the generation prompt, or the zoo's text), and reads its final hidden state at
the last real token (pooling ``last_token``; the trunk stays frozen):

    features = h_last(query_text(prompt))                  # (N, H)
    direction_logits = features @ W_d.T + b_d              # (N, D): softmax -> direction scores
    risk_logit = features @ w_r + b_r                      # (N,):   sigmoid -> P(risk)

One forward per batch of prompts, however many directions there are. It is fit as a logistic
regression (class-balanced cross-entropy for the directions, plain BCE for risk) with full-batch
AdamW on standardised features; the standardisation is folded into W and b, so the saved head is just
the two linear maps. Files next to the model:

- ``probe_head.safetensors``: ``directions.weight`` (D, H), ``directions.bias`` (D,), ``risk.weight``
  (1, H), ``risk.bias`` (1,), float32;
- ``probe_head.json``: the directions in logit order (name, description), ``hidden_size``, ``pooling``,
  the training data's sha256, the held-out metrics, the training settings and ``created_at``.

Pure math and the head's two files; no other I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from strata.models.loading import LoadedModel, ModelLoadError
from strata.models.prompts import PromptFormat, direction_phrase

HEAD_WEIGHTS = "probe_head.safetensors"
HEAD_INFO = "probe_head.json"
HEAD_FORMAT = "strata-probe-head/1"
POOLING = "last_token"  # the final hidden state at the last real token of query_text(prompt)


class HeadError(ModelLoadError):
    """A probe head that cannot be used with its model; the message says what to fix."""


@dataclass(frozen=True)
class DirectionsHead:
    """D direction logits and one risk logit, linear in the LM's last hidden state."""

    directions: tuple[tuple[str, str], ...]  # (name, description), in logit order
    direction_weight: torch.Tensor  # (D, H)
    direction_bias: torch.Tensor  # (D,)
    risk_weight: torch.Tensor  # (1, H)
    risk_bias: torch.Tensor  # (1,)
    info: Mapping[str, Any] = field(default_factory=dict)  # probe_head.json beyond the shapes (metrics, ...)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.directions)

    @property
    def hidden_size(self) -> int:
        return int(self.direction_weight.shape[1])

    def to(self, device: torch.device | str) -> DirectionsHead:
        return DirectionsHead(self.directions, self.direction_weight.to(device), self.direction_bias.to(device),
                              self.risk_weight.to(device), self.risk_bias.to(device), self.info)

    def logits(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, H) features -> (N, D) direction logits and (N,) risk logits."""
        features = features.float()
        directions = features @ self.direction_weight.T + self.direction_bias  # (N, D)
        risk = (features @ self.risk_weight.T + self.risk_bias).squeeze(-1)  # (N,)
        return directions, risk


# --- features ------------------------------------------------------------------------------------

def model_hidden_size(model: Any) -> int:
    """The width of the LM's last hidden state, from its config."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.hidden_size)


def encode_queries(fmt: PromptFormat, prompts: Sequence[str], max_tokens: int, pad_token_id: int,
                   padding_side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (N, T) and attention mask (N, T) of each prompt's ``query_text``.

    A query longer than ``max_tokens`` keeps its last ``max_tokens`` tokens (the end, where the head
    reads, as the likelihood method keeps the end of its context).
    """
    rows = [ids[-max_tokens:] for ids in fmt.encode([fmt.query_text(p) for p in prompts])["input_ids"]]
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if padding_side == "left" else slice(0, len(row))
        input_ids[i, span] = torch.tensor(row, dtype=torch.long)
        mask[i, span] = 1
    return input_ids, mask


def last_token_features(model: Any, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The final hidden state at each row's last real token: (N, H) float32, left or right padding alike.

    Positions count real tokens only (a left-padded row starts at position 0 as an unpadded one does),
    and only the trunk runs (``base_model``: no (N, T, vocab) logits).
    """
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # (N, T)
    hidden = model.base_model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                              use_cache=False).last_hidden_state  # (N, T, H)
    last = (mask * torch.arange(mask.shape[1], device=mask.device)).argmax(dim=1)  # (N,) last real token
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last].float()  # (N, H)


@torch.no_grad()
def prompt_features(lm: LoadedModel, prompts: Sequence[str], max_tokens: int, fmt: PromptFormat | None = None,
                    padding_side: str | None = None) -> tuple[torch.Tensor, list[int]]:
    """One forward over ``prompts``: features (N, H) on the model's device, and the tokens each read."""
    fmt = fmt or PromptFormat.of(lm.tokenizer)
    input_ids, mask = encode_queries(fmt, prompts, max_tokens, lm.tokenizer.pad_token_id,
                                     padding_side or lm.tokenizer.padding_side)
    features = last_token_features(lm.model, input_ids.to(lm.device), mask.to(lm.device))
    return features, mask.sum(dim=1).tolist()


# --- fitting and metrics -------------------------------------------------------------------------

@dataclass(frozen=True)
class FitConfig:
    epochs: int = 300  # full-batch AdamW steps
    lr: float = 0.02
    weight_decay: float = 0.01
    seed: int = 0


def fit_head(features: torch.Tensor, directions: torch.Tensor, risk: torch.Tensor, n_directions: int,
             cfg: FitConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logistic regression on frozen features: (W_d (D, H), b_d (D,), w_r (1, H), b_r (1,)).

    ``features`` (N, H), ``directions`` (N,) class indices in [0, D), ``risk`` (N,) bool. Directions
    are weighted by N / (D * count) so a rare direction counts as much as a common one (a direction
    without examples gets weight 0). The risk loss is not reweighted: the service compares sigmoid(risk
    logit) with ``risk_threshold`` as a probability, and a balanced loss would inflate it for every
    prompt when risk is rare (more Level-2 for nothing; the keyword net stays beside it).
    """
    torch.manual_seed(cfg.seed)
    x = features.detach().float().cpu()
    mean, std = x.mean(dim=0), x.std(dim=0, unbiased=False) + 1e-6
    x = (x - mean) / std  # (N, H) standardised: one learning rate suits every model's scale
    n, hidden = x.shape
    counts = torch.bincount(directions, minlength=n_directions).float()  # (D,)
    class_weight = torch.where(counts > 0, n / (n_directions * counts.clamp(min=1)), torch.zeros_like(counts))
    w_d = torch.zeros(n_directions, hidden, requires_grad=True)
    b_d = torch.zeros(n_directions, requires_grad=True)
    w_r = torch.zeros(1, hidden, requires_grad=True)
    b_r = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([w_d, b_d, w_r, b_r], lr=cfg.lr, weight_decay=cfg.weight_decay)
    target_risk = risk.float()
    for _ in range(cfg.epochs):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w_d.T + b_d, directions, weight=class_weight)
        loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(
            (x @ w_r.T + b_r).squeeze(-1), target_risk)
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # fold the standardisation in: (x - mean) / std @ W.T + b == x @ (W / std).T + b'
        w_d_raw, w_r_raw = w_d / std, w_r / std
        return (w_d_raw, b_d - w_d_raw @ mean, w_r_raw, b_r - w_r_raw @ mean)


def roc_auc(scores: Sequence[float] | np.ndarray, labels: Sequence[bool] | np.ndarray) -> float | None:
    """Area under the ROC curve: the chance a random positive scores above a random negative (ties count
    half), from average ranks in O(n log n); None when only one class is present."""
    values = np.asarray(scores, dtype=np.float64)
    positive = np.asarray(labels, dtype=bool)
    if values.shape != positive.shape:
        raise ValueError(f"{values.shape[0]} scores for {positive.shape[0]} labels")
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    boundaries = np.flatnonzero(np.diff(sorted_values)) + 1  # where a run of tied scores ends
    ranks = np.empty(len(values), dtype=np.float64)
    for start, end in zip(np.concatenate([[0], boundaries]), np.concatenate([boundaries, [len(values)]]),
                          strict=True):
        ranks[order[start:end]] = (start + end + 1) / 2.0  # ties share their average rank
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def evaluate(direction_probs: torch.Tensor, risk_probs: torch.Tensor, directions: torch.Tensor,
             risk: torch.Tensor) -> dict[str, float | int | None]:
    """Top-1 and top-3 direction accuracy, risk accuracy (p > 0.5) and AUC of (N, D) / (N,) predictions."""
    n = int(directions.shape[0])
    k = min(3, direction_probs.shape[1])
    top = direction_probs.topk(k, dim=1).indices  # (N, k)
    predicted_risk = risk_probs > 0.5
    return {
        "examples": n,
        "top1": float((top[:, 0] == directions).float().mean()),
        "top3": float((top == directions[:, None]).any(dim=1).float().mean()),
        "risk_acc": float((predicted_risk == risk.bool()).float().mean()),
        "risk_auc": roc_auc(risk_probs.tolist(), risk.bool().tolist()),
    }


# --- files ---------------------------------------------------------------------------------------

def has_head(directory: str | Path) -> bool:
    """Whether ``directory`` holds a probe head (either of its files: half a head is an error at load)."""
    directory = Path(directory)
    return (directory / HEAD_INFO).exists() or (directory / HEAD_WEIGHTS).exists()


def save_head(head: DirectionsHead, directory: str | Path) -> None:
    """Write ``probe_head.safetensors`` and ``probe_head.json`` into ``directory``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = {"directions.weight": head.direction_weight, "directions.bias": head.direction_bias,
               "risk.weight": head.risk_weight, "risk.bias": head.risk_bias}
    save_file({k: v.detach().float().cpu().contiguous() for k, v in tensors.items()}, str(directory / HEAD_WEIGHTS))
    info = {
        "format": HEAD_FORMAT,
        "directions": [{"name": name, "description": description} for name, description in head.directions],
        "hidden_size": head.hidden_size,
        "pooling": POOLING,
    } | {k: v for k, v in head.info.items() if k not in ("format", "directions", "hidden_size", "pooling")}
    (directory / HEAD_INFO).write_text(json.dumps(info, indent=2) + "\n")


def load_head(directory: str | Path, hidden_size: int) -> DirectionsHead:
    """The head saved in ``directory``, checked against a model whose hidden size is ``hidden_size``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    directory = Path(directory)
    retrain = f"retrain it for this model: `strata probe train --model {directory} --data PROMPTS.jsonl --out DIR`"
    info_path, weights_path = directory / HEAD_INFO, directory / HEAD_WEIGHTS
    for present, missing in ((info_path, weights_path), (weights_path, info_path)):
        if present.exists() and not missing.exists():
            raise HeadError(f"half a probe head in {directory}: {present.name} without {missing.name}; {retrain}")
    try:
        info = json.loads(info_path.read_text())
    except (OSError, ValueError) as exc:
        raise HeadError(f"unreadable {info_path} ({exc}); {retrain}") from exc
    if not isinstance(info, dict) or info.get("format") != HEAD_FORMAT:
        raise HeadError(f"{info_path} is not a {HEAD_FORMAT} file; {retrain}")
    if info.get("pooling") != POOLING:
        raise HeadError(f"{info_path}: pooling {info.get('pooling')!r} is not {POOLING!r}; {retrain}")
    directions = parse_direction_entries(info.get("directions"), str(info_path))
    if info.get("hidden_size") != hidden_size:
        raise HeadError(f"the probe head in {directory} reads hidden states of size {info.get('hidden_size')}, "
                        f"but the model there has hidden size {hidden_size}: the head was trained on another "
                        f"model; {retrain}")
    try:
        tensors = load_file(str(weights_path))
    except (OSError, SafetensorError) as exc:
        raise HeadError(f"unreadable {weights_path} ({exc}); {retrain}") from exc
    d = len(directions)
    expected = {"directions.weight": (d, hidden_size), "directions.bias": (d,),
                "risk.weight": (1, hidden_size), "risk.bias": (1,)}
    for name, shape in expected.items():
        got = tuple(tensors[name].shape) if name in tensors else None
        if got != shape:
            raise HeadError(f"{weights_path}: tensor {name} has shape {got}, expected {shape} "
                            f"({d} directions, hidden size {hidden_size}); {retrain}")
    rest = {k: v for k, v in info.items() if k not in ("format", "directions", "hidden_size", "pooling")}
    return DirectionsHead(directions, tensors["directions.weight"].float(), tensors["directions.bias"].float(),
                          tensors["risk.weight"].float(), tensors["risk.bias"].float(), rest)


def parse_direction_entries(entries: Any, where: str) -> tuple[tuple[str, str], ...]:
    """``[{"name": ..., "description": ...}, ...]`` (probe_head.json) as (name, description) pairs."""
    if not isinstance(entries, list) or len(entries) < 2:
        raise HeadError(f"{where}: 'directions' must list at least 2 {{name, description}} entries")
    pairs: list[tuple[str, str]] = []
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        description = entry.get("description") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(description, str):
            raise HeadError(f"{where}: bad direction entry {entry!r}: expected {{name, description}} strings")
        try:
            direction_phrase(name)
        except ValueError as exc:
            raise HeadError(f"{where}: {exc}") from exc
        if name in (n for n, _ in pairs):
            raise HeadError(f"{where}: direction {name!r} is listed twice")
        pairs.append((name, description))
    return tuple(pairs)

