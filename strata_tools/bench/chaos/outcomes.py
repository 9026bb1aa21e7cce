"""What became of the ``strata bench chaos`` stream: the client's accepted requests (``Stream``), the final
rewards and dead letters read back from Kafka (``Outcomes``), each accepted request's fate (``tally``:
served, lost, stuck, doubled), learner batches applied twice, each fault's stall beside the lead-in's
rhythm, and the ``report`` with the run's last line.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from strata.bus import topics
from strata.bus.tail import TailReader
from strata_tools.bench.chaos.faults import FaultRecord


def stalls(final_times: Sequence[float], fault_times: Sequence[float], end_time: float) -> list[float]:
    """Per fault, the longest gap between final rewards from the last one before it until the next
    fault (or ``end_time``); a window with no final reward at all counts to its end."""
    times = sorted(final_times)
    result = []
    for i, start in enumerate(fault_times):
        stop = fault_times[i + 1] if i + 1 < len(fault_times) else end_time
        before = [t for t in times if t < start]
        inside = [t for t in times if start <= t < stop]
        points = ([before[-1]] if before else [start]) + inside
        if not inside:
            points.append(stop)
        result.append(max((b - a for a, b in pairwise(points)), default=0.0))
    return result


def rhythm(final_times: Sequence[float], first_fault: float) -> float:
    """The longest gap between final rewards before the first fault: the stream's own pace."""
    times = sorted(t for t in final_times if t < first_fault)
    return max((b - a for a, b in pairwise(times)), default=0.0)


@dataclass(frozen=True)
class FinalReward:
    sample_index: int
    response_hash: str
    scorer: int


@dataclass
class Tally:
    accepted: int
    served: int                 # accepted requests with exactly one final reward per sample
    lost: list[str]             # accepted, no final reward, dead-lettered or no work queued anywhere
    stuck: list[str]            # accepted, no final reward, some tier still behind
    doubled: list[str]          # accepted requests with two different final rewards for one sample
    redelivered: int            # the same final event seen again (at-least-once; consumers dedupe)
    served_unacknowledged: int  # finals for requests the client never saw accepted (a retry's twin)


def tally(accepted: Sequence[str], finals: dict[str, list[FinalReward]], dead: set[str],
          work_queued: bool, n_samples: int = 1) -> Tally:
    """What became of each accepted request, from the final reward events seen for it."""
    lost, stuck, doubled = [], [], []
    served = redelivered = 0
    for request in accepted:
        events = finals.get(request, [])
        distinct = set(events)
        redelivered += len(events) - len(distinct)
        per_sample = Counter(f.sample_index for f in distinct)
        if not distinct:
            (stuck if work_queued and request not in dead else lost).append(request)
        elif any(count > 1 for count in per_sample.values()) or len(per_sample) > n_samples:
            doubled.append(request)
        else:
            served += 1
    known = set(accepted)
    unacknowledged = sum(1 for request in finals if request not in known and not request.startswith("poison-"))
    return Tally(len(accepted), served, lost, stuck, doubled, redelivered, unacknowledged)


def doubled_batches(batch_ids: Sequence[str]) -> list[str]:
    """Batch ids a checkpoint lists more than once: a batch whose learning was applied twice."""
    return sorted(batch for batch, count in Counter(batch_ids).items() if count > 1)


@dataclass
class Stream:
    accepted: list[str] = field(default_factory=list)
    not_accepted: list[str] = field(default_factory=list)
    retries: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Outcomes:
    """Final rewards per request id and the dead letters, read from Kafka from the run's start.

    Read again from the start at each look rather than tailed: a reader that lived through the
    broker's restart could skip events (its position reset to the end), which would count as lost.
    """

    def __init__(self, settings: Any, since_ms: int) -> None:
        self._settings = settings
        self._since_ms = since_ms
        self.finals: dict[str, list[FinalReward]] = {}
        self.final_times: list[float] = []  # scored_at of each distinct final reward, epoch seconds
        self.dead: set[str] = set()
        self.dead_letters: Counter = Counter()  # DLQ topic -> records

    def read(self) -> None:
        watched = [topics.REWARDS_SCORED, topics.PROMPTS_LEVEL0, topics.PROMPTS_LEVEL1, topics.PROMPTS_LEVEL2,
                   topics.ROLLOUTS_GENERATED, topics.POLICY_UPDATED]
        dlqs = {t.dlq for t in watched}
        dead_letter_topics = [topics.Topic(t.dlq, t.message_type, t.key_field) for t in watched]
        reader = TailReader(self._settings, [*watched, *dead_letter_topics], client_id=f"chaos-{uuid.uuid4().hex[:6]}")
        finals: dict[str, list[FinalReward]] = {}
        times: dict[tuple[str, int], float] = {}
        dead: set[str] = set()
        dead_letters: Counter = Counter()
        try:
            reader.seek_to_time(self._since_ms)
            ends = reader.end_offsets()
            for tp, end in ends.items():  # the bench's own Kafka: a DLQ holds this run's dead letters only
                if tp.topic in dlqs and end:
                    dead_letters[tp.topic] += end
            while not reader.reached(ends):
                for topic, event in reader.poll(1.0):
                    if topic.name in dlqs:
                        dead.add(getattr(event, "request_id", "") or getattr(event, "prompt_hash", ""))
                    elif topic is topics.REWARDS_SCORED and event.final:
                        finals.setdefault(event.request_id, []).append(
                            FinalReward(event.sample_index, event.response_hash, event.scorer))
                        times.setdefault((event.request_id, event.sample_index),
                                         event.scored_at.ToMilliseconds() / 1000.0)
        finally:
            reader.close()
        self.finals, self.dead, self.dead_letters = finals, dead, dead_letters
        self.final_times = list(times.values())

    def settle(self, requests: Sequence[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.read()
            if all(r in self.finals or r in self.dead for r in requests) or time.monotonic() > deadline:
                return
            time.sleep(5.0)


def report(args: argparse.Namespace, fault_log: Sequence[FaultRecord], stream: Stream, result: Tally,
           outcomes: Outcomes, behind: dict[str, int], batch_ids: Sequence[str], twice: Sequence[str],
           learner_version: int, pace_gap: float = 0.0) -> int:
    print()
    print(f"{'at':>6}  {'fault':<14} {'target':<18} {'back in':>8} {'stall':>8}  note")
    for record in fault_log:
        back = "-" if record.recovered_s is None else f"{record.recovered_s:.1f} s"
        stall = "-" if record.stall_s is None else f"{record.stall_s:.1f} s"
        print(f"{record.started_s:>5.0f}s  {record.fault.kind:<14} {record.fault.target:<18} {back:>8} {stall:>8}  "
              f"{record.note}")
    print(f"stall: the longest gap between two final rewards from the fault to the next; before the first "
          f"fault the longest was {pace_gap:.1f} s")
    print()
    print(f"accepted {result.accepted}; served exactly once {result.served}; lost {len(result.lost)}; "
          f"doubled {len(result.doubled)}; stuck {len(result.stuck)}")
    print(f"not accepted (the client gave up): {len(stream.not_accepted)} {stream.not_accepted[:5] or ''}")
    print(f"final events delivered twice (deduped downstream): {result.redelivered}; "
          f"finals of requests never acknowledged to the client: {result.served_unacknowledged}")
    print(f"dead letters: {dict(outcomes.dead_letters) or 'none'}")
    print(f"learner: policy v{learner_version}, {len(batch_ids)} batches in its newest checkpoint, "
          f"{len(twice)} applied twice")
    if behind:
        print(f"consumer groups still behind: {behind}")
    for name, requests in (("lost", result.lost), ("doubled", result.doubled), ("stuck", result.stuck)):
        if requests:
            print(f"{name}: {', '.join(requests[:10])}")
    faults = len([r for r in fault_log if "not running" not in r.note])
    doubled = len(result.doubled) + len(twice)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "seed": args.seed, "zoo": args.zoo, "faults": [
                {"at_s": round(r.started_s, 1), "kind": r.fault.kind, "target": r.fault.target,
                 "recovered_s": None if r.recovered_s is None else round(r.recovered_s, 1),
                 "stall_s": None if r.stall_s is None else round(r.stall_s, 1), "note": r.note}
                for r in fault_log],
            "cluster": args.cluster, "lead_in_longest_gap_s": round(pace_gap, 1),
            "accepted": result.accepted, "served": result.served, "lost": result.lost, "doubled": result.doubled,
            "stuck": result.stuck, "not_accepted": stream.not_accepted, "redelivered": result.redelivered,
            "dead_letters": dict(outcomes.dead_letters), "learner_batches": len(batch_ids),
            "learner_batches_twice": list(twice), "learner_version": learner_version,
        }, indent=2) + "\n")
    print(f"chaos faults={faults} accepted={result.accepted} lost={len(result.lost)} doubled={doubled} "
          f"stuck={len(result.stuck)}")
    return 0 if not (result.lost or doubled or result.stuck) else 1
