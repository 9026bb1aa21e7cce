"""The prompt suite: a few thousand prompts in topic x intent clusters, with paraphrase families.

Every prompt is built from the lexicon (topic, subject) and an intent (a direction of
``strata.contract.directions``). A *family* is one (subject, intent) pair asked several ways, so that
every prompt has close semantic neighbours (R9-R11); prompts of one subject with another intent are
near neighbours that ask for something else.

Splits are by family, so a paraphrase of a training prompt never lands in a held-out split, and each
has one role (R27):
- ``train``: models and RMs learn here (pretraining corpus, RM training, PPO prompts);
- ``fresh``, the **validation** split: every prompt of one held-out subject per topic; recipes, steps,
  thresholds and rules are chosen here (and the RM-overfit check reads it, R16);
- ``test``, **sealed**: every prompt of a second held-out subject per topic, drawn apart from the rest
  (``TEST_SEED``), so that no recipe, threshold, keyword list or training set touches it; headline
  figures are reported here. ``load_suite()`` leaves it out unless asked for by name, and
  ``strata_tools.task.seal`` refuses it in a training, calibration or recipe set;
- ``eval``: held-out families of the train subjects (benchmarks that need no seal: streams, latency).

Held-out samples are drawn with :func:`stratified_sample` (across topics and paraphrase families,
seeded), never the first N in suite order, which are one topic.

The suite is shipped as ``strata_tools/task/data/suite.jsonl`` and regenerated, identically, with
``python -m strata_tools.task.suite``.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from strata.contract.directions import DIRECTION_NAMES
from strata_tools.task.lexicon import TOPIC_BY_NAME, TOPICS, Subject, Topic

SUITE_SEED = 20240501
SUITE_PATH = Path(__file__).parent / "data" / "suite.jsonl"
SPLITS: tuple[str, ...] = ("train", "eval", "fresh", "test")
SEALED_SPLIT = "test"
# The test subjects are drawn with their own generator, so that every other prompt keeps the split,
# text and order it had before the test split existed (its subjects' prompts left train and eval).
TEST_SEED = 20261206
PARAPHRASES_PER_FAMILY = 7
EVAL_FAMILY_FRACTION = 0.15

# Each intent is asked in eight ways; a family uses PARAPHRASES_PER_FAMILY of them. Fields: {name},
# {Name} (capitalised), {task}, {alt}, {label} (the topic as people say it).
PROMPT_TEMPLATES: dict[str, tuple[str, ...]] = {
    "explain_principle": (
        "Explain how {name} works.",
        "What is the principle behind {name}?",
        "Why does {name} work the way it does?",
        "Can you explain the idea behind {name}?",
        "Help me understand how {name} works.",
        "What makes {name} work?",
        "Explain the reasoning behind {name} in simple terms.",
        "How does {name} actually work?",
    ),
    "give_code": (
        "Write code to {task}.",
        "Show me a Python function to {task}.",
        "Give me a code snippet that shows how to {task}.",
        "How would I {task} in Python? Show the code.",
        "Can you write a short program to {task}?",
        "I need code to {task}.",
        "Write a Python example to {task}.",
        "Implement a function to {task}.",
    ),
    "compare_options": (
        "Compare {name} and {alt}.",
        "What are the pros and cons of {name} versus {alt}?",
        "Should I choose {name} or {alt}?",
        "How does {name} differ from {alt}?",
        "{Name} or {alt}: which is better, and when?",
        "What is the difference between {name} and {alt}?",
        "Weigh {name} against {alt} for me.",
        "When is {name} a better choice than {alt}?",
    ),
    "give_steps": (
        "How do I {task}? Give me the steps.",
        "What are the steps to {task}?",
        "Walk me through how to {task}.",
        "Give me a step-by-step guide to {task}.",
        "List the steps I should follow to {task}.",
        "I want to {task}. Where do I start?",
        "Tell me, step by step, how to {task}.",
        "What is the process to {task}?",
    ),
    "give_example": (
        "Give me an example of {name}.",
        "Can you show a concrete example of {name}?",
        "What is a real-world example of {name}?",
        "Show me {name} in action with an example.",
        "I learn best from examples. Show me one for {name}.",
        "Illustrate {name} with an example.",
        "What does {name} look like in practice?",
        "Give a simple example that shows {name}.",
    ),
    "summarize": (
        "Summarize the key points about {name}.",
        "Give me a short summary of {name}.",
        "What are the main things to know about {name}?",
        "In a few sentences, sum up {name}.",
        "Give me the gist of {name}.",
        "What should I remember about {name}? Keep it brief.",
        "Sum up {name} for a beginner.",
        "Recap the essentials of {name}.",
    ),
}
PREFIXES: tuple[str, ...] = ("", "", "", "Quick question: ", "I'm new to {label}. ", "Hi! ", "For a project, ")
SUFFIXES: tuple[str, ...] = ("", "", "", " Thanks!", " Please be clear.", " Keep it simple.")


@dataclass(frozen=True)
class PromptRecord:
    id: str  # "<family>#<k>", stable across regenerations
    text: str
    topic: str  # lexicon topic name
    subject: str  # lexicon subject name
    intent: str  # the direction a good answer follows (what the probe should propose first)
    risk: bool  # medical or legal: Level-2 and human review (R3)
    family: str  # paraphrase family: "<topic>/<subject-slug>/<intent>"
    split: str  # train | eval | fresh


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def _render(template: str, prefix: str, suffix: str, topic: Topic, subject: Subject) -> str:
    body = template.format(
        name=subject.name, Name=_capitalise(subject.name), task=subject.task, alt=subject.alt, label=topic.label
    )
    prefix = prefix.format(label=topic.label)
    if prefix.endswith(", ") and not body.startswith(subject.name[:1].upper()):
        body = body[:1].lower() + body[1:]  # "For a project, explain how ..."
    return prefix + body + suffix


def generate_suite(seed: int = SUITE_SEED) -> list[PromptRecord]:
    """Build the whole suite deterministically from ``seed`` (same seed, same list)."""
    rng = random.Random(seed)
    test_rng = random.Random(TEST_SEED)
    records: list[PromptRecord] = []
    for topic in TOPICS:
        fresh_subject = rng.choice(topic.subjects).name
        test_subject = test_rng.choice([s for s in topic.subjects if s.name != fresh_subject]).name
        families = [(s, intent) for s in topic.subjects for intent in topic.intents]
        seen = [f for f in families if f[0].name != fresh_subject]
        n_eval = math.ceil(EVAL_FAMILY_FRACTION * len(seen))
        eval_families = {(s.name, i) for s, i in rng.sample(seen, n_eval)}
        for subject, intent in families:
            if subject.name == fresh_subject:
                split = "fresh"
            elif subject.name == test_subject:
                split = SEALED_SPLIT
            elif (subject.name, intent) in eval_families:
                split = "eval"
            else:
                split = "train"
            family = f"{topic.name}/{slug(subject.name)}/{intent}"
            templates = rng.sample(PROMPT_TEMPLATES[intent], PARAPHRASES_PER_FAMILY)
            for k, template in enumerate(templates):
                text = _render(template, rng.choice(PREFIXES), rng.choice(SUFFIXES), topic, subject)
                records.append(
                    PromptRecord(f"{family}#{k}", text, topic.name, subject.name, intent, topic.risk, family, split)
                )
    return records


def write_suite(records: Iterable[PromptRecord], path: Path = SUITE_PATH) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(asdict(record), ensure_ascii=False) + "\n")


def load_suite(split: str | Sequence[str] | None = None, path: Path = SUITE_PATH) -> list[PromptRecord]:
    """The shipped suite, optionally only some splits (``"eval"`` or ``("train", "eval")``). Without a
    split, every split but the sealed ``test``: a reader of the test split names it."""
    if not path.is_file():
        raise FileNotFoundError(f"prompt suite not found at {path}; regenerate it with "
                                "`python -m strata_tools.task.suite`")
    wanted = set(SPLITS) - {SEALED_SPLIT} if split is None else ({split} if isinstance(split, str) else set(split))
    if not wanted <= set(SPLITS):
        raise ValueError(f"unknown split(s) {sorted(wanted - set(SPLITS))}; known: {', '.join(SPLITS)}")
    with path.open(encoding="utf-8") as fh:
        records = [PromptRecord(**json.loads(line)) for line in fh if line.strip()]
    return [r for r in records if r.split in wanted]


def stratified_sample(records: Sequence[PromptRecord], n: int, seed: int) -> list[PromptRecord]:
    """``n`` of ``records`` (all when fewer), spread across topics and paraphrase families: topics take turns,
    each giving a prompt of its next family in a seeded order, so that no topic or family is over-drawn
    while another has prompts left. The order returned is the drawing order (a prefix is also spread)."""
    rng = random.Random(seed)
    by_topic: dict[str, dict[str, list[PromptRecord]]] = {}
    for record in records:
        by_topic.setdefault(record.topic, {}).setdefault(record.family, []).append(record)
    queues: list[list[list[PromptRecord]]] = []  # per topic, its families' remaining prompts
    for topic in sorted(by_topic):
        families = [rng.sample(members, len(members)) for _, members in sorted(by_topic[topic].items())]
        rng.shuffle(families)
        queues.append(families)
    rng.shuffle(queues)
    drawn: list[PromptRecord] = []
    while len(drawn) < n and any(queues):
        for families in queues:
            if len(drawn) == n or not families:
                continue
            family = families.pop(0)
            drawn.append(family.pop())
            if family:
                families.append(family)  # the family's next prompt after every other family's
    return drawn


def subject_of(record: PromptRecord) -> Subject:
    """The lexicon entry a suite prompt is about."""
    for subject in TOPIC_BY_NAME[record.topic].subjects:
        if subject.name == record.subject:
            return subject
    raise KeyError(f"subject {record.subject!r} not in topic {record.topic!r}")


assert set(PROMPT_TEMPLATES) == set(DIRECTION_NAMES), "every direction needs prompt templates"


if __name__ == "__main__":
    suite = generate_suite()
    write_suite(suite)
    counts = {s: sum(r.split == s for r in suite) for s in SPLITS}
    print(f"wrote {len(suite)} prompts to {SUITE_PATH}: {counts}")
