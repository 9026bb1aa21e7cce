"""Adversarial augmentation of responses for distillation (the article's cure for RM overfit). Pure.

A light RM trained only on the responses the strong RM was shown learns shortcuts: a marker word,
a sentence position. Two cheap perturbations produce near-misses the strong RM then re-scores
(its pseudo-labels, not the original score, are the targets), so the light RM learns where the
strong RM's judgement does and does not move:

- ``synonym``: replace a share of common words by a synonym from a small table (case kept; code
  blocks untouched);
- ``reorder``: shuffle the sentences of the response (a fenced code block moves as one unit).

Both are seeded: same inputs and seed, same outputs.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

KINDS: tuple[str, ...] = ("synonym", "reorder")

# Common words of answers (English), each with replacements that keep the sentence grammatical.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "simple": ("easy", "plain", "basic"),
    "easy": ("simple", "straightforward"),
    "short": ("brief", "compact"),
    "small": ("little", "tiny", "modest"),
    "big": ("large", "major"),
    "large": ("big", "sizeable"),
    "quick": ("fast", "rapid"),
    "fast": ("quick", "rapid"),
    "slowly": ("gradually", "gently"),
    "careful": ("cautious", "attentive"),
    "main": ("chief", "primary", "central"),
    "key": ("central", "essential", "core"),
    "important": ("essential", "crucial", "significant"),
    "idea": ("notion", "concept", "thought"),
    "principle": ("rule", "basis"),
    "outcome": ("result", "effect"),
    "result": ("outcome", "output"),
    "case": ("situation", "scenario"),
    "example": ("instance", "illustration", "sample"),
    "points": ("items", "aspects"),
    "essentials": ("basics", "fundamentals"),
    "control": ("command", "say"),
    "concern": ("worry", "priority"),
    "better": ("preferable", "superior"),
    "good": ("fine", "solid", "decent"),
    "right": ("correct", "proper"),
    "check": ("verify", "inspect", "examine"),
    "review": ("reexamine", "go over"),
    "measure": ("gauge", "quantify"),
    "prepare": ("get ready", "set up"),
    "adjust": ("tune", "tweak", "change"),
    "compare": ("contrast", "weigh"),
    "choose": ("pick", "select"),
    "pick": ("choose", "select"),
    "shows": ("demonstrates", "illustrates", "reveals"),
    "show": ("demonstrate", "illustrate"),
    "makes": ("renders",),
    "gives": ("provides", "offers"),
    "needs": ("requires", "demands"),
    "matters": ("counts", "is important"),
    "depend": ("rely",),
    "predict": ("forecast", "anticipate"),
    "follows": ("comes next", "falls into place"),
    "finish": ("complete", "wrap up"),
    "start": ("begin", "commence"),
    "write": ("note", "jot"),
    "mind": ("view",),
    "help": ("assist", "aid"),
    "often": ("frequently", "commonly"),
    "usually": ("normally", "typically"),
    "simply": ("just", "merely"),
    "whenever": ("each time",),
    "first": ("initially", "to begin"),
    "finally": ("lastly", "in the end"),
    "then": ("after that", "next"),
}
_WORD = re.compile(r"[A-Za-z]+")
_FENCE = re.compile(r"```.*?```", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])(?<!\d\.)\s+")  # not after "1." of a numbered step


@dataclass(frozen=True)
class Augmented:
    index: int  # which input response this was made from
    response: str
    kind: str  # "synonym" or "reorder"


def _match_case(original: str, replacement: str) -> str:
    if original.isupper() and len(original) > 1:
        return replacement.upper()
    if original[:1].isupper():
        return replacement[:1].upper() + replacement[1:]
    return replacement


def _outside_code(text: str) -> list[tuple[str, bool]]:
    """``text`` cut into (piece, is_code) parts around fenced code blocks."""
    parts: list[tuple[str, bool]] = []
    position = 0
    for fence in _FENCE.finditer(text):
        if fence.start() > position:
            parts.append((text[position : fence.start()], False))
        parts.append((fence.group(0), True))
        position = fence.end()
    if position < len(text):
        parts.append((text[position:], False))
    return parts


def synonym_replace(text: str, rng: random.Random, rate: float = 0.3) -> str:
    """Replace each word that has an entry in ``SYNONYMS`` with probability ``rate``."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError("synonym rate must be in [0, 1]")

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        choices = SYNONYMS.get(word.lower())
        if not choices or rng.random() >= rate:
            return word
        return _match_case(word, rng.choice(choices))

    return "".join(piece if is_code else _WORD.sub(swap, piece) for piece, is_code in _outside_code(text))


def _units(text: str) -> tuple[list[str], str]:
    """Sentences (and whole code blocks) of ``text``, and the separator to join them back."""
    units: list[str] = []
    for piece, is_code in _outside_code(text):
        if is_code:
            units.append(piece.strip())
            continue
        for line in piece.split("\n"):
            units.extend(s.strip() for s in _SENTENCE_END.split(line) if s.strip())
    return units, "\n" if "\n" in text.strip() else " "


def reorder_sentences(text: str, rng: random.Random) -> str:
    """The sentences of ``text`` in a new order (the same text when it has fewer than two)."""
    units, separator = _units(text)
    if len(units) < 2 or len(set(units)) < 2:
        return text
    shuffled = units[:]
    for _ in range(8):  # a random order that differs from the original
        rng.shuffle(shuffled)
        if shuffled != units:
            break
    else:
        shuffled = units[1:] + units[:1]
    return separator.join(shuffled)


def augment_responses(
    responses: Sequence[str],
    kinds: Sequence[str] = KINDS,
    per_response: int = 1,
    seed: int = 0,
    synonym_rate: float = 0.3,
) -> list[Augmented]:
    """Perturbed copies of ``responses``: ``per_response`` of each kind per response, seeded.

    A copy identical to its original (nothing to replace, one sentence) is left out.
    """
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown augmentation(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    out: list[Augmented] = []
    for index, response in enumerate(responses):
        for kind in kinds:
            for _ in range(per_response):
                if kind == "synonym":
                    changed = synonym_replace(response, rng, synonym_rate)
                else:
                    changed = reorder_sentences(response, rng)
                if changed != response:
                    out.append(Augmented(index, changed, kind))
    return out


def pick_perturbation(candidates: Sequence[Sequence[str]], index: int) -> str | None:
    """One perturbed copy per answer, the kinds taken in turn by the answer's index so that both kinds
    are in the data; ``candidates[kind]`` are that kind's copies (empty where it changed nothing)."""
    order = [candidates[(index + k) % len(candidates)] for k in range(len(candidates))]
    return next((copies[0] for copies in order if copies), None)


def perturb_each(responses: Sequence[str], seed: int = 0) -> list[str | None]:
    """One near miss per response (the article's §5.1 augmentation, to be re-scored by a judge): its
    words swapped or its sentences reordered, the kinds in turn; None where neither changes it."""
    copies: dict[str, list[list[str]]] = {kind: [[] for _ in responses] for kind in KINDS}
    for aug in augment_responses(responses, KINDS, seed=seed):
        copies[aug.kind][aug.index].append(aug.response)
    return [pick_perturbation([copies[kind][i] for kind in KINDS], i) for i in range(len(responses))]
