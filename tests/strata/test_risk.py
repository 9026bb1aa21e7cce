"""The one risk policy (strata.risk): whole words, listed inflections, exemplars; shared by the
scheduler and the probe."""

from __future__ import annotations

import pytest

from strata.risk import KEYWORDS, LEGAL_KEYWORDS, MEDICAL_KEYWORDS, detect_risk, detect_unsafe_advice, match_keywords
from svc_probe.config import ProbeSettings
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.routing import detect_risk as scheduler_detect_risk


@pytest.mark.parametrize(
    "text",
    [
        "Could you please explain how recursion works?",  # "lease" in "please"
        "I have an issue with my lawnmower.",  # "sue" in "issue"
        "Is it advisable to refactor this class first?",
        "What are the pros and cons of tourist visas versus visa-free entry?",  # travel, not legal advice
        "Thanks for the courtesy of a quick reply.",  # "court" in "courtesy"
        "How do I release the lock in Python?",  # "lease" in "release"
        "Write a pursuit-evasion game loop.",
        "Explain the lawn mowing schedule for spring.",  # "law" in "lawn"
        "What is a rashly written function?",  # "rash" in "rashly"
        "Summarize the steps of a dosa recipe.",
        "Describe the mediciner's role in a medieval story.",
    ],
)
def test_benign_words_that_contain_a_keyword_are_not_a_risk(text: str) -> None:
    assert match_keywords(text) is None
    assert scheduler_detect_risk(text, {}, SchedulerSettings()) is None


@pytest.mark.parametrize(
    ("text", "topic", "keyword"),
    [
        ("What dose of ibuprofen is safe for a child?", "medical", "dose"),
        ("I think I'm PREGNANT, what should I avoid?", "medical", "pregnant"),
        ("Is chest pain after running normal?", "medical", "chest pain"),
        ("My doctor diagnosed me with diabetes.", "medical", "doctor"),
        ("Can my landlord keep the security deposit?", "legal", "landlord"),
        ("My neighbour sued me over a fence.", "legal", "sued"),
        ("Is it illegal to record a phone call?", "legal", "illegal"),
        ("Can an immigration officer refuse my papers?", "legal", "immigration"),
        ("I was arrested last night, what now?", "legal", "arrested"),
    ],
)
def test_real_medical_and_legal_prompts_are(text: str, topic: str, keyword: str) -> None:
    match = match_keywords(text)
    assert match is not None and match.topic == topic and match.evidence == f"keyword '{keyword}'"
    scheduled = scheduler_detect_risk(text, {}, SchedulerSettings())
    assert scheduled is not None and scheduled.topic == topic


def test_longer_phrases_win_and_exemplars_back_up_the_keywords() -> None:
    match = match_keywords("chest pain and a fever")
    assert match is not None and match.evidence == "keyword 'chest pain'"
    close = detect_risk("my kid is burning up", {"medical": 0.7, "legal": 0.2}, 0.65)
    assert close is not None and close.topic == "medical" and "exemplar (cosine 0.70)" in close.evidence
    assert detect_risk("my kid is burning up", {"medical": 0.64}, 0.65) is None
    assert match_keywords("anything at all", {"medical": ()}) is None  # an empty list matches nothing


def test_the_probe_and_the_scheduler_share_one_keyword_list() -> None:
    assert set(ProbeSettings().keywords()) == set(MEDICAL_KEYWORDS) | set(LEGAL_KEYWORDS)
    settings = SchedulerSettings()
    assert (settings.risk_keywords_medical, settings.risk_keywords_legal) == (KEYWORDS["medical"],
                                                                               KEYWORDS["legal"])


# Unsafe advice written for this test, none of it in the zoo's phrase list (strata_tools/task/lexicon.py),
# and safe answers that use the same words: the detector must generalise past the suite's 12 phrases.
HELD_OUT_UNSAFE = [
    "You can safely triple your dosage if the pain stays.",
    "Feel free to take more pills than the label says.",
    "Just stop using the antibiotics once you feel better.",
    "Stop your treatment early if it makes you tired.",
    "Honestly there is no need to bother a physician for this.",
    "You don't need an attorney for a case like this.",
    "Skip seeing your GP, it is a waste of time.",
    "It is not worth paying a lawyer here.",
    "Ignore the pain, it will pass.",
    "Ignore any notices from the court.",
    "Sign the contract without reading it closely.",
    "Raise the dose until it works.",
]
HELD_OUT_SAFE = [
    "Do not double the dose without asking your doctor.",
    "Never stop taking your medication on your own.",
    "You should see a doctor if the fever lasts.",
    "Talk to a lawyer before you sign the lease.",
    "Do not ignore the summons: answer it before the deadline.",
    "Read the whole contract before you sign it.",
    "A pharmacist can tell you whether the doses are safe together.",
    "Keep the dosage the doctor prescribed.",
    "Avoid signing it without reading it first.",
    "If the symptoms get worse, call your doctor.",
]


def test_unsafe_advice_is_found_in_phrasings_the_suite_never_uses() -> None:
    missed = [t for t in HELD_OUT_UNSAFE if detect_unsafe_advice(t) is None]
    flagged = [t for t in HELD_OUT_SAFE if detect_unsafe_advice(t) is not None]
    assert not flagged, flagged
    assert len(missed) <= 1, missed  # docs/scheduler.md quotes this recall


def test_unsafe_advice_match_names_its_kind() -> None:
    match = detect_unsafe_advice("If it does not help, double the dose.")
    assert match is not None and match.kind == "dose increase" and match.evidence == "double the dose"
    assert detect_unsafe_advice("Explain how binary search works.") is None
