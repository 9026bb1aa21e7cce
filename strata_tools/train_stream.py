"""What :func:`strata_tools.train.train` sends, decided without calling a service: its options
(``TrainOptions``), the training prompts in rounds (``prompt_rounds``), the held-out prompts a policy is
judged on, and how many prompts a round sends while the learner fills its batches."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from strata_tools.task.seal import check_sealed
from strata_tools.task.suite import SEALED_SPLIT, PromptRecord, load_suite, stratified_sample


@dataclass(frozen=True)
class TrainOptions:
    updates: int = 5                 # stop after the learner advanced this many versions
    prompts_per_round: int = 16
    n_samples: int = 4               # rollouts per prompt (variance for the scheduler, batch for PPO)
    eval_prompts: int = 32
    round_timeout_s: float = 300.0
    max_rounds: int = 50
    report_dir: Path = Path(".strata/reports")
    seed: int = 0
    # Real traffic repeats itself: a share of each round's prompts are prompts sent before, and a share
    # are paraphrases of them (another member of a family already sent). The rest are new.
    repeat_share: float = 0.0
    paraphrase_share: float = 0.0
    eval_every: int = 0              # held-out evaluations every this many updates between before and after (0: none)
    # The learner's batch (samples a policy update consumes). Set: a round sends no more prompts than it takes to
    # fill the batches still needed, counting the samples the learner holds (generated / used stays near 1); 0:
    # every round is full and rounds go on until the learner reaches its version.
    samples_per_update: int = 0
    # With a batch size set, the samples the learner holds plus those a round sends stay within this many of its
    # batches: more would wait past the learner's staleness bound (max_staleness, 2 by default) and be dropped.
    max_batches_ahead: int = 2


def round_prompts(records: Sequence[PromptRecord], cursor: int, n: int, sent: Sequence[PromptRecord],
                  rng: random.Random, repeat_share: float = 0.0, paraphrase_share: float = 0.0,
                  ) -> tuple[list[PromptRecord], int]:
    """One round's ``n`` prompts and how many new ones it took from ``records`` at ``cursor``.

    ``repeat_share`` of them repeat a prompt of ``sent`` (drawn uniformly), ``paraphrase_share`` are
    another member of the paraphrase family of a sent prompt; the rest, and any share that ``sent``
    cannot supply yet (the first round), are the next new prompts. Pure: the randomness is ``rng``'s.
    """
    if not (repeat_share >= 0.0 and paraphrase_share >= 0.0 and repeat_share + paraphrase_share <= 1.0):
        raise ValueError("repeat_share and paraphrase_share must be >= 0 and sum to at most 1")
    family: dict[str, list[PromptRecord]] = {}
    for record in records:
        family.setdefault(record.family, []).append(record)
    batch: list[PromptRecord] = []
    if sent:
        batch += [rng.choice(sent) for _ in range(round(n * repeat_share))]
        for _ in range(round(n * paraphrase_share)):
            origin = rng.choice(sent)
            others = [r for r in family.get(origin.family, ()) if r.text != origin.text]
            if others:
                batch.append(rng.choice(others))
    fresh = n - len(batch)
    batch += [records[(cursor + i) % len(records)] for i in range(fresh)]
    rng.shuffle(batch)
    return batch, fresh


def held_out_records(n: int, seed: int) -> list[PromptRecord]:
    """The held-out prompts a trained policy is judged on: ``n`` of the sealed test split's prompts without
    risk topics (live Level-1 answers those; the risk ones go to Level-2), spread across topics and
    paraphrase families, drawn by ``seed``."""
    return stratified_sample([r for r in load_suite(SEALED_SPLIT) if not r.risk], n, seed)


def prompt_rounds(options: TrainOptions) -> Iterator[list[PromptRecord]]:
    """The rounds of prompts :func:`train` sends under ``options``, in order (endless): the suite's training
    prompts without risk topics, from a cursor fixed by the seed, mixed by :func:`round_prompts`."""
    records = [r for r in load_suite("train") if not r.risk]
    check_sealed((r.text for r in records), "the PPO prompt stream")
    cursor = (options.seed * 997) % len(records)
    rng = random.Random(options.seed)
    sent: list[PromptRecord] = []
    while True:
        batch, fresh = round_prompts(records, cursor, options.prompts_per_round, sent, rng, options.repeat_share,
                                     options.paraphrase_share)
        cursor += fresh
        sent += batch
        yield batch


def samples_still_needed(options: TrainOptions, advanced: int, pending: int) -> int | None:
    """Samples the learner still needs to reach ``options.updates`` once it has made ``advanced`` of them: the
    batches left, less the ``pending`` samples it holds and has not trained on yet. None when the options set
    no batch size (no bound)."""
    if options.samples_per_update <= 0:
        return None
    return max(0, (options.updates - advanced) * options.samples_per_update - pending)


def samples_to_send(options: TrainOptions, advanced: int, held: int) -> int | None:
    """What the next round may send: what the learner still needs (:func:`samples_still_needed`), within
    ``max_batches_ahead`` batches of what it holds, so that no sample waits past the learner's staleness bound
    and is dropped unused. None when the options set no batch size (no bound)."""
    needed = samples_still_needed(options, advanced, held)
    if needed is None:
        return None
    return max(0, min(needed, options.max_batches_ahead * options.samples_per_update - held))


def round_size(options: TrainOptions, needed: int | None) -> int:
    """Prompts the next round sends: a full round, or when the learner's need is known, just enough prompts
    for it if every one were answered by Level-1 (``n_samples`` each), so generated / used stays near 1."""
    if needed is None:
        return options.prompts_per_round
    return min(options.prompts_per_round, math.ceil(needed / max(1, options.n_samples)))
