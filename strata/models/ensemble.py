"""Several reward models read as one (``strata.contract.ensemble``): the mixture of their score distributions."""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers.modeling_outputs import SequenceClassifierOutput


class RewardEnsemble(torch.nn.Module):
    """Members that share a tokenizer and score bins. ``logits``: the log of the members' mean bin
    distribution, so the expected score is the mean of theirs; for one-logit (regression) members, the
    mean logit. Its parameters are the members' (the ledger books them summed)."""

    def __init__(self, members: list[Any]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"an ensemble needs at least two members, got {len(members)}")
        labels = {m.config.num_labels for m in members}
        if len(labels) != 1:
            raise ValueError(f"the members score over different numbers of bins: {sorted(labels)}")
        self.members = torch.nn.ModuleList(members)
        self.config = members[0].config  # what readers ask of an RM: num_labels, positions, pad token

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, **inputs: Any) -> SequenceClassifierOutput:
        logits = torch.stack([m(**inputs).logits.float() for m in self.members])  # (members, B, labels)
        if logits.shape[-1] == 1:
            return SequenceClassifierOutput(logits=logits.mean(dim=0))
        mixture = torch.logsumexp(torch.log_softmax(logits, dim=-1), dim=0) - math.log(len(self.members))
        return SequenceClassifierOutput(logits=mixture)
