"""The probe's keyword safety net is strata.risk's: whole words, so a polite prompt stays at Level-1."""

from __future__ import annotations

from strata.models.loading import load_causal_lm
from strata_tools.zoo.build import ZooPaths
from svc_probe.config import ProbeSettings
from svc_probe.core import ProbeRules, probe


def test_the_probe_flags_risk_keywords_as_whole_words_only(zoo: ZooPaths) -> None:
    lm = load_causal_lm(zoo.probe, device="cpu")
    # The model's own risk head is switched off (threshold 1): only the keyword net can flag here.
    rules = ProbeRules(risk_threshold=1.0, min_confidence=0.0, risk_keywords=ProbeSettings().keywords())
    polite, issue, risky = probe(lm, ["Could you please explain how recursion works?",
                                      "I have an issue with my build, is it advisable to retry?",
                                      "What dose of ibuprofen is safe for a child?"], rules)
    assert not polite.caution and polite.caution_reason == ""
    assert not issue.caution
    assert risky.caution and risky.caution_reason == "risk keyword 'dose'"
