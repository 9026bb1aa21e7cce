import math

import pytest

from strata.sampling import Sampling, SamplingBounds, SamplingError, resolve_sampling

DEFAULTS = Sampling(temperature=0.8, top_p=0.9, max_new_tokens=64)
STRICT = SamplingBounds()
LENIENT = SamplingBounds(allow_out_of_range=True)


def test_unset_values_take_the_defaults() -> None:
    result = resolve_sampling(DEFAULTS, STRICT)
    assert result.sampling == DEFAULTS and result.warnings == ()


def test_given_values_win() -> None:
    result = resolve_sampling(DEFAULTS, STRICT, temperature=1.2, top_p=0.5, max_new_tokens=8, seed=7)
    assert result.sampling == Sampling(1.2, 0.5, 8, 7, None)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": 0.3}, "sampling.temperature"),   # R16 bound is exclusive
        ({"temperature": 0.1}, "sampling.temperature"),
        ({"top_p": 0.95}, "sampling.top_p"),
        ({"top_p": 0.99}, "sampling.top_p"),
    ],
)
def test_r16_violations_are_rejected_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(SamplingError) as err:
        resolve_sampling(DEFAULTS, STRICT, **kwargs)
    assert err.value.field == field
    assert str(err.value).startswith(field + ": must be")


def test_r16_violations_can_be_allowed_with_a_warning() -> None:
    result = resolve_sampling(DEFAULTS, LENIENT, temperature=0.2, top_p=0.99)
    assert result.sampling.temperature == 0.2
    assert [w.split(":")[0] for w in result.warnings] == ["sampling.temperature", "sampling.top_p"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": 0.0}, "sampling.temperature"),
        ({"temperature": -1.0}, "sampling.temperature"),
        ({"temperature": math.nan}, "sampling.temperature"),
        ({"temperature": 5.0}, "sampling.temperature"),
        ({"top_p": 0.0}, "sampling.top_p"),
        ({"top_p": 1.5}, "sampling.top_p"),
        ({"max_new_tokens": 0}, "sampling.max_new_tokens"),
        ({"max_new_tokens": 10_000}, "sampling.max_new_tokens"),
        ({"rollout_dropout": 1.0}, "sampling.rollout_dropout"),
    ],
)
def test_impossible_values_are_rejected_even_when_lenient(kwargs: dict, field: str) -> None:
    with pytest.raises(SamplingError) as err:
        resolve_sampling(DEFAULTS, LENIENT, **kwargs)
    assert err.value.field == field
