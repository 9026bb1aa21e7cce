"""From a run's events to its answers: per request, the final answers' oracle and RM scores and what each
path cost, and an arm's figures against the all-Level-2 baseline."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from strata import ledger
from strata.v1 import common_pb2
from strata_tools.task.oracle import judge
from strata_tools.tiering import tier_eval
from strata_tools.tiering.tier_eval import Answer, ArmFigures, PromptOutcome
from strata_tools.train import Request


def _path_cost(stages: Sequence[ledger.StageCost], tiers: set[int]) -> tuple[float, float, float]:
    chosen = [s for s in stages if s.tier in tiers]
    return (sum(s.device_seconds for s in chosen), sum(s.param_tokens for s in chosen),
            sum(s.human_seconds for s in chosen))


@dataclass(frozen=True)
class Answers:
    """One request's answers, oracle-scored, with what each path cost."""

    level1: Answer | None
    level2: Answer | None
    escalated: bool
    human_seconds: float
    encoder: tuple[float, float]      # device-seconds, params x tokens of the scheduler's encoding
    skipped: bool = False


def answers_of(request: Request, client: Any, store: Any) -> Answers:
    stages = ledger.read_request(client, request.prompt_hash, request.request_id)
    encoder = _path_cost([s for s in stages if s.stage == "encoder"], {0})
    if any(e.scorer == common_pb2.SCORER_REUSED for e in request.events):
        return Answers(None, None, False, 0.0, encoder[:2], skipped=True)
    level1_events = _per_sample(e for e in request.events if e.tier == common_pb2.TIER_LEVEL_1)
    level2_events = _per_sample(e for e in request.events if e.tier == common_pb2.TIER_LEVEL_2 and e.final)
    level1_cost = _path_cost([s for s in stages if s.stage != "encoder"], {0, 1})
    # A prompt sent straight to Level-2 still paid for its probe (tier 0).
    level2_cost = _path_cost([s for s in stages if s.stage != "encoder"], {2} if level1_events else {0, 2})

    def answer(events: list[Any], reward: float, cost: tuple[float, float, float]) -> Answer:
        oracle = statistics.fmean(judge(request.record, store.get_text(e.response_hash)).score for e in events)
        return Answer(oracle, reward, cost[0], cost[1])

    # Several samples: the Level-1 answer's reward is the lowest (a request escalates when any sample
    # does), its oracle score the samples' mean; a tier's cost is every sample's.
    return Answers(
        answer(level1_events, min(e.reward for e in level1_events), level1_cost) if level1_events else None,
        answer(level2_events, statistics.fmean(e.reward for e in level2_events), level2_cost) if level2_events
        else None,
        escalated=any(e.escalated for e in level1_events),
        human_seconds=level2_cost[2], encoder=encoder[:2],
    )


def _per_sample(events: Iterable[Any]) -> list[Any]:
    """One event per sample (the first seen): a redelivered event does not count twice."""
    seen: dict[int, Any] = {}
    for event in events:
        seen.setdefault(event.sample_index, event)
    return list(seen.values())


def live_figures(name: str, answers: Sequence[Answers], hashes: Sequence[str], baseline_level2: Sequence[Answer],
                 bad_threshold: float, baseline: ArmFigures) -> ArmFigures:
    """A live arm's figures: each prompt's own answers; skipped prompts cost their encoding only and
    are left out of the quality mean (they produce no response)."""
    outcomes, escalated, skipped = [], set(), []
    for digest, a, fallback in zip(hashes, answers, baseline_level2, strict=True):
        if a.skipped:
            skipped.append(a)
            continue
        level1 = None if a.level1 is None else dataclasses.replace(
            a.level1, device_seconds=a.level1.device_seconds + a.encoder[0],
            param_tokens=a.level1.param_tokens + a.encoder[1])
        level2 = a.level2 or fallback  # the fallback is never used: such a prompt stays at Level-1
        if a.level1 is None and a.level2 is not None:
            level2 = dataclasses.replace(a.level2, device_seconds=a.level2.device_seconds + a.encoder[0],
                                         param_tokens=a.level2.param_tokens + a.encoder[1])
        outcomes.append(PromptOutcome(digest, level1, level2, human_seconds=a.human_seconds))
        if a.escalated:
            escalated.add(digest)
    figures = tier_eval.evaluate(name, outcomes, escalated, bad_threshold)
    n = len(answers)
    served = figures.prompts
    figures = dataclasses.replace(
        figures, prompts=n,
        device_seconds=figures.device_seconds + sum(a.encoder[0] for a in skipped),
        param_tokens=figures.param_tokens + sum(a.encoder[1] for a in skipped),
        level2_share=figures.level2_share * served / n,
    )
    compared = tier_eval.compare(figures, baseline)
    if not skipped:
        return compared
    # Quality against the baseline on the prompts that have an answer of their own (cost stays whole).
    served_baseline = statistics.fmean(b.oracle for a, b in zip(answers, baseline_level2, strict=True)
                                       if not a.skipped)
    return dataclasses.replace(compared, quality_ratio=figures.mean_oracle / served_baseline if served_baseline
                               else None)


def baseline_figures(hashes: Sequence[str], answers: Sequence[Answers], risks: Sequence[bool],
                     bad_threshold: float) -> tuple[list[Answer], ArmFigures]:
    """The all-Level-2 arm's Level-2 answers and its figures (compared with itself: saving 0, quality 1)."""
    level2 = [a.level2 for a in answers]
    if any(a is None for a in level2):
        raise ValueError("the all-Level-2 arm left a prompt without a Level-2 answer")
    outcomes = [PromptOutcome(h, None, a, risk, human_seconds=x.human_seconds)
                for h, a, risk, x in zip(hashes, level2, risks, answers, strict=True) if a is not None]
    figures = tier_eval.all_level2(outcomes, bad_threshold)
    return [o.level2 for o in outcomes], tier_eval.compare(figures, figures)

