"""`strata bench tiers`' epoch stream: the test prompts again through the scheduler, reshuffled each pass as
PPO revisits its prompt set: what skipping adds to the saving once the prompts have a history of their own,
and the skip audit's reuse error."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from strata import rpc
from strata.v1 import scheduler_pb2, scheduler_pb2_grpc
from strata_tools.tiering.answers import Answers, live_figures
from strata_tools.tiering.arms import ArmRun
from strata_tools.tiering.headline import (
    HEADLINE_ARM,
    num,
    pct,
)
from strata_tools.tiering.tier_eval import Answer, ArmFigures


def epoch_arm(epoch: int) -> str:
    """The arm name of the stream's ``epoch`` (1-based); the first pass is the tiered + skip arm."""
    return HEADLINE_ARM if epoch == 1 else f"{HEADLINE_ARM}, epoch {epoch}"


def epoch_order(records: Sequence[Any], epoch: int, seed: int) -> list[Any]:
    """The order in which ``epoch`` sends ``records``: a seeded shuffle of its own, as a training loop
    reshuffles its prompt set every epoch."""
    order = list(records)
    random.Random(f"{seed}-epoch-{epoch}").shuffle(order)
    return order


def in_order_of(records: Sequence[Any], run: ArmRun) -> ArmRun:
    """``run`` with its requests in ``records``' order (the report reads arms prompt by prompt)."""
    by_record = {id(r.record): r for r in run.requests}
    if set(by_record) != {id(r) for r in records}:
        raise ValueError("the run's requests are not those of the records")
    return dataclasses.replace(run, requests=[by_record[id(r)] for r in records])


@dataclass(frozen=True)
class Audits:
    """The scheduler's skip audit over the whole stream: audited skips rolled out anyway, and how far the
    reward a skip would have reused was from the fresh one (R12)."""

    audits: int
    scored: int
    reuse_mae: float | None
    reuse_mae_ci95: float | None = None  # half-width of the MAE's 95 % interval
    distrusts: int = 0  # audits that erred and took the neighbours they reused out of reuse


def settled_audits(scheduler_address: str, timeout_s: float = 60.0) -> Audits:
    """The scheduler's audit figures once every audit's fresh reward is folded in (or ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    with rpc.channel(scheduler_address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while True:
            stats = stub.Stats(scheduler_pb2.StatsRequest(), timeout=30)
            if stats.audits_scored >= stats.audits or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # the statistics worker folds the stream's last rewards after it ends
    mae = stats.audit_reuse_mae if stats.HasField("audit_reuse_mae") else None
    ci95 = stats.audit_reuse_mae_ci95 if stats.HasField("audit_reuse_mae_ci95") else None
    return Audits(stats.audits, stats.audits_scored, mae, ci95, stats.audit_distrusts)


def epoch_figures(answers: dict[str, list[Answers]], hashes: Sequence[str], level2: Sequence[Answer],
                  bad_threshold: float, baseline: ArmFigures) -> list[tuple[int, int, ArmFigures]]:
    """Each epoch of the stream that ran: its number, prompts skipped, and its figures against all-Level-2."""
    rows = []
    epoch = 1
    while (name := epoch_arm(epoch)) in answers:
        figures = live_figures(name, answers[name], hashes, level2, bad_threshold, baseline)
        rows.append((epoch, sum(a.skipped for a in answers[name]), figures))
        epoch += 1
    return rows


def epoch_lines(rows: Sequence[tuple[int, int, ArmFigures]], tiered: ArmFigures, audits: Audits | None) -> list[str]:
    """The stream's table: per epoch, what skipping removed and what the saving became beside the tiered arm's."""
    if not rows:
        return []
    lines = ["the training-shaped stream: the same test prompts through the scheduler epoch after epoch (fixed "
             "policy; skipped prompts cost their encoding and have no answer of their own)",
             f"  {'epoch':>5} {'skipped':>8} {'PxT sav.':>8} {'vs tiered':>9} {'device sav.':>11} {'quality':>8} "
             f"{'L2 share':>8} {'catch':>6}"]
    for epoch, skipped, a in rows:
        gain = None if a.param_token_saving is None or tiered.param_token_saving is None \
            else a.param_token_saving - tiered.param_token_saving
        lines.append(f"  {epoch:>5} {pct(skipped / a.prompts):>8} {pct(a.param_token_saving):>8} "
                     f"{'-' if gain is None else format(gain * 100, '+.1f') + ' pt':>9} {pct(a.saving):>11} "
                     f"{num(a.quality_ratio):>8} {pct(a.level2_share):>8} {pct(a.bad_case_catch):>6}")
    if audits is not None:
        mae = "-" if audits.reuse_mae is None else f"{audits.reuse_mae:.3f}"
        if audits.reuse_mae_ci95 is not None:
            mae += f" ± {audits.reuse_mae_ci95:.3f} (95 %)"
        lines.append(f"  skip audit, the scheduler's whole run (history, skip arm, later epochs): {audits.scored} of "
                     f"{audits.audits} audited skips scored, {audits.distrusts} erred and distrusted the neighbours "
                     f"they reused, reuse error (MAE) {mae} (what a reused reward costs "
                     "in reward quality)")
    return lines

