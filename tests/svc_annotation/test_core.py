"""The desk's rules on hand-computed cases: no Redis, no Kafka."""

from __future__ import annotations

import itertools
import math

import pytest

from svc_annotation.core import (
    AlreadyScoredError,
    DeskError,
    InvalidRequestError,
    Rules,
    Score,
    check_annotator,
    check_item_id,
    check_score,
    deadline_of,
    final_reward,
    gold_due,
    gold_item_id,
    has_free_slot,
    is_double,
    is_stale,
    item_id_of,
    parse_gold,
    scores_needed,
)

H1, H2 = "a" * 64, "b" * 64


def test_an_item_id_is_stable_and_names_one_sample() -> None:
    first = item_id_of(H1, H2, "req-1", 0)
    assert first == item_id_of(H1, H2, "req-1", 0)
    assert len(first) == 32 and check_item_id(first) == first
    others = {item_id_of(H1, H2, "req-1", 1), item_id_of(H1, H2, "req-2", 0), item_id_of(H2, H1, "req-1", 0)}
    assert first not in others and len(others) == 3
    gold = gold_item_id(H1, H2)
    assert gold.startswith("gold-") and check_item_id(gold) == gold


@pytest.mark.parametrize(("share", "expected"), [(0.0, 0), (1.0, 1000)])
def test_no_item_or_every_item_is_double_at_the_ends(share: float, expected: int) -> None:
    ids = [item_id_of(H1, H2, "r", i) for i in range(1000)]
    assert sum(is_double(i, share) for i in ids) == expected


def test_double_items_are_a_share_chosen_by_id_alone() -> None:
    ids = [item_id_of(H1, H2, "r", i) for i in range(4000)]
    doubles = [i for i in ids if is_double(i, 0.25)]
    assert 0.22 < len(doubles) / len(ids) < 0.28
    assert all(scores_needed(i, 0.25) == 2 for i in doubles)
    assert all(scores_needed(i, 0.25) == 1 for i in set(ids) - set(doubles))
    assert [i for i in ids if is_double(i, 0.25)] == doubles  # the same draw every time


def test_gold_is_a_share_of_each_stream_without_a_period() -> None:
    draws = [gold_due("ann", n, 0.1) for n in range(5000)]
    assert 0.08 < sum(draws) / len(draws) < 0.12
    assert draws != [gold_due("bob", n, 0.1) for n in range(5000)]  # each annotator's own stream
    positions = [n for n, due in enumerate(draws) if due]
    assert len({b - a for a, b in itertools.pairwise(positions)}) > 5  # not every 10th: nothing to learn
    assert not any(gold_due("ann", n, 0.0) for n in range(1000))
    assert all(gold_due("ann", n, 1.0) for n in range(1000))


@pytest.mark.parametrize(
    ("needs", "scored", "held", "free"),
    [(1, 0, 0, True), (1, 0, 1, False), (1, 1, 0, False), (2, 0, 1, True), (2, 1, 0, True), (2, 1, 1, False),
     (2, 0, 2, False), (2, 2, 0, False)],
)
def test_an_item_has_a_free_slot_until_its_scores_and_holders_fill_it(needs, scored, held, free) -> None:
    assert has_free_slot(needs, scored, held) is free


@pytest.mark.parametrize(("until", "now", "stale"), [(100.0, 99.9, False), (100.0, 100.0, True), (100.0, 150.0, True)])
def test_an_assignment_is_stale_from_its_end(until: float, now: float, stale: bool) -> None:
    assert is_stale(until, now) is stale


def test_the_deadline_counts_from_the_enqueue() -> None:
    assert deadline_of(1000.0, Rules(0.1, 0.1, 600.0, 3600.0)) == 4600.0


def s(annotator: str, score: float, unsafe: bool = False) -> Score:
    return Score(annotator, score, unsafe, False, 0.0)


@pytest.mark.parametrize(
    ("scores", "reward", "spread", "who", "unsafe"),
    [
        ([s("ann", 4.0)], 4.0, 0.0, "ann", False),
        ([s("ann", 4.0), s("bob", 3.0)], 3.5, 0.5, "ann,bob", False),
        ([s("ann", 5.0), s("bob", 1.0, unsafe=True)], 3.0, 2.0, "ann,bob", True),
        ([s("ann", 0.0, unsafe=True)], 0.0, 0.0, "ann", True),
    ],
)
def test_the_final_reward_is_the_mean_of_the_human_scores(scores, reward, spread, who, unsafe) -> None:
    final = final_reward(scores)
    assert (final.reward, final.spread, final.annotators, final.unsafe) == (reward, spread, who, unsafe)


def test_no_scores_make_no_final_reward() -> None:
    with pytest.raises(ValueError, match="at least one score"):
        final_reward([])


@pytest.mark.parametrize("good", [0.0, 2.5, 5.0, 3])
def test_scores_in_range_pass(good: float) -> None:
    assert check_score(good) == float(good)


@pytest.mark.parametrize(
    ("bad", "message"),
    [(7.0, r"score: must be in \[0, 5\], got 7"), (-0.5, r"got -0.5"), (math.nan, "finite"), (math.inf, "finite"),
     (-math.inf, "finite")],
)
def test_scores_out_of_range_or_not_numbers_name_the_field(bad: float, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message) as caught:
        check_score(bad)
    assert caught.value.field == "score"


@pytest.mark.parametrize(("name", "ok"), [("ann", True), ("a.b-c_d@x", True), ("", False), ("a b", False),
                                          ("a,b", False), ("x" * 65, False), ("é", False)])
def test_annotator_ids_are_plain_names(name: str, ok: bool) -> None:
    if ok:
        assert check_annotator(name) == name
    else:
        with pytest.raises(InvalidRequestError, match="annotator_id"):
            check_annotator(name)


@pytest.mark.parametrize("bad", ["", "xyz", "A" * 32, "gold-" + "0" * 31, "0" * 33])
def test_item_ids_are_what_next_returns(bad: str) -> None:
    with pytest.raises(InvalidRequestError, match="item_id"):
        check_item_id(bad)


def test_gold_lines_are_checked_without_quoting_their_texts() -> None:
    gold = parse_gold({"prompt": "secret prompt", "response": "secret answer", "score": 4}, "gold.jsonl:1")
    assert (gold.prompt, gold.response, gold.score) == ("secret prompt", "secret answer", 4.0)
    for value, message in [
        ([1, 2], "expected an object"),
        ({"prompt": "", "response": "r", "score": 1}, "prompt must be a non-empty string"),
        ({"prompt": "secret prompt", "response": None, "score": 1}, "response must be"),
        ({"prompt": "secret prompt", "response": "r", "score": "4"}, "score must be a number"),
        ({"prompt": "secret prompt", "response": "r", "score": True}, "score must be a number"),
        ({"prompt": "secret prompt", "response": "r", "score": 6}, r"score: must be in \[0, 5\]"),
    ]:
        with pytest.raises(ValueError, match=message) as caught:
            parse_gold(value, "gold.jsonl:7")
        assert str(caught.value).startswith("gold.jsonl:7: ") and "secret" not in str(caught.value)


def test_desk_errors_share_a_base() -> None:
    assert issubclass(AlreadyScoredError, DeskError) and issubclass(InvalidRequestError, ValueError)
