"""The sealed test split (R27): whole held-out subjects, left out unless named, refused by every set that
trains, calibrates or chooses, and named by no risk keyword."""

from __future__ import annotations

import argparse
import unicodedata
from collections import Counter

import pytest

from strata.risk import match_keywords
from strata_tools.rm.lifecycle import read_pairs
from strata_tools.task.lexicon import TOPIC_BY_NAME
from strata_tools.task.seal import SealBrokenError, check_sealed
from strata_tools.task.suite import SEALED_SPLIT, load_suite, stratified_sample
from strata_tools.train import TrainOptions
from strata_tools.train_stream import prompt_rounds

TEST = load_suite(SEALED_SPLIT)
TEST_TEXTS = {r.text for r in TEST}


def test_the_test_split_is_one_whole_held_out_subject_per_topic() -> None:
    subjects = Counter((r.topic, r.subject) for r in TEST)
    assert {topic for topic, _ in subjects} == set(TOPIC_BY_NAME)
    assert len(subjects) == len(TOPIC_BY_NAME)  # one subject per topic, all of its prompts
    others = load_suite(("train", "eval", "fresh"))
    assert not {(r.topic, r.subject) for r in others} & set(subjects)
    assert any(r.risk for r in TEST)


def test_the_suite_leaves_the_test_split_out_unless_it_is_named() -> None:
    assert not TEST_TEXTS & {r.text for r in load_suite()}
    assert {r.split for r in load_suite()} == {"train", "eval", "fresh"}


def test_a_set_holding_a_test_prompt_is_refused_with_its_role_and_ids() -> None:
    train = [r.text for r in load_suite("train")[:50]]
    check_sealed(train, "the zoo's training prompts")  # no error
    leaked = TEST[3]
    # The content hash, as the stack keys prompts: a decomposed (NFD) copy of the text is the same prompt.
    with pytest.raises(SealBrokenError, match=rf"PPO prompt stream would use 1 prompt.*{leaked.id}.*train or fresh"):
        check_sealed([*train, unicodedata.normalize("NFD", leaked.text)], "the PPO prompt stream")


def test_the_ppo_stream_never_reaches_the_test_split() -> None:
    rounds = prompt_rounds(TrainOptions(prompts_per_round=64, seed=3, repeat_share=0.2, paraphrase_share=0.3))
    sent = {r.text for _ in range(40) for r in next(rounds)}
    assert len(sent) > 1000 and not sent & TEST_TEXTS


def test_the_zoos_training_and_rm_sets_hold_no_test_prompt(zoo) -> None:
    rows = read_pairs(zoo.rm_data, need_score=False)
    assert rows and not {row["prompt"] for row in rows} & TEST_TEXTS


def test_no_calibration_can_be_chosen_on_the_test_split(zoo) -> None:
    from strata_tools.rm.escalation import add_threshold_arguments, judge_level1
    from svc_reward.config import RewardSettings
    from svc_reward.models import ScoringOptions

    parser = argparse.ArgumentParser()
    add_threshold_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--calibration-split", SEALED_SPLIT])
    # Called directly, the calibration refuses before it loads a model.
    with pytest.raises(SealBrokenError, match="escalation threshold's calibration"):
        judge_level1(zoo, SEALED_SPLIT, 20, 0, [str(zoo.rm_light)], ScoringOptions.of(RewardSettings()))


def test_no_risk_keyword_names_a_validation_or_test_subject() -> None:
    for record in load_suite(("fresh", SEALED_SPLIT)):
        if record.risk:
            assert match_keywords(record.subject) is None, record.subject


def test_a_stratified_sample_spreads_over_topics_and_families_and_follows_its_seed() -> None:
    records = load_suite(SEALED_SPLIT)
    sample = stratified_sample(records, 64, seed=5)
    assert len(sample) == len({r.id for r in sample}) == 64
    topics = Counter(r.topic for r in sample)
    assert set(topics) == set(TOPIC_BY_NAME) and max(topics.values()) - min(topics.values()) <= 1
    families = Counter(r.family for r in sample)
    assert max(families.values()) - min(families.values()) <= 1  # 64 over 40 families: one or two each
    assert stratified_sample(records, 64, seed=5) == sample
    assert stratified_sample(records, 64, seed=6) != sample
    assert stratified_sample(records, 10_000, seed=5) and len(stratified_sample(records, 10_000, 5)) == len(records)
    # A prefix is spread too: the first 8 drawn are one per topic.
    assert len({r.topic for r in sample[:8]}) == 8
