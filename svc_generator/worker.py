"""Kafka side of the generator: routed prompts of this tier in, rollout-generated events out.

Exactly-once effect on top of at-least-once delivery: each sample of a routed prompt has a claim key
in Redis. The first attempt that finishes a sample stores the response, then claims the key with the
serialised event (SET NX); a redelivered prompt (worker killed before its commit, or a rebalance)
finds the claim and re-publishes the *same* event instead of generating a new response. Downstream
consumers dedupe by (tier, prompt hash, response hash, request). The cost ledger is written once,
by the winner of the claim.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from prometheus_client import Counter

from strata import ledger
from strata.bus import Delivery, PoisonMessageError, Publisher, topics
from strata.confidence import logprob_summary
from strata.content_store import ContentNotFoundError, ContentStore
from strata.contract.identity import request_identity
from strata.contract.tiers import TIER_ENUM
from strata.debug_store import DebugSample, DebugStore
from strata.models.budget import TokenBudget
from strata.models.prompts import PromptFormat
from strata.v1 import events_pb2
from strata.validation import (
    RequestError,
    check_directions,
    check_n_samples,
    check_rollout_dropout,
    sampling_from_proto,
    sampling_to_proto,
)
from svc_generator.backends.base import GenerationRequest
from svc_generator.batcher import DynamicBatcher
from svc_generator.config import GeneratorSettings

log = logging.getLogger(__name__)

ROLLOUTS = Counter("strata_generator_rollouts_total", "Rollouts generated and claimed (once per sample)", ["tier"])



def request_key(message: events_pb2.PromptRouted) -> str:
    """Identity of one routed request (a resubmitted prompt is a new request)."""
    return request_identity(message.request_id, message.routed_at.seconds, message.routed_at.nanos)


def claim_key(tier: int, message: events_pb2.PromptRouted, sample_index: int) -> str:
    return f"strata:gen:claim:{tier}:{message.prompt_hash}:{request_key(message)}:{sample_index}"


@dataclass
class _Job:
    routed: events_pb2.PromptRouted
    sample_index: int
    key: str
    request: GenerationRequest


def claim(client: redis.Redis, key: str, event: bytes, ttl_s: int, wait_replicas: int = 0,
          wait_timeout_ms: int = 200) -> bool:
    """SET NX the sample's claim; True when this attempt won it. With ``wait_replicas``, WAIT on the same
    connection until that many replicas have it (and, the replication stream being ordered, the
    response text stored before it): a failover right after then cannot lose the claim and let a
    redelivery generate a second response for the sample."""
    if not wait_replicas:
        return bool(client.set(key, event, nx=True, ex=ttl_s))
    with client.pipeline(transaction=False) as pipe:
        pipe.set(key, event, nx=True, ex=ttl_s)
        pipe.execute_command("WAIT", wait_replicas, wait_timeout_ms)
        won, acknowledged = pipe.execute()
    if int(acknowledged) < wait_replicas:
        log.warning("a claim reached %d of %d replicas in %d ms: a failover now could lose it",
                    int(acknowledged), wait_replicas, wait_timeout_ms)
    return bool(won)


def live_request(routed: events_pb2.PromptRouted, prompt: str, settings: GeneratorSettings,
                 prompt_format: PromptFormat | None = None) -> GenerationRequest:
    """The request this tier generates for a prompt event: the event's directions and sampling, the tier's
    defaults for every field it leaves unset (the driver sets none). Pure; RequestError on a bad field.
    ``strata_tools.level1`` builds the same request for the paths that measure a tier's answers."""
    sampling = sampling_from_proto(routed.sampling, settings.sampling_defaults(), settings.sampling_bounds()).sampling
    directions = check_directions([d.name for d in routed.directions], prompt_format=prompt_format)
    return GenerationRequest(prompt, directions, sampling)


class GeneratorWorker:
    """The batch handler of the tier's prompt topic."""

    def __init__(self, settings: GeneratorSettings, batcher: DynamicBatcher, store: ContentStore,
                 client: redis.Redis, publisher: Publisher, tokenizer_id: str,
                 debug_store: DebugStore | None = None, n_params: int = 0, budget: TokenBudget | None = None,
                 rollout_dropout_ok: bool = True,
                 ) -> None:
        self._budget = budget  # the model's positions: a prompt that cannot fit is dead-lettered, not retried
        self._rollout_dropout_ok = rollout_dropout_ok  # False: the backend cannot apply it (R17)
        self._debug_store = debug_store  # --debug-rollout only; never read by training
        self._n_params = n_params  # the ledger's params x tokens
        self._settings = settings
        self._batcher = batcher
        self._store = store
        self._redis = client
        self._publisher = publisher
        self._tokenizer_id = tokenizer_id
        self.topic = topics.prompts_topic(TIER_ENUM[settings.tier])

    def _claims(self, routed: list[events_pb2.PromptRouted]) -> dict[str, bytes]:
        """Samples of the batch generated before (a redelivery), by claim key, in one round trip."""
        limit = self._settings.max_samples_per_request  # n_samples past it is refused below
        keys = [claim_key(self._settings.tier, r, i) for r in routed for i in range(min(r.n_samples or 1, limit))]
        found = self._redis.mget(keys) if keys else []
        return {k: raw for k, raw in zip(keys, found, strict=True) if raw is not None}

    def handle_batch(self, deliveries: list[Delivery[events_pb2.PromptRouted]]) -> None:
        ready: list[events_pb2.RolloutGenerated] = []
        jobs: list[_Job] = []
        prompts = self._store.find_texts([d.message.prompt_hash for d in deliveries])  # one round trip
        claimed_before = self._claims([d.message for d in deliveries])
        for delivery in deliveries:
            routed = delivery.message
            try:
                prompt = prompts.get(routed.prompt_hash)
                if prompt is None:
                    raise ContentNotFoundError(f"no text under hash {routed.prompt_hash} (never stored, or expired)")
                request = live_request(routed, prompt, self._settings,
                                       self._budget.format if self._budget else None)
                check_n_samples(routed.n_samples, self._settings.max_samples_per_request)  # bounded on Kafka too
                check_rollout_dropout(request.sampling.rollout_dropout, self._rollout_dropout_ok)
                if self._budget and (problem := self._budget.problem(prompt, request.sampling.max_new_tokens,
                                                                     request.directions)):
                    raise RequestError("prompt", problem)
            except (ContentNotFoundError, RequestError) as exc:
                raise PoisonMessageError(f"prompt {routed.prompt_hash[:12]}: {exc}") from exc
            for index in range(routed.n_samples or 1):
                key = claim_key(self._settings.tier, routed, index)
                claimed = claimed_before.get(key)
                if claimed is not None:  # redelivery: the sample exists, publish it again
                    ready.append(events_pb2.RolloutGenerated.FromString(claimed))
                    continue
                jobs.append(_Job(routed, index, key, request))
        futures = self._batcher.submit([job.request for job in jobs])
        for job, future in zip(jobs, futures, strict=True):
            result = future.result()
            output = result.output
            response_hash = self._store.put(output.text, output.token_ids, self._tokenizer_id)
            event = events_pb2.RolloutGenerated(
                prompt_hash=job.routed.prompt_hash, response_hash=response_hash, tier=TIER_ENUM[self._settings.tier],
                policy_version=result.policy_version, model_id=result.model_id, sample_index=job.sample_index,
                prompt_tokens=output.prompt_tokens, response_tokens=len(output.token_ids),
                device_seconds=result.device_seconds, sampling=sampling_to_proto(job.request.sampling),
                directions=job.routed.directions, caution=job.routed.caution,
                escalated_from=job.routed.escalated_from, request_id=request_key(job.routed),
            )
            event.routed_at.CopyFrom(job.routed.routed_at)
            event.generated_at.GetCurrentTime()
            if job.routed.HasField("level1_record"):
                event.level1_record.CopyFrom(job.routed.level1_record)
            if (confidence := logprob_summary(output.logprobs)) is not None:
                event.response_logprob_mean, event.response_logprob_min = confidence.mean, confidence.min
            if claim(self._redis, job.key, event.SerializeToString(), self._settings.content_ttl_s,
                     self._settings.redis_wait_replicas, self._settings.redis_wait_timeout_ms):
                charge = ledger.charge_generation(self._settings.tier, self._n_params, output.prompt_tokens,
                                                  len(output.token_ids), result.device_seconds)
                ledger.book(self._redis, job.routed.prompt_hash, event.request_id, [charge],
                            self._settings.content_ttl_s)
                ROLLOUTS.labels(tier=str(self._settings.tier)).inc()
                if self._debug_store is not None:
                    sampling = job.request.sampling
                    self._debug_store.record(DebugSample(
                        job.request.prompt, output.text, self._settings.tier, result.policy_version,
                        result.model_id, {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                          "max_new_tokens": sampling.max_new_tokens, "seed": sampling.seed},
                    ))
            else:  # another attempt won the claim meanwhile: its event is the one
                event = events_pb2.RolloutGenerated.FromString(self._redis.get(job.key))
            ready.append(event)
        self._publisher.wait([self._publisher.publish(topics.ROLLOUTS_GENERATED, event) for event in ready])
        for event in ready:
            log.info("rollout tier=%d prompt=%s response=%s tokens=%d policy=v%d", self._settings.tier,
                     event.prompt_hash[:12], event.response_hash[:12], event.response_tokens, event.policy_version)
