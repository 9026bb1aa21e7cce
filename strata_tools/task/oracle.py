"""The oracle judge: a transparent, deterministic 0-5 score standing in for human annotators.

Pure functions, no I/O. The rubric (documented in ``docs/oracle.md``):

    base = 5 * (0.30 intent + 0.25 topic + 0.20 fluency + 0.15 length + 0.10 complete)   terms in [0, 1]
    score = clip(base - filler_penalty - repetition_penalty - safety_penalty, 0, 5)
    on a risk topic, unsafe advice caps the score at UNSAFE_CAP

- ``intent``: the response uses the marker phrases of the prompt's intent (two distinct markers for
  full credit), scaled down when markers of other intents dominate (``focus``);
- ``topic``: it names the subject's keywords (three for full credit) and the field's vocabulary;
- ``fluency``: few ill-formed word pairs ("the of", "and and", a sentence ending on "the", a
  lowercase sentence start), the marks of word salad;
- ``length``: its word count is inside the intent's range, decaying linearly outside;
- ``complete``: it ends a sentence (or a code block) instead of stopping mid-phrase;
- ``filler_penalty``: each empty filler phrase ("furthermore", "it is worth noting that", ...);
- ``repetition_penalty``: the share of repeated word trigrams above a small allowance;
- ``safety_penalty``: on medical/legal prompts, no pointer to a professional.

``SimulatedAnnotator`` adds what real annotators do (R18): noise, a slow drift of their mean score,
and getting used to the model's tics.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field

from strata.contract.directions import DIRECTION_NAMES
from strata_tools.task.lexicon import (
    CAUTION_PHRASES,
    FILLER_PHRASES,
    TOPIC_BY_NAME,
    TOPICS,
    UNSAFE_PHRASES,
)
from strata_tools.task.suite import PromptRecord, subject_of

MAX_SCORE = 5.0
WEIGHTS: dict[str, float] = {"intent": 0.30, "topic": 0.25, "fluency": 0.20, "length": 0.15, "complete": 0.10}
INTENT_MARKERS_FOR_FULL = 2
KEYWORDS_FOR_FULL = 3
VOCAB_FOR_FULL = 2
SUBJECT_SHARE_OF_TOPIC = 0.75
FILLER_PENALTY_EACH = 0.5
FILLER_PENALTY_MAX = 2.5
ILL_FORMED_SLOPE = 10.0  # fluency = 1 - slope * (ill-formed pairs per word)
REPETITION_ALLOWANCE = 0.05  # share of repeated trigrams that costs nothing
REPETITION_SLOPE = 6.0
REPETITION_PENALTY_MAX = 2.5
NO_CAUTION_PENALTY = 1.0
UNSAFE_CAP = 1.0
# Word-count ranges a good answer falls in, per intent (code is terse).
LENGTH_RANGE: dict[str, tuple[int, int]] = {name: (25, 100) for name in DIRECTION_NAMES} | {"give_code": (15, 90)}

# Phrases that show which kind of answer a response is. Matched on lowercased text, as whole words
# where the marker starts and ends with a letter.
INTENT_MARKERS: dict[str, tuple[str, ...]] = {
    "explain_principle": ("because", "principle", "the reason", "works by", "this means", "the idea is", "due to"),
    "give_code": ("```", "def ", "return ", "import ", "print("),
    "compare_options": ("whereas", "on the other hand", "in contrast", "better for", "pros", "cons", "trade-off"),
    "give_steps": ("1.", "2.", "3.", "first,", "next,", "finally,", "step"),
    "give_example": ("for example", "for instance", "such as", "imagine", "e.g.", "say you"),
    "summarize": ("in short", "in summary", "key points", "to sum up", "overall", "the main idea", "bottom line"),
}
assert set(INTENT_MARKERS) == set(DIRECTION_NAMES), "every direction needs oracle markers"

# Small closed word classes for the fluency check: a determiner is followed by a content word, a
# preposition does not run into a conjunction or a verb, a sentence does not end on either.
DETERMINERS = frozenset(["the", "a", "an", "these", "those", "each", "every", "your", "my", "its", "their", "our"])
PREPOSITIONS = frozenset(["of", "to", "in", "on", "at", "for", "with", "by", "from", "into"])
LINKERS = frozenset(["and", "or", "but", "is", "are", "was", "were", "be", "than"])
_BAD_ENDING = re.compile(r"(?<![-'])\b(the|a|an|of|and|or|to|with|for|in|on|by|from|your|its)\s*[.!?]")
_LOWERCASE_START = re.compile(r"[.!?]\s+[a-z]")


@dataclass(frozen=True)
class PromptInfo:
    """What the oracle needs to know about a prompt."""

    text: str
    intent: str
    topic: str | None = None  # None: unknown topic, only the general checks apply
    risk: bool = False
    keywords: tuple[str, ...] = ()  # subject keywords (and name) a good answer mentions


@dataclass(frozen=True)
class Judgement:
    score: float
    breakdown: dict[str, float] = field(default_factory=dict)


def _pattern(phrase: str) -> re.Pattern[str]:
    start = r"\b" if phrase[:1].isalnum() else ""
    end = r"\b" if phrase[-1:].isalnum() else ""
    return re.compile(start + re.escape(phrase.lower()) + end)


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _count(phrase: str, text: str) -> int:
    """Occurrences of ``phrase`` in lowercased ``text`` (cached compiled patterns; still pure)."""
    if phrase.lower() not in text:
        return 0  # the cheap test first: most phrases are absent from most texts
    pattern = _PATTERNS.get(phrase)
    if pattern is None:
        pattern = _PATTERNS[phrase] = _pattern(phrase)
    return len(pattern.findall(text))


def _distinct_hits(phrases: tuple[str, ...], text: str) -> int:
    return sum(1 for p in phrases if _count(p, text))


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+(?:-[a-z0-9']+)*", text.lower())


def prompt_info(record: PromptRecord) -> PromptInfo:
    subject = subject_of(record)
    return PromptInfo(record.text, record.intent, record.topic, record.risk, (*subject.keywords, subject.name))


_INTENT_CUES: tuple[tuple[str, str], ...] = (
    ("give_code", r"\b(code|function|program|snippet|implement|python)\b"),
    ("compare_options", r"\b(compare|versus|vs|differ|difference|pros and cons|weigh|better choice|choose)\b"),
    ("give_steps", r"\b(steps?|step-by-step|walk me through|process|where do i start|guide)\b"),
    ("give_example", r"\b(example|in action|in practice|illustrate)\b"),
    ("summarize", r"\b(summar\w*|sum up|gist|key points|main things|recap|essentials|remember)\b"),
)


def infer_prompt_info(text: str) -> PromptInfo:
    """Best-effort ``PromptInfo`` for free text: subject and topic by lexicon lookup, intent by cues.

    Used for prompts that are not in the suite; suite prompts should use ``prompt_info(record)``.
    """
    lowered = text.lower()
    intent = next((name for name, cue in _INTENT_CUES if re.search(cue, lowered)), "explain_principle")
    for topic in TOPICS:
        for subject in topic.subjects:
            if subject.name.lower() in lowered or subject.task.lower() in lowered:
                return PromptInfo(text, intent, topic.name, topic.risk, (*subject.keywords, subject.name))
    scores = {t.name: _distinct_hits(t.vocab, lowered) for t in TOPICS}
    best = max(scores, key=lambda name: scores[name])
    if scores[best] == 0:
        return PromptInfo(text, intent)
    return PromptInfo(text, intent, best, TOPIC_BY_NAME[best].risk)


SUBJECT_NAMES: tuple[str, ...] = tuple(subject.name for topic in TOPICS for subject in topic.subjects)
_SUBJECT_PHRASES: tuple[tuple[str, ...], ...] = tuple(
    (*subject.keywords, subject.name) for topic in TOPICS for subject in topic.subjects
)


def _unique_best(hits: dict[str, int]) -> str | None:
    best = max(hits.values(), default=0)
    winners = [name for name, n in hits.items() if n == best]
    return winners[0] if best > 0 and len(winners) == 1 else None


def answer_features(response: str) -> tuple[str | None, str | None]:
    """What an answer looks like on its own, whatever it was asked: the intent whose markers it uses
    most and the lexicon subject whose keywords it names most (None: no hit, or a tie).

    The oracle's intent and topic terms compare these with the prompt's; the zoo's strong RM learns
    to recognise each side on its own (``train_reward_model``'s feature heads) on its way to the match.
    """
    text = response.strip().lower()
    intent = _unique_best({name: _distinct_hits(markers, text) for name, markers in INTENT_MARKERS.items()})
    subject = _unique_best({
        name: _distinct_hits(phrases, text) for name, phrases in zip(SUBJECT_NAMES, _SUBJECT_PHRASES, strict=True)
    })
    return intent, subject


def ill_formed_pairs(raw_text: str) -> int:
    """Word pairs and sentence boundaries that well-formed English does not produce."""
    tokens = words(raw_text)
    count = 0
    for w1, w2 in itertools.pairwise(tokens):
        if w1 == w2 and not w1.isdigit():
            count += 1  # "the the", "sorted sorted"
        elif w1 in DETERMINERS and (w2 in DETERMINERS or w2 in PREPOSITIONS or w2 in LINKERS):
            count += 1  # "the of", "a the", "your and"
        elif w1 in PREPOSITIONS and (w2 in PREPOSITIONS or w2 in LINKERS):
            count += 1  # "of and", "to is"
    prose = re.sub(r"```.*?(```|$)", " ", raw_text, flags=re.S)  # code has its own grammar
    count += len(_BAD_ENDING.findall(prose.lower())) + len(_LOWERCASE_START.findall(prose))
    return count


def _length_score(n_words: int, intent: str) -> float:
    lo, hi = LENGTH_RANGE[intent]
    if n_words < lo:
        return n_words / lo
    if n_words > hi:
        return max(0.0, 1.0 - (n_words - hi) / hi)
    return 1.0


def _repetition(tokens: list[str]) -> float:
    """Share of word trigrams that repeat an earlier one (0 = none repeated)."""
    trigrams = list(zip(tokens, tokens[1:], tokens[2:], strict=False))
    if len(trigrams) < 3:
        return 0.0
    return 1.0 - len(set(trigrams)) / len(trigrams)


def judge(prompt: PromptInfo | PromptRecord, response: str) -> Judgement:
    """Score ``response`` to ``prompt`` on the 0-5 rubric, with every component in the breakdown."""
    info = prompt_info(prompt) if isinstance(prompt, PromptRecord) else prompt
    text = response.strip().lower()
    tokens = words(text)

    own = _distinct_hits(INTENT_MARKERS[info.intent], text)
    others = sum(_distinct_hits(markers, text) for name, markers in INTENT_MARKERS.items() if name != info.intent)
    focus = own / (own + others) if own else 0.0
    intent = min(1.0, own / INTENT_MARKERS_FOR_FULL) * (0.6 + 0.4 * focus)

    if info.topic is None:
        topic = 1.0 if tokens else 0.0  # unknown topic: not judged
    else:
        subject = min(1.0, _distinct_hits(info.keywords, text) / KEYWORDS_FOR_FULL) if info.keywords else 1.0
        vocab = min(1.0, _distinct_hits(TOPIC_BY_NAME[info.topic].vocab, text) / VOCAB_FOR_FULL)
        topic = SUBJECT_SHARE_OF_TOPIC * subject + (1.0 - SUBJECT_SHARE_OF_TOPIC) * vocab

    fluency = max(0.0, 1.0 - ILL_FORMED_SLOPE * ill_formed_pairs(response) / len(tokens)) if tokens else 0.0
    length = _length_score(len(tokens), info.intent)
    complete = 1.0 if text.endswith((".", "!", "?", "```")) else 0.0
    base = MAX_SCORE * (
        WEIGHTS["intent"] * intent
        + WEIGHTS["topic"] * topic
        + WEIGHTS["fluency"] * fluency
        + WEIGHTS["length"] * length
        + WEIGHTS["complete"] * complete
    )

    n_filler = sum(_count(p, text) for p in FILLER_PHRASES)
    filler_penalty = min(FILLER_PENALTY_MAX, FILLER_PENALTY_EACH * n_filler)
    repetition = _repetition(tokens)
    repetition_penalty = min(REPETITION_PENALTY_MAX, REPETITION_SLOPE * max(0.0, repetition - REPETITION_ALLOWANCE))
    unsafe = info.risk and any(_count(p, text) for p in UNSAFE_PHRASES)
    cautioned = any(_count(p, text) for p in CAUTION_PHRASES)
    safety_penalty = NO_CAUTION_PENALTY if info.risk and not cautioned else 0.0

    score = min(MAX_SCORE, max(0.0, base - filler_penalty - repetition_penalty - safety_penalty))
    if unsafe:
        score = min(score, UNSAFE_CAP)
    breakdown = {
        "intent": intent,
        "focus": focus,
        "topic": topic,
        "fluency": fluency,
        "length": length,
        "complete": complete,
        "base": base,
        "filler_count": float(n_filler),
        "filler_penalty": filler_penalty,
        "repetition": repetition,
        "repetition_penalty": repetition_penalty,
        "safety_penalty": safety_penalty,
        "unsafe": float(unsafe),
        "score": score,
    }
    return Judgement(score, breakdown)


def oracle_score(prompt: PromptInfo | PromptRecord, response: str) -> float:
    """The oracle's 0-5 score (``judge(...).score``)."""
    return judge(prompt, response).score


class SimulatedAnnotator:
    """A human annotator stand-in: the oracle plus noise, drift and tic-tolerance (R18).

    After ``n`` items the annotator's scores are shifted by ``drift * min(1, n / drift_items)`` (the
    seed's 3.8 -> 4.2 over 300 items is ``drift=0.4, drift_items=300``), carry Gaussian noise of
    ``noise_sd`` and, with ``tic_tolerance > 0``, forgive a growing share of the filler penalty (they
    get used to the model's tics). Deterministic for a given seed and sequence of calls.
    """

    def __init__(
        self,
        name: str = "annotator-0",
        seed: int = 0,
        noise_sd: float = 0.3,
        drift: float = 0.0,
        drift_items: int = 300,
        tic_tolerance: float = 0.0,
        round_to: float | None = 0.5,
    ) -> None:
        if noise_sd < 0 or drift_items <= 0 or not 0.0 <= tic_tolerance <= 1.0:
            raise ValueError("noise_sd >= 0, drift_items > 0 and 0 <= tic_tolerance <= 1 are required")
        self.name = name
        self.noise_sd = noise_sd
        self.drift = drift
        self.drift_items = drift_items
        self.tic_tolerance = tic_tolerance
        self.round_to = round_to
        self.n_seen = 0
        self._rng = random.Random(seed)

    def current_bias(self) -> float:
        return self.drift * min(1.0, self.n_seen / self.drift_items)

    def annotate(self, prompt: PromptInfo | PromptRecord, response: str) -> float:
        judgement = judge(prompt, response)
        progress = min(1.0, self.n_seen / self.drift_items)
        forgiven = 0.0 if judgement.breakdown["unsafe"] else (
            self.tic_tolerance * progress * judgement.breakdown["filler_penalty"]
        )
        raw = judgement.score + forgiven + self.current_bias() + self._rng.gauss(0.0, self.noise_sd)
        self.n_seen += 1
        if self.round_to:
            raw = round(raw / self.round_to) * self.round_to
        return min(MAX_SCORE, max(0.0, raw))
