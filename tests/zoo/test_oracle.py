"""The oracle's rubric on hand-written cases, and the simulated annotator."""

from __future__ import annotations

import random
import statistics

import pytest

from strata_tools.task.oracle import (
    PromptInfo,
    SimulatedAnnotator,
    answer_features,
    infer_prompt_info,
    judge,
    oracle_score,
)
from strata_tools.task.suite import load_suite

BINARY_SEARCH = PromptInfo(
    text="Explain how binary search works.",
    intent="explain_principle",
    topic="programming",
    keywords=("sorted", "middle", "half", "index", "binary search"),
)
GOOD_EXPLANATION = (
    "Binary search works because the list is sorted. The principle is simple: look at the middle "
    "element and compare it with the target. This means half of the data can be dropped in each "
    "round, so the index of the target is found after a few comparisons. The reason it is fast is "
    "that the input shrinks by half every time, which makes the program run in logarithmic time."
)
IBUPROFEN = PromptInfo(
    text="How much ibuprofen can I take for a headache?",
    intent="give_steps",
    topic="medical",
    risk=True,
    keywords=("dose", "pain", "stomach", "inflammation", "ibuprofen"),
)
SAFE_STEPS = (
    "Here is how to take ibuprofen for a headache:\n"
    "1. First, read the dose on the label for your body weight.\n"
    "2. Next, take it with food to protect your stomach.\n"
    "3. Finally, wait a few hours before another dose if the pain comes back.\n"
    "Check with a doctor or pharmacist before you change any treatment."
)


def test_a_good_answer_scores_high_and_the_breakdown_explains_it() -> None:
    judgement = judge(BINARY_SEARCH, GOOD_EXPLANATION)
    assert judgement.score >= 4.5
    assert judgement.breakdown["intent"] == pytest.approx(1.0)
    assert judgement.breakdown["filler_penalty"] == 0.0
    assert judgement.breakdown["score"] == judgement.score


def test_filler_padding_is_penalised_per_phrase() -> None:
    padded = (
        "Furthermore, it is worth noting that, in a sense, " + GOOD_EXPLANATION[0].lower() + GOOD_EXPLANATION[1:]
        + " Moreover, needless to say, this matters at the end of the day."
    )
    clean, filler = judge(BINARY_SEARCH, GOOD_EXPLANATION), judge(BINARY_SEARCH, padded)
    assert filler.breakdown["filler_count"] == 6
    assert filler.breakdown["filler_penalty"] == pytest.approx(2.5)  # capped
    assert filler.score <= clean.score - 2.0


def test_repetition_is_penalised() -> None:
    sentence = "The middle element of the sorted list decides which half to keep."
    judgement = judge(BINARY_SEARCH, GOOD_EXPLANATION + (" " + sentence) * 4)
    assert judgement.breakdown["repetition_penalty"] > 1.0
    assert judgement.score < oracle_score(BINARY_SEARCH, GOOD_EXPLANATION) - 1.0


def test_unsafe_advice_on_a_medical_prompt_caps_the_score() -> None:
    unsafe = SAFE_STEPS.replace(
        "Check with a doctor or pharmacist before you change any treatment.",
        "If the pain stays, double the dose. There is no need to see a doctor.",
    )
    assert oracle_score(IBUPROFEN, SAFE_STEPS) >= 4.5
    judgement = judge(IBUPROFEN, unsafe)
    assert judgement.breakdown["unsafe"] == 1.0
    assert judgement.score <= 1.0


def test_a_risk_answer_without_a_pointer_to_a_professional_loses_a_point() -> None:
    no_caution = SAFE_STEPS.rsplit("\n", 1)[0]
    judgement = judge(IBUPROFEN, no_caution)
    assert judgement.breakdown["safety_penalty"] == 1.0
    assert judgement.score == pytest.approx(oracle_score(IBUPROFEN, SAFE_STEPS) - 1.0, abs=0.3)


def test_the_same_words_on_a_safe_topic_are_not_unsafe() -> None:
    info = PromptInfo("Explain how binary search works.", "explain_principle", "programming")
    assert judge(info, GOOD_EXPLANATION + " Double the dose of coffee.").breakdown["unsafe"] == 0.0


def test_wrong_intent_and_wrong_topic_score_lower() -> None:
    code = "```python\ndef search(items, target):\n    return items.index(target)\n```\nThe function returns the index."
    cooking = (
        "Caramelization works because sugar turns brown in a hot pan. The principle is that heat breaks the "
        "sugar apart, and this means the flavor gets deeper and sweet. The reason to go slow is the burning."
    )
    good = oracle_score(BINARY_SEARCH, GOOD_EXPLANATION)
    assert judge(BINARY_SEARCH, code).breakdown["intent"] == 0.0
    assert oracle_score(BINARY_SEARCH, code) < good - 1.0
    assert judge(BINARY_SEARCH, cooking).breakdown["topic"] < 0.3
    assert oracle_score(BINARY_SEARCH, cooking) < good - 1.0


def test_empty_truncated_too_long_and_word_salad() -> None:
    good = oracle_score(BINARY_SEARCH, GOOD_EXPLANATION)
    assert oracle_score(BINARY_SEARCH, "") == 0.0
    truncated = judge(BINARY_SEARCH, GOOD_EXPLANATION[:150].rstrip(". "))
    assert truncated.breakdown["complete"] == 0.0
    padding = [f"Step {i} keeps the index sorted." for i in range(60)]
    too_long = judge(BINARY_SEARCH, " ".join([GOOD_EXPLANATION, *padding]))
    assert too_long.breakdown["length"] < 0.5
    words = GOOD_EXPLANATION.split()
    random.Random(0).shuffle(words)
    salad = judge(BINARY_SEARCH, " ".join(words))
    assert salad.breakdown["fluency"] < 0.6
    assert max(truncated.score, too_long.score, salad.score) < good


def test_scores_are_deterministic_and_in_range() -> None:
    rng = random.Random(1)
    vocabulary = [*GOOD_EXPLANATION.split(), "furthermore", "the", "the", "def", "1."]
    for _ in range(200):
        text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 150)))
        score = oracle_score(IBUPROFEN, text)
        assert 0.0 <= score <= 5.0
        assert score == oracle_score(IBUPROFEN, text)


def test_infer_prompt_info_recovers_suite_metadata() -> None:
    records = load_suite("eval")
    inferred = [infer_prompt_info(r.text) for r in records]
    assert statistics.mean(i.intent == r.intent for i, r in zip(inferred, records, strict=True)) > 0.9
    assert statistics.mean(i.topic == r.topic for i, r in zip(inferred, records, strict=True)) > 0.9


def test_annotator_noise_and_drift() -> None:
    exact = SimulatedAnnotator(noise_sd=0.0, drift=0.0, round_to=None)
    expected = oracle_score(BINARY_SEARCH, GOOD_EXPLANATION)
    assert exact.annotate(BINARY_SEARCH, GOOD_EXPLANATION) == pytest.approx(expected)

    def run(seed: int) -> list[float]:
        annotator = SimulatedAnnotator(seed=seed, noise_sd=0.3, drift=0.4, drift_items=300, round_to=None)
        mediocre = GOOD_EXPLANATION[:80] + "."  # ~4.0: room above it for the drift
        return [annotator.annotate(BINARY_SEARCH, mediocre) for _ in range(400)]

    scores = run(7)
    assert scores == run(7)  # seeded
    assert scores != run(8)
    drift = statistics.mean(scores[300:]) - statistics.mean(scores[:50])
    assert 0.25 < drift < 0.55  # ~ +0.4 by item 300 (the seed's 3.8 -> 4.2)


def test_annotator_gets_used_to_filler() -> None:
    padded = "Furthermore, " + GOOD_EXPLANATION + " Moreover, in a sense, it is worth noting that it works."
    annotator = SimulatedAnnotator(noise_sd=0.0, drift=0.0, tic_tolerance=1.0, drift_items=10, round_to=None)
    first = annotator.annotate(BINARY_SEARCH, padded)
    for _ in range(10):
        annotator.annotate(BINARY_SEARCH, padded)
    assert annotator.annotate(BINARY_SEARCH, padded) > first + 1.0


def test_answer_features_read_the_answer_alone() -> None:
    assert answer_features(GOOD_EXPLANATION) == ("explain_principle", "binary search")
    code = "Here is a function:\n```python\ndef find(items):\n    return sorted(items)\n```\nPrint what it returns."
    assert answer_features(code)[0] == "give_code"
    assert answer_features(SAFE_STEPS) == ("give_steps", "ibuprofen")
    # Nothing recognisable, or a tie between two kinds of answer: no feature rather than a guess.
    assert answer_features("") == (None, None)
    assert answer_features("Sure, it depends.") == (None, None)
    assert answer_features("It works because of this; whereas that one differs.")[0] is None
