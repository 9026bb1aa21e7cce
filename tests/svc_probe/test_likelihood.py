"""The likelihood method's one forward reads what its two forwards read, on the zoo's probe."""

from __future__ import annotations

import pytest
import torch

from strata.models.loading import load_causal_lm
from strata_tools.task.suite import load_suite
from svc_probe.core import _likelihood_scores, _likelihood_scores_two_forwards


@pytest.fixture(scope="module")
def probe_lm(zoo):
    return load_causal_lm(zoo.probe, device="cpu")


def test_one_forward_gives_the_two_forward_directions_and_risk(probe_lm) -> None:
    prompts = [r.text for r in load_suite("eval")[:24]]
    names, probs, risk, tokens = _likelihood_scores(probe_lm, prompts, 128)
    names_2, probs_2, risk_2, _ = _likelihood_scores_two_forwards(probe_lm, prompts, 128)
    assert names == names_2
    assert torch.allclose(probs, probs_2, atol=1e-5)
    assert risk == pytest.approx(risk_2, abs=1e-5)
    assert all(t > 6 * 2 for t in tokens)  # the query, then six continuations of direction + "Risk:"
