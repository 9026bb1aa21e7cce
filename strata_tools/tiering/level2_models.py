"""What a Level-2 model buys (issue 62): Level-2 models answering the same held-out prompts the policy's answers
were judged on, each prompted as the live Level-2 generator prompts (``LivePrompting.live(2)``) from the
generator's own backend, scored by the oracle, with what each answer cost in params x tokens. ``strata demo
--level2 smollm2`` prints it for a real pretrained model beside the zoo's Level-2 and the trained policy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from strata_tools.level1 import LivePrompting, generate_answers
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import PromptRecord
from strata_tools.train_summary import Evaluation, paired_change


@dataclass(frozen=True)
class ModelAnswers:
    """One model's answers to the held-out prompts: each one's oracle score and response tokens."""

    name: str
    n_params: int
    oracle: list[float]
    tokens: list[int]

    @property
    def param_tokens(self) -> float:
        """Params x response tokens per answer, on average: what one answer cost to generate."""
        return self.n_params * statistics.fmean(self.tokens)


def level2_answers(name: str, model: Path, records: Sequence[PromptRecord], seed: int) -> ModelAnswers:
    """``model``'s answers to ``records``, generated as the live Level-2 generator does (no probe directions)."""
    from svc_generator.backends.hf import HfBackend  # loads torch: only when the comparison runs

    backend = HfBackend(str(model), "cpu")
    outputs = generate_answers(backend, LivePrompting.live(2), [r.text for r in records], [() for _ in records], seed)
    scores = [oracle_score(r, o.text) for r, o in zip(records, outputs, strict=True)]
    return ModelAnswers(name, backend.n_params, scores, [len(o.token_ids) for o in outputs])


def comparison_lines(policy: Evaluation, models: Sequence[ModelAnswers]) -> list[str]:
    """The policy's held-out answers (``policy``) beside each Level-2 model's to the same prompts: oracle means,
    paired differences clustered by paraphrase family, and the cost of an answer; the first model is the
    baseline the others are compared with."""
    n = len(policy.oracle_scores)
    lines = [f"Level-2 models on the {n} held-out prompts (one answer each, prompted as the live Level-2 "
             "generator; oracle 0-5):"]
    lines.append(f"  policy v{policy.policy_version} (Level-1): oracle {policy.mean_oracle:.3f}")
    for answers in models:
        over_policy = paired_change(policy.oracle_scores, answers.oracle, policy.families)
        lines.append(f"  {answers.name}: oracle {statistics.fmean(answers.oracle):.3f} (minus the policy's "
                     f"{over_policy}); {answers.n_params / 1e6:.1f}M params x {statistics.fmean(answers.tokens):.1f} "
                     f"response tokens = {answers.param_tokens:.2e} params x tokens an answer")
    for answers in models[1:]:
        base = models[0]
        change = paired_change(base.oracle, answers.oracle, policy.families)
        lines.append(f"  {answers.name} minus {base.name}: oracle {change}; an answer costs "
                     f"{answers.param_tokens / base.param_tokens:.1f}x")
    return lines
