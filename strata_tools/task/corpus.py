"""Reference responses and training corpora generated from the suite (pure, seeded).

``write_response`` composes a decent answer for a (subject, direction) pair from sentence templates:
it follows the direction's form, names the subject's keywords, stays in the oracle's length range
and, on risk topics, points to a professional. ``degrade`` makes it worse in one of the ways the
oracle punishes (filler, repetition, wrong intent, off topic, truncation, unsafe advice...), which
gives the reward models a spread of oracle scores to learn from.

Corpora built here:
- ``lm_texts``: generator pretraining text, ``format_example(prompt, directions, response)``;
- ``probe_texts``: probe pretraining text, ``format_probe_example(prompt, intent, risk)``;
- ``rm_pairs``: (prompt record, response) pairs with mixed quality, labelled later by the oracle;
- ``rm_groups``: per prompt a reference and degradations of that same reference (RM training).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from strata.contract.directions import DIRECTION_NAMES
from strata.contract.template import format_example, format_probe_example
from strata_tools.task.lexicon import FILLER_PHRASES, TOPIC_BY_NAME, TOPICS, UNSAFE_PHRASES, Subject, Topic
from strata_tools.task.suite import PromptRecord, subject_of

# Sentence banks per direction: (openers, body sentences, closers). Fields: {Name} {name} {alt}
# {task} {label} {k0}..{k3} (the subject's keywords, shuffled) {v0} {v1} (field vocabulary).
_BANKS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "explain_principle": (
        (
            "{Name} works because the {k0} and the {k1} depend on each other.",
            "The principle behind {name} is simple: the {k0} controls the {k1}.",
            "The idea is that {name} relies on the {k0} to shape the {k1}.",
        ),
        (
            "This means the {k2} changes whenever the {k0} changes.",
            "The reason it works is that each {k1} adds to the {k3}.",
            "Due to the {k3}, the outcome is easy to predict.",
            "In {label}, it works by linking the {v0} to the {v1}.",
            "That is the reason the {k2} links the {v0} to the {k3}.",
        ),
        (
            "Once you see how the {k2} and the {k3} connect, {name} makes sense.",
            "Keep the {k3} in mind and the rest follows.",
        ),
    ),
    "give_code": (
        ("Here is a short Python function to {task}:", "This Python code shows how to {task}:"),
        (
            "```python\ndef {fn}({a}):\n    return sorted({a})\n```",
            "```python\ndef {fn}({a}, {b}):\n    result = {a} * {b}\n    return result\n```",
            "```python\ndef {fn}({a}):\n    total = 0\n    for item in {a}:\n"
            "        total += item\n    return total\n```",
        ),
        (
            "It takes the {k0} as input and returns the {k1}.",
            "Call it with your own {v0} and print the {k2} it returns.",
            "Test it on a small {v0} first and check the {k1}.",
        ),
    ),
    "compare_options": (
        (
            "{Name} and {alt} differ in how they treat the {k0}.",
            "Both {name} and {alt} have pros and cons.",
        ),
        (
            "The first is better for the {k1}, whereas the second is better for simple cases.",
            "On the other hand, {alt} needs less attention to the {k2}.",
            "In contrast, {name} gives you more control over the {k3}.",
            "The trade-off is the {k2} against the {v0}.",
            "One suits a careful {v1}, whereas the other suits a quick one.",
        ),
        (
            "Pick {name} when the {k3} matters most.",
            "If the {k1} is your main concern, choose {name}.",
        ),
    ),
    "give_steps": (
        ("Here is how to {task}:", "To {task}, follow these steps:"),
        (
            "check the {k0}.",
            "prepare the {k1} and the {v0}.",
            "adjust the {k2} slowly.",
            "measure the {k3} and write it down.",
            "compare the {k1} with the {v1}.",
            "review the {k3} before you finish.",
        ),
        ("Repeat the last step if the {k2} is not right.", "Take your time with each step."),
    ),
    "give_example": (
        (
            "For example, imagine you want to {task}.",
            "Imagine a simple case of {name}.",
        ),
        (
            "Say you start with the {k0} and the {k1}.",
            "For instance, the {k2} shows up as soon as the {k0} changes.",
            "A case such as a small {v1} makes the {k1} easy to see.",
            "For example, the {k3} tells you how the {v0} behaves.",
            "In a case such as this, the {k2} and the {k3} work together.",
        ),
        (
            "That small case shows {name} in practice.",
            "Try the same example with your own {v0}.",
        ),
    ),
    "summarize": (
        (
            "In short, {name} is about the {k0} and the {k1}.",
            "To sum up, {name} comes down to the {k0}.",
        ),
        (
            "The key points are the {k2}, the {k3} and the {v0}.",
            "Overall, the {k1} matters more than the {v1}.",
            "The main idea is to keep the {k0} and the {k2} in balance.",
            "Remember that the {k3} changes slowly.",
        ),
        (
            "That is the bottom line on {name}.",
            "Those points cover the essentials of {name}.",
        ),
    ),
}
_CAUTION: dict[str, tuple[str, ...]] = {
    "medical": (
        "Check with a doctor or pharmacist before you change any treatment.",
        "If symptoms get worse, see a doctor right away.",
        "Ask a doctor about your own case before you act on this.",
    ),
    "legal": (
        "Laws differ by place, so talk to a licensed lawyer about your case.",
        "For advice on your own situation, consult a qualified lawyer.",
        "A lawyer or a legal aid office can check the details for you.",
    ),
}
assert set(_BANKS) == set(DIRECTION_NAMES), "every direction needs a sentence bank"


def _ident(word: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", word.lower()).strip("_") or "value"


def _fields(topic: Topic, subject: Subject, rng: random.Random) -> dict[str, str]:
    keywords = list(subject.keywords)
    rng.shuffle(keywords)
    vocab = rng.sample(topic.vocab, 2)
    fields = {f"k{i}": k for i, k in enumerate(keywords)}
    fields |= {"v0": vocab[0], "v1": vocab[1]}
    fields |= {"name": subject.name, "Name": subject.name[:1].upper() + subject.name[1:]}
    fields |= {"alt": subject.alt, "task": subject.task, "label": topic.label}
    fields |= {"fn": _ident(subject.task)[:32].rstrip("_"), "a": _ident(keywords[0]), "b": _ident(keywords[1])}
    return fields


def write_response(topic: Topic, subject: Subject, direction: str, rng: random.Random) -> str:
    """A decent answer about ``subject`` in the form of ``direction`` (35-70 words)."""
    openers, bodies, closers = _BANKS[direction]
    fields = _fields(topic, subject, rng)
    opener = rng.choice(openers)
    if direction == "give_code":
        body = [rng.choice(bodies)]
        sentences = [opener, *body, *rng.sample(closers, 2)]
        text = "\n".join(s.format(**fields) for s in sentences)
    elif direction == "give_steps":
        steps = rng.sample(bodies, rng.randint(3, 4))
        lead = ["First, ", "Next, ", "Then ", "Finally, "]
        lead = [*lead[: len(steps) - 1], "Finally, "]
        numbered = [f"{i + 1}. {lead[i]}{s}" for i, s in enumerate(steps)]
        lines = [opener, *numbered, rng.choice(closers)]
        text = "\n".join(s.format(**fields) for s in lines)
    else:
        body = rng.sample(bodies, rng.randint(2, 3))
        sentences = [opener, *body, rng.choice(closers)]
        text = " ".join(s.format(**fields) for s in sentences)
    if topic.risk:
        text += ("\n" if direction in ("give_code", "give_steps") else " ") + rng.choice(_CAUTION[topic.name])
    return text


def reference_response(record: PromptRecord, rng: random.Random, direction: str | None = None) -> str:
    """A decent answer to a suite prompt, following ``direction`` (default: the prompt's intent)."""
    return write_response(TOPIC_BY_NAME[record.topic], subject_of(record), direction or record.intent, rng)


# --- degradations -------------------------------------------------------------------------------

DEGRADATIONS: tuple[str, ...] = (
    "filler", "repeat", "wrong_intent", "off_topic", "truncate", "too_long", "too_short", "unsafe",
    "no_caution", "scramble", "generic",
)
RISK_ONLY_DEGRADATIONS = ("unsafe", "no_caution")  # degradations only a risk prompt gets
_GENERIC = (
    "That is a good question. There are many things to think about here, and it depends.",
    "I am not sure. It depends on many things.",
    "Sure. Here is some information that may help you with this.",
)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?:])\s+", text.strip()) if s]


def degrade(record: PromptRecord, response: str, kind: str, rng: random.Random) -> str:
    """``response`` made worse in one way the oracle punishes (see ``DEGRADATIONS``)."""
    sentences = _sentences(response)
    topic = TOPIC_BY_NAME[record.topic]
    if kind == "filler":
        padded = []
        for sentence in sentences:
            if rng.random() < 0.6:
                phrase = rng.choice(FILLER_PHRASES)
                sentence = f"{phrase[:1].upper()}{phrase[1:]}, {sentence[:1].lower()}{sentence[1:]}"
            padded.append(sentence)
        return " ".join(padded)
    if kind == "repeat":
        i = rng.randrange(len(sentences))
        return " ".join(sentences[: i + 1] + [sentences[i]] * rng.randint(2, 4) + sentences[i + 1 :])
    if kind == "wrong_intent":
        others = [d for d in topic.intents if d != record.intent]
        return reference_response(record, rng, rng.choice(others))
    if kind == "off_topic":
        other_topic = rng.choice([t for t in TOPICS if t.name != record.topic])
        subject = rng.choice(other_topic.subjects)
        direction = record.intent if record.intent in other_topic.intents else rng.choice(other_topic.intents)
        return write_response(other_topic, subject, direction, rng)
    if kind == "truncate":
        tokens = response.split()
        return " ".join(tokens[: rng.randint(3, max(4, len(tokens) // 2))]).rstrip(".!?")
    if kind == "too_long":
        extra = [reference_response(record, rng) for _ in range(rng.randint(2, 3))]
        return " ".join([response, *extra])
    if kind == "too_short":
        return sentences[0]
    if kind == "unsafe":
        advice = rng.choice(UNSAFE_PHRASES)
        return f"{response} If it does not help, {advice}."
    if kind == "no_caution":
        return " ".join(s for s in sentences if not any(c in s for c in ("doctor", "lawyer", "legal aid")))
    if kind == "scramble":
        tokens = response.split()
        rng.shuffle(tokens)
        return " ".join(tokens)
    if kind == "generic":
        return rng.choice(_GENERIC)
    raise ValueError(f"unknown degradation {kind!r}; known: {', '.join(DEGRADATIONS)}")


# --- corpora ------------------------------------------------------------------------------------


def sample_directions(record: PromptRecord, rng: random.Random) -> list[str]:
    """The directions line of a generator training example; the response follows the first one.

    Mostly the prompt's intent first with up to two alternatives (what a good probe returns), some
    examples with no directions (a bare prompt), and some led by another direction (so the model
    learns to follow the line, not only the prompt).
    """
    intents = list(TOPIC_BY_NAME[record.topic].intents)
    others = [d for d in intents if d != record.intent]
    roll = rng.random()
    if roll < 0.15:
        return []
    if roll < 0.30:
        first = rng.choice(others)
        return [first, *rng.sample([d for d in intents if d != first], rng.randint(0, 2))]
    return [record.intent, *rng.sample(others, rng.randint(0, 2))]


def lm_texts(records: Sequence[PromptRecord], responses_per_prompt: int, seed: int) -> list[str]:
    """Generator pretraining texts (shuffled)."""
    rng = random.Random(seed)
    texts = []
    for record in records:
        for _ in range(responses_per_prompt):
            directions = sample_directions(record, rng)
            response = reference_response(record, rng, directions[0] if directions else None)
            texts.append(format_example(record.text, directions, response))
    rng.shuffle(texts)
    return texts


def probe_texts(records: Sequence[PromptRecord], seed: int) -> list[str]:
    """Probe pretraining texts (shuffled): prompt -> best direction and risk flag."""
    rng = random.Random(seed)
    texts = [format_probe_example(r.text, r.intent, r.risk) for r in records]
    rng.shuffle(texts)
    return texts


@dataclass(frozen=True)
class RmPair:
    record: PromptRecord
    response: str
    kind: str  # "reference", a degradation name, or "+"-joined names; "sample" for model outputs


def rm_pairs(records: Sequence[PromptRecord], pairs_per_prompt: int, seed: int) -> list[RmPair]:
    """(prompt, response) pairs of mixed quality: a quarter references, the rest degraded 1-2 ways."""
    rng = random.Random(seed)
    pairs = []
    for record in records:
        for _ in range(pairs_per_prompt):
            response = reference_response(record, rng)
            if rng.random() < 0.25:
                pairs.append(RmPair(record, response, "reference"))
                continue
            allowed = DEGRADATIONS if record.risk else tuple(k for k in DEGRADATIONS if k not in RISK_ONLY_DEGRADATIONS)
            kinds = rng.sample(allowed, 1 if rng.random() < 0.7 else 2)
            for kind in kinds:
                response = degrade(record, response, kind, rng)
            pairs.append(RmPair(record, response, "+".join(kinds)))
    return pairs


def rm_groups(records: Sequence[PromptRecord], group_size: int, seed: int) -> list[list[RmPair]]:
    """Per prompt a group of ``group_size`` answers: a reference and degradations of that same
    reference (1-2 ways each), so that the answers differ only in what the oracle scores.

    Reward models learn from the contrast inside a group (a pairwise loss) as well as from the
    scores; the kinds are drawn as in ``rm_pairs``.
    """
    if group_size < 2:
        raise ValueError("an RM group needs at least 2 answers")
    rng = random.Random(seed)
    groups = []
    for record in records:
        reference = reference_response(record, rng)
        allowed = DEGRADATIONS if record.risk else tuple(k for k in DEGRADATIONS if k not in RISK_ONLY_DEGRADATIONS)
        group = [RmPair(record, reference, "reference")]
        for _ in range(group_size - 1):
            response = reference
            kinds = rng.sample(allowed, 1 if rng.random() < 0.7 else 2)
            for kind in kinds:
                response = degrade(record, response, kind, rng)
            group.append(RmPair(record, response, "+".join(kinds)))
        groups.append(group)
    return groups


@dataclass(frozen=True)
class PromptSwap:
    """A reference answer to ``record`` and ``other``, a prompt it does not answer as well."""

    record: PromptRecord
    response: str
    other: PromptRecord
    kind: str  # "swap_intent": same subject, another intent; "swap_subject": same intent, another subject


def prompt_swaps(records: Sequence[PromptRecord], seed: int,
                 others: Sequence[PromptRecord] | None = None) -> list[PromptSwap]:
    """For each record: its reference answer and another prompt from ``others`` (default
    ``records``), alternately on the same subject with another intent and with the same intent on
    another subject (the other kind when a record has no prompt of the first; none: left out).

    Scoring the answer under both prompts tests whether an RM compares the answer with the prompt
    (the oracle's intent and topic terms) rather than judging the answer alone: a good RM scores it
    higher under its own prompt.
    """
    rng = random.Random(seed)
    by_subject: dict[str, list[PromptRecord]] = {}
    by_intent: dict[str, list[PromptRecord]] = {}
    for record in records if others is None else others:
        by_subject.setdefault(record.subject, []).append(record)
        by_intent.setdefault(record.intent, []).append(record)
    swaps = []
    for i, record in enumerate(records):
        candidates = {
            "swap_intent": [r for r in by_subject.get(record.subject, ()) if r.intent != record.intent],
            "swap_subject": [r for r in by_intent.get(record.intent, ()) if r.subject != record.subject],
        }
        order = ("swap_intent", "swap_subject") if i % 2 == 0 else ("swap_subject", "swap_intent")
        kind = next((k for k in order if candidates[k]), None)
        response = reference_response(record, rng)
        if kind is not None:
            swaps.append(PromptSwap(record, response, rng.choice(candidates[kind]), kind))
    return swaps
