"""Repetition (seed §5.1 row 5): roll the same prompt out many times; how many answers repeat?

Symptom: more than 40% of the responses to one prompt are identical. Likely cause: a temperature
too low or a top-p too small, often overridden by accident. Check: print the temperature and top-p
in effect at sampling time. Cure: assert ``temperature > 0.3 and top_p < 0.95`` at the entry of the
sampling function (Strata's generator rejects values outside these bounds unless the deployment
sets ``allow_out_of_range_sampling``).

The number is the duplicate share: responses identical to an earlier response of the same prompt,
over all responses, ``(n - distinct) / n`` (0 when all differ, (n-1)/n when all are the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata_tools.diagnose.verdict import CheckResult, Verdict

NAME = "repetition"
CURE = ("raise the temperature / lower top-p and find what overrode them; assert `temperature > 0.3 and "
        "top_p < 0.95` at the sampling entry (svc_generator: leave allow_out_of_range_sampling off)")
DEFAULT_PROMPT = "Explain how a hash table works, with an example."


@dataclass(frozen=True)
class RepetitionConfig:
    n_rollouts: int = 20                # responses to the same prompt
    max_duplicate_share: float = 0.4    # share above which the check alarms
    min_temperature: float = 0.3        # sampling sanity bounds printed with the result (R16)
    max_top_p: float = 0.95


def duplicate_share(responses: Sequence[str]) -> float:
    if not responses:
        raise ValueError("no responses")
    return (len(responses) - len(set(responses))) / len(responses)


def sampling_problems(temperature: float, top_p: float, config: RepetitionConfig) -> list[str]:
    """The R16 sampling assertions that the parameters in effect break."""
    problems = []
    if not temperature > config.min_temperature:
        problems.append(f"temperature {temperature:g} <= {config.min_temperature:g}")
    if not top_p < config.max_top_p:
        problems.append(f"top_p {top_p:g} >= {config.max_top_p:g}")
    return problems


@dataclass(frozen=True)
class RepetitionMeasurement:
    responses: list[str]
    temperature: float          # sampling parameters the generator reported as in effect
    top_p: float
    max_new_tokens: int
    model_id: str


def evaluate(m: RepetitionMeasurement, config: RepetitionConfig) -> CheckResult:
    share = duplicate_share(m.responses)
    distinct = len(set(m.responses))
    problems = sampling_problems(m.temperature, m.top_p, config)
    params = f"temperature={m.temperature:g} top_p={m.top_p:g} max_new_tokens={m.max_new_tokens}"
    summary = (f"{share:.0%} duplicates ({distinct} distinct of {len(m.responses)} responses to one prompt); "
               f"sampling in effect: {params}")
    if problems:
        summary += f" -- breaks the R16 bounds: {', '.join(problems)}"
    verdict = Verdict.ALARM if share > config.max_duplicate_share else Verdict.PASS
    details = {"duplicate_share": share, "distinct": distinct, "responses": len(m.responses),
               "temperature": m.temperature, "top_p": m.top_p, "max_new_tokens": m.max_new_tokens,
               "sampling_problems": problems, "model_id": m.model_id}
    return CheckResult(NAME, verdict, share, config.max_duplicate_share,
                       f"share > {config.max_duplicate_share:g} alarms", summary, CURE, details)
