"""The probe's core: score every direction by likelihood under the small LM (R1). No I/O.

For a prompt the probe reads ``format_probe_query(prompt)`` ("Q: ...\\nDirections:") and we ask the
model how likely each direction name is as the continuation; a softmax over the directions' total
log-likelihoods gives their scores, the top one's score is the confidence. The model was trained to
write ``Risk: yes|no`` after the direction, so the risk probability is read the same way. A keyword
list is a safety net beside the model. All prompts x directions go through one forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from strata.contract.directions import DIRECTION_NAMES
from strata.contract.template import RISK_PREFIX, format_probe_query
from strata.models.loading import LoadedModel
from strata.risk import match_keywords


@dataclass(frozen=True)
class ProbeResult:
    directions: tuple[tuple[str, float], ...]  # (name, score) best first, top_k of them
    confidence: float                          # score of the best direction
    risk: float                                # P(risk topic) read from the model
    caution: bool                              # send to Level-2 instead of Level-1
    caution_reason: str                        # empty when not cautious
    tokens: int = 0                            # tokens the model read for this prompt (the ledger's)


@dataclass(frozen=True)
class ProbeRules:
    top_k: int = 3
    min_confidence: float = 0.3
    risk_threshold: float = 0.5
    risk_keywords: tuple[str, ...] = ()


def _continuation_logprobs(lm: LoadedModel, contexts: Sequence[str], continuations: Sequence[str],
                           max_context_tokens: int) -> tuple[torch.Tensor, list[int]]:
    """Sum of log P(continuation tokens | context) for each pair: (N,), and each pair's tokens."""
    tok = lm.tokenizer
    rows: list[list[int]] = []
    starts: list[int] = []
    for context, continuation in zip(contexts, continuations, strict=True):
        context_ids = tok(context, add_special_tokens=False)["input_ids"][-max_context_tokens:]
        continuation_ids = tok(continuation, add_special_tokens=False)["input_ids"]
        rows.append(context_ids + continuation_ids)
        starts.append(len(context_ids))
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # right padding: positions stay 0..len-1 for every row
        input_ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    input_ids, mask = input_ids.to(lm.device), mask.to(lm.device)
    logits = lm.model(input_ids=input_ids, attention_mask=mask).logits.float()  # (N, T, V)
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)  # (N, T-1, V): predicts token t+1
    targets = input_ids[:, 1:]  # (N, T-1)
    token_logprobs = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, T-1)
    positions = torch.arange(width - 1, device=lm.device)[None, :]  # (1, T-1)
    start = torch.tensor(starts, device=lm.device)[:, None] - 1  # first predicted continuation token
    keep = (positions >= start) & (mask[:, 1:] == 1)
    return (token_logprobs * keep).sum(dim=1).cpu(), [len(r) for r in rows]


@torch.no_grad()
def probe(lm: LoadedModel, prompts: Sequence[str], rules: ProbeRules, max_prompt_tokens: int = 128
          ) -> list[ProbeResult]:
    """Directions, confidence and caution for each prompt (one batched forward per stage)."""
    if not prompts:
        return []
    names = DIRECTION_NAMES
    queries = [format_probe_query(p) for p in prompts]
    # Stage 1: every prompt x every direction.
    contexts = [q for q in queries for _ in names]
    continuations = [f" {name}" for _ in queries for name in names]
    scores, direction_tokens = _continuation_logprobs(lm, contexts, continuations, max_prompt_tokens)
    probs = torch.softmax(scores.view(len(prompts), len(names)), dim=-1)  # (P, D)
    best = probs.argmax(dim=-1).tolist()
    # Stage 2: the risk flag after the best direction.
    risk_contexts = [f"{q} {names[b]}\n{RISK_PREFIX.rstrip()}" for q, b in zip(queries, best, strict=True)]
    risk_scores, risk_tokens = _continuation_logprobs(
        lm, [c for c in risk_contexts for _ in (0, 1)], [" yes", " no"] * len(prompts), max_prompt_tokens + 8
    )
    risk_scores = risk_scores.view(len(prompts), 2)
    risk = torch.softmax(risk_scores, dim=-1)[:, 0].tolist()  # P(yes)
    results = []
    for i, prompt in enumerate(prompts):
        order = torch.argsort(probs[i], descending=True)[: rules.top_k].tolist()
        directions = tuple((names[j], float(probs[i, j])) for j in order)
        confidence = directions[0][1]
        keyword = match_keywords(prompt, {"risk": rules.risk_keywords})
        reasons = []
        if risk[i] > rules.risk_threshold:
            reasons.append(f"risk topic (p={risk[i]:.2f})")
        if keyword is not None:
            reasons.append(f"risk {keyword.evidence}")
        if confidence < rules.min_confidence:
            reasons.append(f"low confidence ({confidence:.2f} < {rules.min_confidence})")
        tokens = sum(direction_tokens[i * len(names): (i + 1) * len(names)]) + sum(risk_tokens[2 * i: 2 * i + 2])
        results.append(ProbeResult(directions, confidence, float(risk[i]), bool(reasons), "; ".join(reasons),
                                   tokens))
    return results
