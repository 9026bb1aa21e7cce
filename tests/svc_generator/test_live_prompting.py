"""One definition of how a tier is prompted (R27): the paths that measure Level-1's answers give the
generator exactly what the live stack gives it, probe to generator, to the token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from strata.v1 import common_pb2, events_pb2
from strata_tools.level1 import LivePrompting, generate_answers
from svc_generator.backends.hf import HfBackend
from svc_generator.config import GeneratorSettings
from svc_generator.worker import live_request
from svc_probe.config import ProbeSettings
from svc_probe.core import ProbeResult
from svc_probe.worker import forward

PROMPT = "How do I reverse a linked list in Python?"
PROBED = ProbeResult((("give_code", 0.6), ("give_steps", 0.3), ("explain_principle", 0.1)), 0.6, 0.05, False, "")


def live_path(backend: HfBackend) -> tuple:
    """Scheduler event (the training driver sets no sampling) -> probe worker -> generator worker's request."""
    routed = events_pb2.PromptRouted(prompt_hash="a" * 64, tier=common_pb2.TIER_LEVEL_0, n_samples=1,
                                     request_id="r1", decision=common_pb2.DECISION_LEVEL_1)
    forwarded = forward(routed, PROBED, ProbeSettings().forward_directions)
    assert forwarded.tier == common_pb2.TIER_LEVEL_1
    return live_request(forwarded, PROMPT, GeneratorSettings(tier=1), backend.prompt_format)


def measuring_path() -> tuple:
    prompting = LivePrompting.live(1)
    return prompting.request(PROMPT, prompting.directions(PROBED), seed=None)


@pytest.fixture(scope="module")
def backend(zoo) -> HfBackend:
    return HfBackend(str(zoo.level1), "cpu")


def token_ids(backend: HfBackend, request) -> list[int]:
    text = backend.prompt_format.generator_text(request.prompt, request.directions)
    return backend.prompt_format.encode([text])["input_ids"][0]


@pytest.mark.parametrize("environment", [
    {},  # the defaults: one direction forwarded, rollout dropout 0.1 on Level-1
    {"STRATA_FORWARD_DIRECTIONS": "3", "STRATA_ROLLOUT_DROPOUT": "0.2", "STRATA_TEMPERATURE": "1.1"},
])
def test_the_measuring_path_feeds_the_generator_the_live_token_ids_and_sampling(
        backend: HfBackend, environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    live, measured = live_path(backend), measuring_path()
    assert measured == live  # prompt, directions and every sampling field
    assert token_ids(backend, measured) == token_ids(backend, live)
    forwarded = int(environment.get("STRATA_FORWARD_DIRECTIONS", "1"))
    assert live.directions == ("give_code", "give_steps", "explain_principle")[:forwarded]
    assert live.sampling.rollout_dropout == float(environment.get("STRATA_ROLLOUT_DROPOUT", "0.1"))
    # What the measuring paths wrote before: the probe's top 3, no dropout. The definition is not that.
    if not environment:
        assert token_ids(backend, replace(live, directions=tuple(n for n, _ in PROBED.directions))) != \
            token_ids(backend, live)


def test_measured_answers_are_what_the_generator_samples_for_the_same_seed(backend: HfBackend) -> None:
    prompting = LivePrompting.live(1)
    [measured] = generate_answers(backend, prompting, [PROMPT], [prompting.directions(PROBED)], seed=17)
    [live] = backend.generate([replace(live_path(backend), sampling=replace(live_path(backend).sampling, seed=17))])
    assert measured.token_ids == live.token_ids
    with pytest.raises(ValueError, match="one directions entry per prompt"):
        generate_answers(backend, prompting, [PROMPT, PROMPT], [()], seed=1)
