"""The prompt suite: deterministic, shipped as generated, splits disjoint by paraphrase family."""

from __future__ import annotations

from collections import Counter

from strata.contract.directions import DIRECTION_NAMES
from strata.contract.template import format_probe_example, format_prompt, format_rm_input
from strata_tools.task.lexicon import RISK_TOPICS, TOPIC_BY_NAME
from strata_tools.task.suite import PARAPHRASES_PER_FAMILY, SPLITS, generate_suite, load_suite


def test_generation_is_deterministic_and_matches_the_shipped_file() -> None:
    generated = generate_suite()
    assert generated == generate_suite()
    assert generated == load_suite(SPLITS)
    assert generate_suite(seed=1) != generated


def test_size_and_metadata() -> None:
    records = load_suite(SPLITS)
    assert 2000 <= len(records) <= 5000
    assert len({r.id for r in records}) == len(records)
    assert len({r.text for r in records}) > 0.95 * len(records)
    for record in records:
        assert record.intent in DIRECTION_NAMES
        assert record.intent in TOPIC_BY_NAME[record.topic].intents
        assert record.risk == (record.topic in RISK_TOPICS)
        assert record.split in SPLITS
    assert set(RISK_TOPICS) == {"medical", "legal"}
    assert set(Counter(r.family for r in records).values()) == {PARAPHRASES_PER_FAMILY}


def test_splits_are_disjoint_by_prompt_family_and_subject() -> None:
    by_split = {split: load_suite(split) for split in SPLITS}
    ids = [set(r.id for r in records) for records in by_split.values()]
    families = [set(r.family for r in records) for records in by_split.values()]
    for i in range(len(SPLITS)):
        for j in range(i + 1, len(SPLITS)):
            assert not ids[i] & ids[j]
            assert not families[i] & families[j]
    train_subjects = {r.subject for r in by_split["train"]}
    assert not train_subjects & {r.subject for r in by_split["fresh"]}  # fresh: never seen in training
    assert not train_subjects & {r.subject for r in by_split["test"]}   # test: neither
    assert not {r.subject for r in by_split["fresh"]} & {r.subject for r in by_split["test"]}
    assert {r.subject for r in by_split["eval"]} <= train_subjects
    assert sum(len(v) for v in by_split.values()) == len(load_suite(SPLITS))
    for split in ("eval", "fresh", "test"):
        assert {r.topic for r in by_split[split]} == set(TOPIC_BY_NAME)  # every topic represented
        assert any(r.risk for r in by_split[split])


def test_load_suite_rejects_an_unknown_split() -> None:
    try:
        load_suite("holdout")
    except ValueError as exc:
        assert "known: train, eval, fresh, test" in str(exc)
    else:
        raise AssertionError("expected ValueError")


def test_template() -> None:
    assert format_prompt("How do\nI sort?", ["give_code", "give_steps"]) == (
        "Q: How do I sort?\nDirections: give_code, give_steps\nA:"
    )
    assert format_prompt("Hi") == "Q: Hi\nA:"
    assert format_probe_example("Hi", "summarize", True) == "Q: Hi\nDirections: summarize\nRisk: yes"
    assert format_rm_input("Hi", " Hello. ") == "Q: Hi\nA: Hello."
    try:
        format_prompt("Hi", ["dance"])
    except ValueError as exc:
        assert "unknown direction" in str(exc)
    else:
        raise AssertionError("expected ValueError")
