"""Distribution shift (seed §5.1 row 2): how likely are recent rollouts under the current policy?

Symptom: the PPO loss does not go down while the KL keeps climbing. Check: the mean log-prob of the
rollout samples under the current policy; under -150 the shift is too large. Cure (R17): the KL
penalty warm-up, the coefficient rising linearly from 0 to its target over the first 100 steps.

A sample's log-prob is the sum over its response tokens of log pi(token | prompt context, earlier
tokens), exactly the tokens the generator wrote (read back from the content store) after the same
templated prompt the generator saw. The mean over samples is compared with the bound, as in the
article; the per-token mean is reported beside it (it does not depend on response length).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from strata_tools.diagnose.verdict import CheckResult, Verdict

NAME = "shift"
CURE = ("enable the KL-penalty warm-up (R17): svc_learner --kl-coef <target> --kl-warmup-updates 100 "
        "(the coefficient rises linearly from 0 over the first 100 updates); keep --max-staleness small")


@dataclass(frozen=True)
class ShiftConfig:
    min_mean_logprob: float = -150.0   # mean sequence log-prob under which the check alarms
    max_samples: int = 64              # most recent rollouts read
    batch_size: int = 8                # sequences per forward pass


@dataclass(frozen=True)
class Rollout:
    prompt_ids: tuple[int, ...]        # the templated prompt, as the generator tokenised it
    response_ids: tuple[int, ...]      # the response tokens as generated (EOS included if it came)
    policy_version: int                # version that generated it (R13)


@torch.no_grad()
def sequence_logprobs(model: torch.nn.Module, rollouts: Sequence[Rollout], pad_token_id: int,
                      batch_size: int = 8) -> list[float]:
    """Sum of response-token log-probs of each rollout under ``model`` (a causal LM)."""
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(rollouts), batch_size):
        chunk = rollouts[start : start + batch_size]
        width = max(len(r.prompt_ids) + len(r.response_ids) for r in chunk)
        ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)  # (B, T), right padding
        mask = torch.zeros((len(chunk), width), dtype=torch.long)  # (B, T)
        response = torch.zeros((len(chunk), width), dtype=torch.bool)  # (B, T)
        for row, r in enumerate(chunk):
            n_prompt, n_all = len(r.prompt_ids), len(r.prompt_ids) + len(r.response_ids)
            ids[row, :n_all] = torch.tensor([*r.prompt_ids, *r.response_ids])
            mask[row, :n_all] = 1
            response[row, n_prompt:n_all] = True
        ids, mask, response = ids.to(device), mask.to(device), response.to(device)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()  # (B, T-1, V)
        logp = torch.gather(F.log_softmax(logits, dim=-1), -1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
        out.extend((logp * response[:, 1:]).sum(dim=1).tolist())  # column j scores token j + 1
    return out


@dataclass(frozen=True)
class ShiftMeasurement:
    logprobs: list[float]              # one per rollout
    tokens: list[int]                  # response tokens per rollout
    rollout_versions: list[int]
    policy: str                        # what "the current policy" was (path, version)

    @property
    def mean(self) -> float:
        return sum(self.logprobs) / len(self.logprobs)

    @property
    def per_token(self) -> float:
        return sum(self.logprobs) / max(1, sum(self.tokens))


def evaluate(m: ShiftMeasurement, config: ShiftConfig) -> CheckResult:
    if not m.logprobs:
        raise ValueError("no rollouts to measure")
    versions = sorted(set(m.rollout_versions))
    span = f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]}-v{versions[-1]}"
    summary = (f"mean log-prob {m.mean:.1f} over {len(m.logprobs)} recent rollouts ({span}), "
               f"{m.per_token:.2f} per token, under policy {m.policy}")
    verdict = Verdict.ALARM if m.mean < config.min_mean_logprob else Verdict.PASS
    details = {"mean_logprob": m.mean, "per_token_logprob": m.per_token, "samples": len(m.logprobs),
               "min_logprob": min(m.logprobs), "rollout_versions": versions, "policy": m.policy}
    return CheckResult(NAME, verdict, m.mean, config.min_mean_logprob,
                       f"mean < {config.min_mean_logprob:g} alarms", summary, CURE, details)
