"""The PPO policy: any Hugging Face causal LM plus a scalar value head on its last hidden state.

``PolicyWithValueHead(input_ids, attention_mask)`` returns a :class:`~svc_learner.ppo.PolicyOutput`
(per-token log-probs of the given ids, entropies, values), the interface ``ppo_update`` expects.

Padding: either side works, and so does TRL's "left-padded prompt + right-padded response". The
forward derives ``position_ids`` from the attention mask (``cumsum - 1``, as ``generate`` does for
left padding), so a token gets the same position, and hence the same log-prob, whatever padding
surrounds it. ``collate_rollouts`` pads on the right. Columns at padding positions hold garbage
(still finite) and are masked out by the caller.

The value head lives beside the LM, not inside it, and is saved as its own file, so a policy
directory stays a plain ``save_pretrained`` directory that ``AutoModelForCausalLM.from_pretrained``
(the generators' loader) reads without knowing about value heads.
"""

from __future__ import annotations

import copy
import inspect
import logging
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, PreTrainedModel

from strata.models.loading import check_model_dir, from_pretrained, resolve_device, resolve_dtype
from svc_learner.ppo import PolicyOutput, entropy_from_logits, logprobs_from_logits

logger = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
# One weights file, whatever the model size: the checkpoint's checksum is that file's sha256.
SINGLE_FILE_SHARD_SIZE = "1000GB"


class PolicyWithValueHead(torch.nn.Module):
    """A causal LM (``lm``) with a linear value head (``value_head``: hidden -> 1, kept in float32)."""

    def __init__(self, lm: PreTrainedModel, value_head: torch.nn.Linear | None = None,
                 value_trunk_grad: bool = False) -> None:
        super().__init__()
        self.lm = lm
        # False: the value head reads the LM's last hidden state detached, so the value loss trains the
        # head only and can never move the policy (see LearnerSettings.value_trunk_grad).
        self.value_trunk_grad = value_trunk_grad
        hidden = lm.config.get_text_config().hidden_size
        if value_head is None:
            # Zero init: V = 0 everywhere at first, so the first advantages are plain returns and the
            # head cannot inject noise into the early updates (it still learns: dL/dW = error · h).
            value_head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
            torch.nn.init.zeros_(value_head.weight)
            torch.nn.init.zeros_(value_head.bias)
        self.value_head = value_head.to(device=self.device, dtype=torch.float32)
        # Some older architectures take no position_ids; they get right padding only.
        self._takes_position_ids = "position_ids" in inspect.signature(lm.forward).parameters

    def start_value_at(self, mean_return: float) -> bool:
        """Give a fresh (all-zero) value head the bias ``mean_return``; a trained head is left alone.

        Rewards are 0-5 and the value loss is clipped per update (``vf_clip_coef``), so a head starting
        at 0 would need a dozen updates to reach the reward scale, giving noise for advantages until
        then. Starting at the first batch's mean return makes it a batch baseline from update one.
        """
        with torch.no_grad():
            if self.value_head.weight.any() or self.value_head.bias.any():
                return False
            self.value_head.bias.fill_(mean_return)
        return True

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PolicyOutput:
        """``(B, T), (B, T) -> PolicyOutput`` of ``(B, T-1)`` tensors aligned with ``input_ids[:, 1:]``."""
        kwargs: dict[str, Any] = {}
        if self._takes_position_ids:
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
        out = self.lm(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False, **kwargs
        )
        logits = out.logits[:, :-1]  # (B, T-1, V): position j predicts token j + 1
        hidden = out.hidden_states[-1][:, :-1]  # (B, T-1, H)
        if not self.value_trunk_grad:
            hidden = hidden.detach()
        return PolicyOutput(
            logprobs=logprobs_from_logits(logits, input_ids[:, 1:]),  # (B, T-1)
            entropy=entropy_from_logits(logits),  # (B, T-1)
            values=self.value_head(hidden.float()).squeeze(-1),  # (B, T-1)
        )

    def reference_copy(self) -> PolicyWithValueHead:
        """A frozen copy (no gradients, eval mode) to serve as the KL reference π_ref."""
        ref = copy.deepcopy(self)
        ref.requires_grad_(False)
        return ref.eval()

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "auto", dtype: str = "float32") -> PolicyWithValueHead:
        """Load a causal LM from a local directory (never downloads), plus its value head if saved there."""
        model_dir = check_model_dir(path)
        torch_device = resolve_device(device)
        lm = from_pretrained(AutoModelForCausalLM, model_dir, dtype=resolve_dtype(dtype, torch_device))
        value_head = None
        if (model_dir / VALUE_HEAD_FILE).is_file():
            state = load_file(model_dir / VALUE_HEAD_FILE)
            value_head = torch.nn.Linear(state["weight"].shape[1], 1, dtype=torch.float32)
            value_head.load_state_dict(state)
        policy = cls(lm.to(torch_device), value_head).eval()
        logger.info("loaded policy from %s on %s (value head %s)", model_dir, torch_device,
                    "restored" if value_head is not None else "new")  # fmt: skip
        return policy

    def save_pretrained(self, directory: str | Path) -> None:
        """The LM as a ``save_pretrained`` directory (one safetensors file) plus ``value_head.safetensors``."""
        directory = Path(directory)
        self.lm.save_pretrained(directory, max_shard_size=SINGLE_FILE_SHARD_SIZE)
        state = {name: t.detach().cpu().contiguous() for name, t in self.value_head.state_dict().items()}
        save_file(state, directory / VALUE_HEAD_FILE)


def set_dropout(module: torch.nn.Module, p: float) -> int:
    """Set the probability of every ``nn.Dropout`` in ``module`` to ``p``; returns how many were set.

    For rollout dropout (R17, seed §5.2: p = 0.1 during rollout): dropout acts only in train mode,
    so a generator that wants it calls ``set_dropout(model, 0.1)`` and ``model.train()`` around
    sampling. The learner itself keeps dropout off (eval mode) so its ratios start at exactly 1.
    """
    if not 0.0 <= p < 1.0:
        raise ValueError("dropout probability must be in [0, 1)")
    count = 0
    for layer in module.modules():
        if isinstance(layer, torch.nn.Dropout):
            layer.p = p
            count += 1
    return count
