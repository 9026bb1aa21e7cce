"""Whatever the scheduler accepts, the tiers serve: the limits of both sides, walked at their edges.

The generator's checks are those of its gRPC servicer and its Kafka worker (strata.validation and
strata.sampling with GeneratorSettings' bounds); the scheduler's are strata.validation.validate_submit
with the scheduler's settings.
"""

from __future__ import annotations

import math

import pytest

from strata.contract import limits
from strata.models.budget import TokenBudget
from strata.models.generation import SamplingConfig, generate
from strata.models.loading import load_causal_lm
from strata.sampling import SamplingRequest as Sampling
from strata.sampling import resolve_sampling
from strata.validation import RequestError, check_n_samples, check_prompt, validate_submit
from svc_generator.config import GeneratorSettings
from svc_scheduler.config import SchedulerSettings

SCHEDULER = SchedulerSettings()
TIERS = [GeneratorSettings(tier=1), GeneratorSettings(tier=2)]


def served_by_every_tier(prompt: str, sampling: Sampling, n_samples: int) -> None:
    for tier in TIERS:
        check_prompt(prompt, tier.max_prompt_chars)
        check_n_samples(n_samples, tier.max_samples_per_request)
        resolve_sampling(tier.sampling_defaults(), tier.sampling_bounds(), temperature=sampling.temperature,
                         top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens, seed=sampling.seed,
                         rollout_dropout=sampling.rollout_dropout)


EDGES = [
    ("longest prompt", "é" * SCHEDULER.max_prompt_chars, Sampling(), 1),
    ("most samples", "hi", Sampling(), SCHEDULER.max_n_samples),
    ("longest response", "hi", Sampling(max_new_tokens=SCHEDULER.max_new_tokens_limit), 1),
    ("coolest temperature", "hi", Sampling(temperature=math.nextafter(SCHEDULER.min_temperature, 9.0)), 1),
    ("hottest temperature", "hi", Sampling(temperature=SCHEDULER.max_temperature), 1),
    ("widest top_p", "hi", Sampling(top_p=math.nextafter(SCHEDULER.max_top_p, 0.0)), 1),
    ("dropout", "hi", Sampling(rollout_dropout=0.5), 1),
]


@pytest.mark.parametrize(("name", "prompt", "sampling", "n_samples"), EDGES, ids=[e[0] for e in EDGES])
def test_the_edge_of_what_the_scheduler_accepts_is_served(name: str, prompt: str, sampling: Sampling,
                                                          n_samples: int) -> None:
    accepted = validate_submit(prompt, sampling, n_samples, "", SCHEDULER.submit_limits())
    served_by_every_tier(accepted.prompt, accepted.sampling, accepted.n_samples)


BEYOND = [
    ("prompt", "x" * (SCHEDULER.max_prompt_chars + 1), Sampling(), 1),
    ("n_samples", "hi", Sampling(), SCHEDULER.max_n_samples + 1),
    ("sampling.max_new_tokens", "hi", Sampling(max_new_tokens=SCHEDULER.max_new_tokens_limit + 1), 1),
    ("sampling.temperature", "hi", Sampling(temperature=SCHEDULER.min_temperature), 1),
    ("sampling.top_p", "hi", Sampling(top_p=SCHEDULER.max_top_p), 1),
]


@pytest.mark.parametrize(("field", "prompt", "sampling", "n_samples"), BEYOND, ids=[b[0] for b in BEYOND])
def test_one_step_beyond_is_refused_at_the_door(field: str, prompt: str, sampling: Sampling, n_samples: int) -> None:
    with pytest.raises(RequestError) as refused:
        validate_submit(prompt, sampling, n_samples, "", SCHEDULER.submit_limits())
    assert refused.value.field == field


def test_the_defaults_come_from_the_contract() -> None:
    assert SCHEDULER.max_new_tokens_limit == limits.MAX_NEW_TOKENS == TIERS[0].max_new_tokens_limit
    assert SCHEDULER.max_n_samples == limits.MAX_N_SAMPLES == TIERS[0].max_samples_per_request
    assert SCHEDULER.max_prompt_chars == limits.MAX_PROMPT_CHARS == TIERS[0].max_prompt_chars


def _prompt_of(budget: TokenBudget, tokens: int) -> str:
    """A prompt of plain words that takes exactly ``tokens`` positions with the template, if one exists
    near it (words cost a token or two each, so the last step may overshoot by one)."""
    words = 1
    while budget.prompt_tokens("word " * words) < tokens:
        words += 1
    return "word " * words


def test_the_longest_prompt_the_door_accepts_is_generated_whole(zoo) -> None:
    # The tiers' models read n_positions tokens: prompt (with the longest directions) + new tokens.
    budget = TokenBudget.of_model("Level-1", zoo.level1)
    max_new = 64
    fitting = _prompt_of(budget, budget.n_positions - max_new - 1)
    while budget.prompt_tokens(fitting) + max_new > budget.n_positions:
        fitting = fitting[: -len("word ")]
    accepted = validate_submit(fitting, Sampling(max_new_tokens=max_new), 1, "", SCHEDULER.submit_limits(), [budget])
    lm = load_causal_lm(zoo.level1, device="cpu")
    [generated] = generate(lm, [accepted.prompt], [list(budget.directions)],
                           SamplingConfig(temperature=0.8, max_new_tokens=max_new, seed=0))
    assert generated.n_tokens <= max_new
    # Longer, or asking for more new tokens, no longer fits: refused at the door, naming the field.
    for prompt, new in ((fitting + "word " * 8, max_new), (fitting, max_new + 8)):
        with pytest.raises(RequestError, match="positions of the Level-1 model") as refused:
            validate_submit(prompt, Sampling(max_new_tokens=new), 1, "", SCHEDULER.submit_limits(), [budget])
        assert refused.value.field == "prompt"


def test_tiers_that_read_alike_are_checked_once(zoo) -> None:
    # Both zoo tiers share a tokenizer and 256 positions: one tokenization per prompt serves both.
    from svc_scheduler.__main__ import tier_budgets

    settings = SchedulerSettings(level1_model=str(zoo.level1), level2_model=str(zoo.level2))
    assert [b.name for b in tier_budgets(settings)] == ["Level-1"]
    assert tier_budgets(settings.model_copy(update={"check_prompt_tokens": False})) == []


@pytest.mark.parametrize(("field", "value"),
                         [("temperature", SCHEDULER.min_temperature), ("top_p", SCHEDULER.max_top_p)])
def test_a_bound_sent_over_the_wire_is_still_the_bound(field: str, value: float) -> None:
    """SamplingParams carries float32: 0.3 arrives as 0.30000001, which must not pass "> 0.3"."""
    from strata.v1 import common_pb2
    from strata.validation import requested_sampling

    wire = common_pb2.SamplingParams.FromString(common_pb2.SamplingParams(**{field: value}).SerializeToString())
    assert getattr(wire, field) != value  # float32 rounding happened
    with pytest.raises(RequestError) as refused:
        validate_submit("hi", requested_sampling(wire), 1, "", SCHEDULER.submit_limits())
    assert refused.value.field == f"sampling.{field}"
