"""The RM's training rows built from the task (``strata_tools.task``), shared by the zoo's RM stages
(``strata_tools.zoo.build``) and ``strata rm``: oracle-labelled pair rows and their near misses, the pairs
the strong RM labels for the light RM's distillation, and the strong RM's feature labels and match-step
pools."""

from __future__ import annotations

import random
from typing import Any

from strata.contract.directions import DIRECTION_NAMES
from strata.contract.template import format_rm_input
from strata_tools.rm.augment import perturb_each
from strata_tools.rm.train import FeatureLabels, MatchPool
from strata_tools.task import corpus
from strata_tools.task.lexicon import TOPICS
from strata_tools.task.oracle import SUBJECT_NAMES, answer_features, oracle_score
from strata_tools.task.suite import PromptRecord, load_suite


def distill_pairs(rows: list[dict[str, Any]], train_records: list[PromptRecord], n_pairs: int, n_swaps: int,
                  seed: int) -> tuple[list[str], list[str], dict[str, int]]:
    """(prompt, response) pairs for the strong RM to label: ``n_pairs`` RM data rows (seeded sample; 0:
    all) and ``n_swaps`` prompt swaps (a train prompt's reference answer under it and under another),
    with how many of each."""
    rng = random.Random(seed + 7)
    sample = rows if not n_pairs or n_pairs >= len(rows) else rng.sample(rows, n_pairs)
    prompts = [row["prompt"] for row in sample]
    responses = [row["response"] for row in sample]
    swaps = corpus.prompt_swaps(train_records, seed + 8) if n_swaps else []
    swaps = swaps if n_swaps >= len(swaps) else rng.sample(swaps, n_swaps)
    for swap in swaps:
        prompts += [swap.record.text, swap.other.text]
        responses += [swap.response, swap.response]
    return prompts, responses, {"rm_data": len(sample), "prompt_swaps": len(swaps)}


def rm_features(rows: list[dict[str, Any]]) -> dict[str, FeatureLabels]:
    """The feature heads' labels for RM data rows: the prompt's intent, topic and subject (from the
    suite; -1 for a prompt not in it) and the answer's own (``oracle.answer_features``; -1 when
    unclear). Topics (8) are learned long before subjects (80) and already tell an off-topic answer."""
    records = {record.id: record for record in load_suite()}
    intents = {name: i for i, name in enumerate(DIRECTION_NAMES)}
    subjects = {name: i for i, name in enumerate(SUBJECT_NAMES)}
    topics = {topic.name: i for i, topic in enumerate(TOPICS)}
    topic_of = {subject.name: topic.name for topic in TOPICS for subject in topic.subjects}
    labels: dict[str, list[int]] = {f"{side}_{what}": [] for side in ("prompt", "answer")
                                    for what in ("intent", "topic", "subject")}
    for row in rows:
        record = records.get(row.get("prompt_id", ""))
        answer_intent, answer_subject = answer_features(row["response"])
        labels["prompt_intent"].append(intents[record.intent] if record else -1)
        labels["prompt_topic"].append(topics[record.topic] if record else -1)
        labels["prompt_subject"].append(subjects[record.subject] if record else -1)
        labels["answer_intent"].append(intents[answer_intent] if answer_intent else -1)
        labels["answer_topic"].append(topics[topic_of[answer_subject]] if answer_subject else -1)
        labels["answer_subject"].append(subjects[answer_subject] if answer_subject else -1)
    n_classes = {"intent": len(intents), "topic": len(topics), "subject": len(subjects)}
    return {name: FeatureLabels(values, n_classes[name.split("_")[1]]) for name, values in labels.items()}


def match_training(rows: list[dict[str, Any]], train_records: list[PromptRecord], match_pairs: int,
                   feature_weight: float, seed: int) -> dict[str, Any]:
    """``train_reward_model``'s keyword arguments for the feature heads (labels of ``rows``) and the
    match steps (pool ``k`` drawn from ``train_records`` with seed ``seed + 100 + k``); empty when
    both are off. The build and ``strata rm train-strong`` share it, so the CLI trains the zoo's RM."""
    aids: dict[str, Any] = {}
    if feature_weight > 0:
        aids |= {"features": rm_features(rows), "feature_weight": feature_weight}
    if match_pairs:
        aids |= {"match_pools": lambda k: match_pool(train_records, seed + 100 + k), "match_pairs": match_pairs}
    return aids


def match_pool(records: list[PromptRecord], seed: int) -> MatchPool:
    """The match steps' texts: per record a reference answer under its own prompt and under another
    (``corpus.prompt_swaps``: same subject, other intent, or same intent, other subject), in pairs,
    with oracle scores and feature labels."""
    rows = []
    for swap in corpus.prompt_swaps(records, seed):
        rows += [pair_row(swap.record, swap.response, "reference", -1),
                 pair_row(swap.other, swap.response, swap.kind, -1)]
    return MatchPool([format_rm_input(row["prompt"], row["response"]) for row in rows],
                     [row["score"] for row in rows], rm_features(rows))


def near_miss_rows(samples: list[dict[str, Any]], records: dict[str, PromptRecord], seed: int) -> list[dict[str, Any]]:
    """A near miss of each sample row where it has one (``augment.perturb_each``), re-scored by the
    oracle, in the sample's group; its kind ``perturbed:<tier>`` for a ``sample:<tier>`` row."""
    texts = perturb_each([row["response"] for row in samples], seed)
    return [pair_row(records[row["prompt_id"]], text, row["kind"].replace("sample:", "perturbed:", 1), row["group"])
            for row, text in zip(samples, texts, strict=True) if text is not None]


def pair_row(record: PromptRecord, response: str, kind: str, group: int) -> dict[str, Any]:
    return {"prompt_id": record.id, "prompt": record.text, "response": response, "kind": kind, "group": group,
            "score": oracle_score(record, response)}
