import random
import re

import pytest

from strata_tools.rm.augment import (
    KINDS,
    SYNONYMS,
    augment_responses,
    perturb_each,
    pick_perturbation,
    reorder_sentences,
    synonym_replace,
)

PROSE = "The idea is simple. Check the flour first! Then measure the water. Is it right?"
CODE = (
    "Here is a short Python function to sort a list:\n"
    "```python\ndef sort_list(items):\n    return sorted(items)\n```\n"
    "It is simple. Check the result."
)


def test_synonyms_replace_known_words_and_keep_case() -> None:
    out = synonym_replace("Simple and simple. SIMPLE idea.", random.Random(0), rate=1.0)
    words = out.rstrip(".").replace(".", "").split()
    assert words[0] in {"Easy", "Plain", "Basic"}
    assert words[2] in SYNONYMS["simple"]
    assert words[3] in {"EASY", "PLAIN", "BASIC"}
    assert words[4] in SYNONYMS["idea"]
    assert words[1] == "and"  # not in the table


def test_synonym_rate_zero_changes_nothing_and_rate_is_checked() -> None:
    assert synonym_replace(PROSE, random.Random(0), rate=0.0) == PROSE
    with pytest.raises(ValueError):
        synonym_replace(PROSE, random.Random(0), rate=1.5)


def test_code_blocks_are_never_touched() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        for out in (synonym_replace(CODE, rng, rate=1.0), reorder_sentences(CODE, rng)):
            assert "```python\ndef sort_list(items):\n    return sorted(items)\n```" in out


def test_reorder_keeps_the_sentences_and_changes_their_order() -> None:
    out = reorder_sentences(PROSE, random.Random(3))
    assert out != PROSE
    sentences = ["The idea is simple.", "Check the flour first!", "Then measure the water.", "Is it right?"]
    assert sorted(re.split(r"(?<=[.!?]) ", out)) == sorted(sentences)


def test_reorder_moves_whole_lines_of_numbered_steps() -> None:
    steps = "Here is how:\n1. First, check it.\n2. Next, adjust it.\n3. Finally, review it."
    out = reorder_sentences(steps, random.Random(1))
    assert out != steps
    assert sorted(out.split("\n")) == sorted(steps.split("\n"))


def test_one_sentence_stays_as_it_is() -> None:
    assert reorder_sentences("Only one sentence here.", random.Random(0)) == "Only one sentence here."


def test_augment_is_seeded_and_labels_its_kind() -> None:
    responses = [PROSE, "Nothing to do", CODE]
    first = augment_responses(responses, seed=7)
    assert first == augment_responses(responses, seed=7)
    assert first != augment_responses(responses, seed=8)
    assert {a.kind for a in first} == set(KINDS)
    assert all(a.response != responses[a.index] for a in first)
    assert not [a for a in first if a.index == 1]  # nothing to replace, one sentence: left out
    assert len(augment_responses(responses, kinds=("reorder",), per_response=2, seed=7)) == 4
    with pytest.raises(ValueError, match="unknown augmentation"):
        augment_responses(responses, kinds=("paraphrase",))


def test_perturbations_alternate_kinds_by_answer_and_fall_back_to_the_kind_that_changed_something() -> None:
    synonyms, reorders = ["swapped words"], ["reordered sentences"]
    assert pick_perturbation([synonyms, reorders], 0) == "swapped words"
    assert pick_perturbation([synonyms, reorders], 1) == "reordered sentences"
    assert pick_perturbation([[], reorders], 0) == "reordered sentences"  # one sentence: only synonyms apply...
    assert pick_perturbation([synonyms, []], 1) == "swapped words"
    assert pick_perturbation([[], []], 3) is None  # ...and an answer neither changes adds no label


def test_perturb_each_gives_one_changed_copy_per_answer_in_order_and_none_where_nothing_changes() -> None:
    one_sentence_no_synonym = "Zebra."
    out = perturb_each([PROSE, PROSE, one_sentence_no_synonym], seed=3)
    assert len(out) == 3 and out[2] is None
    assert out[0] != PROSE and out[1] != PROSE
    assert sorted(out[1].split()) == sorted(PROSE.split())  # the second answer's turn: reordered, same words
    assert sorted(out[0].split()) != sorted(PROSE.split())  # the first's: words swapped
    assert perturb_each([PROSE, PROSE, one_sentence_no_synonym], seed=3) == out
