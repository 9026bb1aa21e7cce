"""The probe's core: directions and a risk signal for each prompt (R1). No I/O.

Two methods, one set of rules:

- **head** (a probe directory with ``probe_head.json``, ``strata probe train``): the LM reads each
  prompt as it would be asked it (``PromptFormat.query_text``) and a linear head on its last hidden
  state gives D direction logits and one risk logit (``strata.models.probe_head``). One forward over the batch of
  prompts; the directions are the head's own set (a user's may differ from the canonical one).
- **likelihood** (the zoo's probe, trained on ``format_probe_query(prompt)`` ``"Q: ...\\nDirections:"``):
  how likely each canonical direction name is as the continuation; a softmax over the directions'
  total log-likelihoods gives their scores. The model was trained to write ``Risk: yes|no`` after the
  direction, so the risk probability is read from the same rows (``query + direction + "Risk:"``):
  all prompts x directions go through one forward pass. On any other LM these likelihoods mean
  nothing, so it must be asked for by name.

Either way the top direction's score is the confidence, and a keyword list is a safety net beside
the model: a prompt is cautious (Level-2) on a high risk probability, a risk keyword or low confidence.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from strata.contract.directions import DIRECTION_NAMES
from strata.contract.template import RISK_PREFIX, format_probe_query
from strata.models.loading import LoadedModel
from strata.models.probe_head import DirectionsHead, encode_queries, last_token_features, prompt_features
from strata.models.prompts import PromptFormat
from strata.risk import match_keywords
from svc_probe.prefix import PrefixLogits, prefix_shared_logits, unsupported

if TYPE_CHECKING:
    from svc_probe.config import ProbeSettings

ProbeMethod = Literal["auto", "head", "likelihood"]


class ProbeSetupError(ValueError):
    """The probe directory cannot serve with the method asked for; the message says what to run or set."""


@dataclass(frozen=True)
class ProbeResult:
    directions: tuple[tuple[str, float], ...]  # (name, score) best first, top_k of them
    confidence: float                          # score of the best direction
    risk: float                                # P(risk topic) read from the model
    caution: bool                              # send to Level-2 instead of Level-1
    caution_reason: str                        # empty when not cautious
    tokens: int = 0                            # tokens the model read for this prompt (the ledger's)

    def forwarded(self, n_directions: int) -> tuple[str, ...]:
        """The directions the probe sends on with the prompt: its best ``n_directions`` (the generator's
        ``Directions:`` line). The live worker and every bench that measures Level-1 answers call this."""
        return tuple(name for name, _ in self.directions[:n_directions])


@dataclass(frozen=True)
class ProbeRules:
    top_k: int = 3
    min_confidence: float = 0.3
    risk_threshold: float = 0.5
    risk_keywords: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: ProbeSettings) -> ProbeRules:
        """The rules the service applies under ``settings``."""
        return cls(settings.top_k, settings.min_confidence, settings.risk_threshold, settings.keywords())


def choose_method(requested: ProbeMethod, has_head: bool, is_zoo_probe: bool, where: str) -> str:
    """``head`` or ``likelihood`` for a probe directory, or a ``ProbeSetupError`` saying what to do.

    ``auto``: the head when there is one, else the likelihood method on the zoo's probe only (its LM
    was trained on the directions' names; a user's LM was not).
    """
    train = (f"train a directions head for it: `strata probe train --model {where} --data PROMPTS.jsonl "
             "--out DIR`, then serve DIR (docs/probe.md)")
    if requested == "likelihood":
        return "likelihood"
    if has_head:
        return "head"
    if requested == "head":
        raise ProbeSetupError(f"probe_method=head but {where} has no probe head (probe_head.json); {train}")
    if is_zoo_probe:
        return "likelihood"
    raise ProbeSetupError(
        f"{where} is neither the zoo's probe nor a probe with a directions head: the likelihood of the "
        f"zoo's direction names under this model means nothing. {train[0].upper()}{train[1:]}; or, to "
        "use the likelihood method anyway, set --probe-method likelihood (STRATA_PROBE_METHOD)"
    )


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
    input_ids, mask = _right_padded(rows, tok.pad_token_id, lm.device)
    logits = lm.model(input_ids=input_ids, attention_mask=mask).logits.float()  # (N, T, V)
    logprobs = torch.log_softmax(logits[:, :-1], dim=-1)  # (N, T-1, V): predicts token t+1
    targets = input_ids[:, 1:]  # (N, T-1)
    token_logprobs = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (N, T-1)
    positions = torch.arange(input_ids.shape[1] - 1, device=lm.device)[None, :]  # (1, T-1)
    start = torch.tensor(starts, device=lm.device)[:, None] - 1  # first predicted continuation token
    keep = (positions >= start) & (mask[:, 1:] == 1)
    return (token_logprobs * keep).sum(dim=1).cpu(), [len(r) for r in rows]


@dataclass(frozen=True)
class _LikelihoodPieces:
    """The fixed token pieces of the likelihood method, tokenized once per tokenizer."""

    names: tuple[tuple[int, ...], ...]  # " <direction>" for each canonical direction
    continuations: tuple[tuple[int, ...], ...]  # " <direction>\nRisk:" for each: what follows every query
    yes: int | None  # " yes" / " no" when each is one token (the one-forward path), else None
    no: int | None


@functools.lru_cache(maxsize=4)
def _likelihood_pieces(tokenizer: Any) -> _LikelihoodPieces:
    def ids(text: str) -> tuple[int, ...]:
        return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])

    yes, no = ids(" yes"), ids(" no")
    single = len(yes) == 1 and len(no) == 1
    names = tuple(ids(f" {name}") for name in DIRECTION_NAMES)
    risk_suffix = ids(f"\n{RISK_PREFIX.rstrip()}")
    return _LikelihoodPieces(names, tuple((*name, *risk_suffix) for name in names),
                             yes[0] if single else None, no[0] if single else None)


def _likelihood_scores(lm: LoadedModel, prompts: Sequence[str], max_prompt_tokens: int, share_prefix: bool = True
                       ) -> tuple[tuple[str, ...], torch.Tensor, list[float], list[int]]:
    """Canonical names, (P, D) direction scores, P(risk) and tokens read, by likelihood.

    Each prompt x direction row is ``query + " <direction>" + "\nRisk:"``. The direction's
    log-likelihood is read on its own tokens (causal attention: the suffix after them changes nothing)
    and P(risk) from the next-token logits of ``" yes"`` / ``" no"`` on the best direction's row, the
    same conditional the model was trained on. The query is read once and its keys and values shared
    by the six continuations (``svc_probe.prefix``) where the model allows, else the rows go through
    one transformers forward (``share_prefix=False`` forces that: the bench's "before"). A tokenizer
    that splits ``" yes"`` takes two forwards.
    """
    pieces = _likelihood_pieces(lm.tokenizer)
    if pieces.yes is None or pieces.no is None:
        return _likelihood_scores_two_forwards(lm, prompts, max_prompt_tokens)
    names = DIRECTION_NAMES
    contexts = _likelihood_contexts(lm, prompts, max_prompt_tokens)
    continuations = pieces.continuations
    shared = share_prefix and unsupported(lm.model) is None
    rows = _row_logits(lm, contexts, continuations, shared)
    cont_ids = torch.tensor([[*c, *[0] * (rows.predict.shape[1] - len(c))] for c in continuations],
                            device=lm.device).repeat(len(prompts), 1)  # (N, W)
    token_logprobs = torch.log_softmax(rows.predict.float(), dim=-1).gather(-1, cont_ids.unsqueeze(-1)).squeeze(-1)
    name_len = torch.tensor([len(n) for n in pieces.names], device=lm.device).repeat(len(prompts))  # (N,)
    on_name = torch.arange(cont_ids.shape[1], device=lm.device)[None, :] < name_len[:, None]  # (N, W)
    scores = (token_logprobs * on_name).sum(dim=1)  # (N,)
    probs = torch.softmax(scores.view(len(prompts), len(names)), dim=-1).cpu()  # (P, D)
    best = probs.argmax(dim=-1)  # (P,)
    yes_no = rows.after.float()[:, [pieces.yes, pieces.no]].view(len(prompts), len(names), 2)  # (P, D, 2)
    chosen = yes_no[torch.arange(len(prompts)), best.to(lm.device)]  # (P, 2)
    risk = torch.softmax(chosen, dim=-1)[:, 0].cpu().tolist()  # P(yes)
    per_row = 1 if shared else len(continuations)  # the ledger's token positions computed per prompt
    tokens = [len(c) * per_row + sum(len(k) for k in continuations) for c in contexts]
    return names, probs, risk, tokens


def _likelihood_contexts(lm: LoadedModel, prompts: Sequence[str], max_prompt_tokens: int) -> list[list[int]]:
    """Each prompt's probe query, tokenized and cut to its last ``max_prompt_tokens`` tokens."""
    queries = lm.tokenizer([format_probe_query(p) for p in prompts], add_special_tokens=False)["input_ids"]
    return [list(q[-max_prompt_tokens:]) for q in queries]


def _row_logits(lm: LoadedModel, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
                shared: bool) -> PrefixLogits:
    """Logits of every context x continuation row: the shared-prefix forward, or one over full rows."""
    pad = lm.tokenizer.pad_token_id
    if shared:
        return prefix_shared_logits(lm.model, contexts, continuations, pad)
    rows = [[*c, *k] for c in contexts for k in continuations]
    input_ids, mask = _right_padded(rows, pad, lm.device)
    logits = lm.model(input_ids=input_ids, attention_mask=mask).logits  # (N, T, V)
    width = max(len(k) for k in continuations)
    n = len(rows)
    starts = torch.tensor([len(c) for c in contexts for _ in continuations], device=lm.device)  # (N,)
    at = (starts[:, None] - 1 + torch.arange(width, device=lm.device)[None, :]).clamp(max=logits.shape[1] - 1)
    predict = logits[torch.arange(n, device=lm.device)[:, None], at]  # (N, W, V)
    after = logits[torch.arange(n, device=lm.device), torch.tensor([len(r) - 1 for r in rows], device=lm.device)]
    return PrefixLogits(predict, after)


def forward_alone(lm: LoadedModel, prompts: Sequence[str], max_prompt_tokens: int = 128,
                  head: DirectionsHead | None = None, fmt: PromptFormat | None = None) -> Callable[[], object]:
    """The model forward ``probe`` runs for ``prompts``, inputs prepared: the limit a bench times it against."""
    if head is not None:
        input_ids, mask = encode_queries(fmt or PromptFormat.of(lm.tokenizer), prompts, max_prompt_tokens,
                                         lm.tokenizer.pad_token_id, lm.tokenizer.padding_side)
        input_ids, mask = input_ids.to(lm.device), mask.to(lm.device)
        return torch.no_grad()(lambda: last_token_features(lm.model, input_ids, mask))
    pieces = _likelihood_pieces(lm.tokenizer)
    if pieces.yes is None:
        raise ValueError("forward_alone: this tokenizer takes the two-forward likelihood path")
    contexts = _likelihood_contexts(lm, prompts, max_prompt_tokens)
    shared = unsupported(lm.model) is None
    return torch.no_grad()(lambda: _row_logits(lm, contexts, pieces.continuations, shared))


def _right_padded(rows: Sequence[Sequence[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, T) ids and mask; right padding keeps positions 0..len-1 for every row."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return input_ids.to(device), mask.to(device)


def _likelihood_scores_two_forwards(lm: LoadedModel, prompts: Sequence[str], max_prompt_tokens: int
                                    ) -> tuple[tuple[str, ...], torch.Tensor, list[float], list[int]]:
    """The likelihood method in two forwards: directions, then the risk flag after the best one."""
    names = DIRECTION_NAMES
    queries = [format_probe_query(p) for p in prompts]
    contexts = [q for q in queries for _ in names]
    continuations = [f" {name}" for _ in queries for name in names]
    scores, direction_tokens = _continuation_logprobs(lm, contexts, continuations, max_prompt_tokens)
    probs = torch.softmax(scores.view(len(prompts), len(names)), dim=-1)  # (P, D)
    best = probs.argmax(dim=-1).tolist()
    risk_contexts = [f"{q} {names[b]}\n{RISK_PREFIX.rstrip()}" for q, b in zip(queries, best, strict=True)]
    risk_scores, risk_tokens = _continuation_logprobs(
        lm, [c for c in risk_contexts for _ in (0, 1)], [" yes", " no"] * len(prompts), max_prompt_tokens + 8
    )
    risk = torch.softmax(risk_scores.view(len(prompts), 2), dim=-1)[:, 0].tolist()  # P(yes)
    d = len(names)
    tokens = [sum(direction_tokens[i * d: (i + 1) * d]) + sum(risk_tokens[2 * i: 2 * i + 2])
              for i in range(len(prompts))]
    return names, probs, risk, tokens


def _head_scores(lm: LoadedModel, head: DirectionsHead, prompts: Sequence[str], max_prompt_tokens: int,
                 fmt: PromptFormat | None) -> tuple[tuple[str, ...], torch.Tensor, list[float], list[int]]:
    """The head's names, (P, D) direction scores, P(risk) and tokens read, from one forward."""
    features, tokens = prompt_features(lm, prompts, max_prompt_tokens, fmt)  # (P, H)
    direction_logits, risk_logits = head.logits(features)
    probs = torch.softmax(direction_logits, dim=-1).cpu()  # (P, D)
    return head.names, probs, torch.sigmoid(risk_logits).cpu().tolist(), tokens


@torch.no_grad()
def probe(lm: LoadedModel, prompts: Sequence[str], rules: ProbeRules, max_prompt_tokens: int = 128,
          head: DirectionsHead | None = None, fmt: PromptFormat | None = None) -> list[ProbeResult]:
    """Directions, confidence and caution for each prompt: by ``head`` when given, else by likelihood.

    ``head`` must sit on ``lm``'s device; ``fmt`` is ``PromptFormat.of(lm.tokenizer)`` (built when None).
    """
    if not prompts:
        return []
    if head is not None:
        names, probs, risk, tokens = _head_scores(lm, head, prompts, max_prompt_tokens, fmt)
    else:
        names, probs, risk, tokens = _likelihood_scores(lm, prompts, max_prompt_tokens)
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
        results.append(ProbeResult(directions, confidence, float(risk[i]), bool(reasons), "; ".join(reasons),
                                   int(tokens[i])))
    return results
