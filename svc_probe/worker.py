"""Kafka side of the probe: Level-0 prompts in; Level-1 (with directions) or Level-2 (cautious) out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import redis

from strata import ledger
from strata.bus import Delivery, PoisonMessageError, Publisher, topics
from strata.content_store import ContentNotFoundError, ContentStore
from strata.v1 import common_pb2, events_pb2
from svc_probe.core import ProbeResult

log = logging.getLogger(__name__)

ProbeFn = Callable[[Sequence[str]], list[ProbeResult]]


def forward(routed: events_pb2.PromptRouted, result: ProbeResult, n_directions: int) -> events_pb2.PromptRouted:
    """The event the probe sends on: same request, now with its best ``n_directions`` directions (the
    generator's ``Directions:`` line) and the next tier. Pure."""
    out = events_pb2.PromptRouted()
    out.CopyFrom(routed)
    del out.directions[:]
    scores = dict(result.directions)
    out.directions.extend(common_pb2.Direction(name=n, score=scores[n]) for n in result.forwarded(n_directions))
    if result.caution:
        out.caution = True
        out.reason = f"probe caution: {result.caution_reason}"
    if result.caution and not routed.level1_only:
        out.tier = common_pb2.TIER_LEVEL_2
        out.decision = common_pb2.DECISION_LEVEL_2
        out.escalated_from = common_pb2.TIER_LEVEL_0
    else:  # no caution, or the scheduler's tiering is off: a plain rollout keeps every prompt at Level-1
        out.tier = common_pb2.TIER_LEVEL_1
    out.routed_at.GetCurrentTime()
    return out


class ProbeWorker:
    def __init__(self, probe_fn: ProbeFn, store: ContentStore, publisher: Publisher, forward_directions: int,
                 client: redis.Redis | None = None, n_params: int = 0, ledger_ttl_s: int = 7 * 24 * 3600,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock  # device-seconds (strata.devicetime)
        self._forward_directions = forward_directions
        self._probe = probe_fn
        self._store = store
        self._publisher = publisher
        self._redis = client  # the cost ledger's; None books nothing
        self._n_params = n_params
        self._ledger_ttl_s = ledger_ttl_s

    def handle_batch(self, deliveries: list[Delivery[events_pb2.PromptRouted]]) -> None:
        prompts = []
        for delivery in deliveries:
            try:
                prompts.append(self._store.get_text(delivery.message.prompt_hash))
            except ContentNotFoundError as exc:
                raise PoisonMessageError(str(exc)) from exc
        started = self._clock()
        results = self._probe(prompts)
        seconds = ledger.split_by_tokens(self._clock() - started, [r.tokens for r in results])
        futures = []
        for delivery, result in zip(deliveries, results, strict=True):
            out = forward(delivery.message, result, self._forward_directions)
            futures.append(self._publisher.publish(topics.prompts_topic(out.tier), out))
            log.info("probe prompt=%s -> tier=%s directions=%s caution=%s", out.prompt_hash[:12],
                     common_pb2.Tier.Name(out.tier), ",".join(d.name for d in out.directions), result.caution)
        self._publisher.wait(futures)
        if self._redis is not None:
            with self._redis.pipeline(transaction=True) as pipe:
                for delivery, result, share in zip(deliveries, results, seconds, strict=True):
                    charge = ledger.Charge("probe", 0, result.tokens, share, float(self._n_params) * result.tokens,
                                           params=float(self._n_params))
                    ledger.book(self._redis, delivery.message.prompt_hash, delivery.message.request_id, [charge],
                                self._ledger_ttl_s, pipe=pipe)
                pipe.execute()
