"""The neighbourhood's record as the scheduler would route it on, rebuilt offline for ``strata calibrate rule``.

Live, the scheduler keeps per prompt the weights of Level-1 answers people labelled and of those labelled bad
(``svc_scheduler.stats``), sums them over a new prompt's similar neighbours and sends the sums on with the
prompt; the reward service reads their bad share as one of the escalation rule's signals
(``svc_reward.escalation_rule``). Offline there is no stack: earlier rounds of Level-1 answers to the same
prompts stand for the epochs a training run has seen, a simulated annotator (the oracle plus noise, rounded as
people's scores are) labels the share of them svc_reward would send to the desk (drawn by response hash, as
it draws), and each prompt's neighbourhood is its ``k`` nearest prompts by the scheduler's own encoder at cosine
``min_similarity`` or more, the prompt itself included (the index holds every prompt of the sample, cautious
ones too, which have no Level-1 label).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from strata.hashing import content_hash
from strata_tools.level1 import LivePrompting, generate_answers
from strata_tools.rm.escalation import RecordHistory
from strata_tools.rm.models import ZooModels
from strata_tools.task.oracle import SimulatedAnnotator
from strata_tools.task.suite import PromptRecord
from svc_generator.backends.hf import HfBackend
from svc_probe.core import ProbeResult
from svc_reward.config import RewardSettings
from svc_reward.decide import sampled_for_annotation
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.encoder import Encoder


def neighbourhood_records(zoo: ZooModels, records: list[PromptRecord],
                          level1_records: list[tuple[PromptRecord, ProbeResult]], history: RecordHistory, seed: int,
                          progress: Callable[[str], None] = lambda _: None
                          ) -> tuple[dict[str, tuple[float, float]], RecordHistory]:
    """Per prompt text, (labelled, bad): people's labels of earlier Level-1 answers to its neighbours, summed
    as the scheduler's record sums them (no aging: the policy does not move here); and ``history`` with its
    defaults resolved."""
    settings = SchedulerSettings()
    share = RewardSettings().annotate_level1_share if history.label_share is None else history.label_share
    bad_below = settings.record_bad_below if history.bad_below is None else history.bad_below
    prompting = LivePrompting.live(1)
    backend = HfBackend(str(zoo.level1), "cpu")
    annotator = SimulatedAnnotator("record", seed=seed)
    texts = [r.text for r, _ in level1_records]
    directions = [prompting.directions(res) for _, res in level1_records]
    labels: dict[str, list[bool]] = {text: [] for text in texts}
    for round_ in range(history.rounds):
        progress(f"[record] round {round_ + 1}/{history.rounds}: {len(texts)} earlier Level-1 answers, "
                 f"{share:.0%} labelled")
        answers = generate_answers(backend, prompting, texts, directions, seed + 7919 * (round_ + 1))
        for (record, _), answer in zip(level1_records, answers, strict=True):
            if sampled_for_annotation(content_hash(answer.text), share):
                labels[record.text].append(annotator.annotate(record, answer.text) < bad_below)
    vectors = Encoder.from_settings(settings).encode([r.text for r in records])  # every prompt the index holds
    similarity = vectors @ vectors.T
    row_of = {r.text: i for i, r in enumerate(records)}
    found: dict[str, tuple[float, float]] = {}
    for text in texts:
        row = similarity[row_of[text]]
        nearest = [j for j in np.argsort(-row, kind="stable")[: settings.k] if row[j] >= settings.min_similarity]
        said = [label for j in nearest for label in labels.get(records[j].text, [])]
        found[text] = (float(len(said)), float(sum(said)))
    return found, RecordHistory(history.rounds, share, bad_below)
