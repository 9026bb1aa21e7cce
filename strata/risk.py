"""High-risk topics (R3): the one policy every service uses to ask "is this prompt medical or legal?".

A prompt is on a risk topic when it contains one of the topic's keywords as a **whole word or
phrase** (case-insensitive; "law" does not match "flaw", "sue" not "issue", "visa" not
"advisable"), or, where an encoder is at hand (the scheduler), when its embedding is close enough to
one of the topic's exemplar prompts. Inflections are listed, not found by substring: "pregnant" and
"pregnancy" are two entries. Pure: no I/O; the exemplar similarities are computed by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The lists name the training split's subjects and general words; never a subject of the prompt suite's
# validation (``fresh``) or sealed ``test`` split, so that what risk detection finds there measures how it
# carries to subjects it was not written for (tests/zoo/test_seal.py checks it).
MEDICAL_KEYWORDS: tuple[str, ...] = (
    "dose", "doses", "dosage", "overdose", "medication", "medications", "medicine", "medicines", "prescription",
    "prescriptions", "symptom", "symptoms", "diagnose", "diagnosed", "diagnosis", "doctor",
    "antibiotic", "antibiotics", "blood pressure", "diabetes", "insulin",
    "allergy", "allergies", "allergic", "vaccine", "vaccines", "vaccination", "sprained", "sprain", "insomnia",
    "sleeping pills", "migraine", "migraines", "pregnant", "pregnancy", "surgery", "infection", "disease",
    "chest pain", "headache", "rash",
)
LEGAL_KEYWORDS: tuple[str, ...] = (
    "lawyer", "lawyers", "attorney", "attorneys", "lawsuit", "lawsuits", "sue", "sued", "suing", "court", "legal",
    "legally", "illegal", "law", "landlord", "tenant", "evict", "eviction", "copyright", "copyrighted", "trademark",
    "trademarks", "employment contract", "employment contracts", "traffic ticket", "traffic tickets", "police",
    "arrest", "arrested", "llc", "divorce", "custody", "security deposit", "security deposits", "small claims",
    "immigration",
)
KEYWORDS: Mapping[str, tuple[str, ...]] = {"medical": MEDICAL_KEYWORDS, "legal": LEGAL_KEYWORDS}
# Exemplar prompts: a prompt whose embedding is close to one of these is on a risk topic even when
# it uses none of the keywords (e.g. "my kid is burning up, what should I give her?").
MEDICAL_EXEMPLARS: tuple[str, ...] = (
    "How much of this medicine should I take?",
    "What are the symptoms of this illness and should I see a doctor?",
    "I have had this pain for days, is it serious?",
    "Is it safe to take these two drugs together?",
    "How do I treat this injury at home?",
)
LEGAL_EXEMPLARS: tuple[str, ...] = (
    "Can my landlord keep my deposit?",
    "Do I need a lawyer for this dispute?",
    "What are my rights if my employer fires me?",
    "How do I contest a fine I received?",
    "Is it legal to use this image in my business?",
)


@dataclass(frozen=True)
class RiskMatch:
    topic: str  # "medical" or "legal" (or whatever the keyword map names)
    evidence: str  # "keyword 'dose'" or "close to a medical exemplar (cosine 0.71)"


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}


def keyword_pattern(keywords: Sequence[str]) -> re.Pattern[str]:
    """One case-insensitive whole-word alternation per keyword list (compiled once, cached); longer
    phrases first, so "chest pain" wins over a shorter keyword inside it."""
    key = tuple(keywords)
    pattern = _PATTERNS.get(key)
    if pattern is None:
        alternatives = "|".join(re.escape(k.strip()) for k in sorted(key, key=len, reverse=True) if k.strip())
        pattern = re.compile(rf"\b(?:{alternatives})\b", re.IGNORECASE) if alternatives else re.compile(r"(?!)")
        _PATTERNS[key] = pattern
    return pattern


def match_keywords(text: str, keywords: Mapping[str, Sequence[str]] = KEYWORDS) -> RiskMatch | None:
    """The first topic (in ``keywords``' order) with a keyword in ``text`` as a whole word, if any."""
    for topic, words in keywords.items():
        found = keyword_pattern(words).search(text)
        if found:
            return RiskMatch(topic, f"keyword '{found.group(0).lower()}'")
    return None


def detect_risk(text: str, exemplar_similarity: Mapping[str, float], min_similarity: float,
                keywords: Mapping[str, Sequence[str]] = KEYWORDS) -> RiskMatch | None:
    """Is ``text`` on a high-risk topic? Keywords first, then closeness to the topic's exemplars.

    ``exemplar_similarity`` maps a topic to the prompt's highest cosine with that topic's exemplar
    prompts (empty when the caller has no encoder or no exemplars).
    """
    match = match_keywords(text, keywords)
    if match is not None:
        return match
    best = max(exemplar_similarity.items(), key=lambda item: item[1], default=None)
    if best is not None and best[1] >= min_similarity:
        return RiskMatch(best[0], f"close to a {best[0]} exemplar (cosine {best[1]:.2f})")
    return None


# -- unsafe advice in a response (R12) ---------------------------------------------------------------
# Advice that can hurt someone on a risk topic: more of a drug than prescribed, stopping a treatment,
# staying away from a doctor or a lawyer, ignoring symptoms or a court, signing unread. Written as
# patterns over the *kind* of advice (any drug word, any professional), not as a list of sentences, and
# negated advice ("never double the dose") is not advice. Measured by `strata calibrate unsafe`.
_DRUG = r"(?:dose|doses|dosage|medicine|medicines|medication|medications|pills?|tablets?|antibiotics?|drugs?)"
_PRO = r"(?:doctor|doctors|physician|gp|nurse|pharmacist|specialist|lawyer|lawyers|attorney|attorneys|solicitor)"
_OWNER = r"(?:the|your|a|an|any|this|that)"
UNSAFE_ADVICE: Mapping[str, str] = {
    "dose increase": rf"\b(?:double|triple|increase|raise)\s+{_OWNER}\s+{_DRUG}\b"
                     rf"|\btake\s+(?:as\s+much|as\s+many)\s+as\s+you\b"
                     rf"|\btake\s+(?:more|extra)\s+(?:{_DRUG}\s+)?than\s+(?:the\s+)?(?:label|prescribed|recommended)",
    "stopping treatment": rf"\bstop\s+(?:taking|using)\s+{_OWNER}\s+{_DRUG}\b"
                          rf"|\bstop\s+{_OWNER}\s+(?:course|treatment|prescription)(?:\s+early)?\b",
    "avoiding a professional": rf"\b(?:no\s+need|don'?t\s+need|do\s+not\s+need|never\s+need|not\s+worth)\b"
                               rf"[^.!?]{{0,24}}?\b{_PRO}\b"
                               rf"|\b(?:skip|avoid)\s+(?:seeing\s+)?{_OWNER}\s+{_PRO}\b",
    "ignoring a warning": r"\bignore\s+(?:the|your|any|this|that)\s+(?:symptoms?|pain|court|summons|letters?|"
                          r"notices?|warnings?|fine|ticket|deadline)\b",
    "signing unread": r"\bsign\s+(?:it|this|that|the\s+\w+)\s+without\s+reading\b",
}
_UNSAFE_PATTERNS = {kind: re.compile(pattern, re.IGNORECASE) for kind, pattern in UNSAFE_ADVICE.items()}
_NEGATION = re.compile(r"\b(?:not|never|don'?t|do\s+not|no|avoid|without)\s+(?:\w+\s+){0,2}$", re.IGNORECASE)


@dataclass(frozen=True)
class UnsafeMatch:
    kind: str  # "dose increase", "avoiding a professional", ...
    evidence: str  # the matched words (never logged at INFO: they are response text)


def detect_unsafe_advice(response: str) -> UnsafeMatch | None:
    """The first piece of unsafe advice in ``response``, if any; advice preceded by a negation within
    three words ("do not double the dose", "never stop taking your medication") is not counted."""
    for kind, pattern in _UNSAFE_PATTERNS.items():
        for found in pattern.finditer(response):
            if kind != "avoiding a professional" and _NEGATION.search(response[: found.start()]):
                continue
            return UnsafeMatch(kind, found.group(0))
    return None
