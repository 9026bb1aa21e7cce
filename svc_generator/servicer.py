"""gRPC ``Generator``: translate, validate, delegate to the batcher. No business logic here."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import as_completed

import grpc

from strata.content_store import ContentStore, StoreUnavailableError
from strata.contract.tiers import TIER_ENUM
from strata.hashing import content_hash
from strata.models.budget import TokenBudget
from strata.rpc import abort_invalid, abort_unavailable
from strata.telemetry import Sensitive
from strata.v1 import generator_pb2, generator_pb2_grpc
from strata.validation import (
    RequestError,
    check_directions,
    check_n_samples,
    check_prompt,
    check_rollout_dropout,
    sampling_from_proto,
    sampling_to_proto,
)
from svc_generator.backends.base import GenerationRequest
from svc_generator.batcher import DynamicBatcher, SampleResult
from svc_generator.config import GeneratorSettings

log = logging.getLogger(__name__)


class GeneratorServicer(generator_pb2_grpc.GeneratorServicer):
    """Direct generation for clients and diagnostics. Stores responses; publishes no events (the
    Kafka worker is the rollout path)."""

    def __init__(self, settings: GeneratorSettings, batcher: DynamicBatcher, store: ContentStore | None,
                 tokenizer_id: str, budget: TokenBudget | None = None, rollout_dropout_ok: bool = True) -> None:
        self._budget = budget  # the model's positions (strata.models.budget)
        self._rollout_dropout_ok = rollout_dropout_ok  # False: the backend cannot apply it (R17)
        self._settings = settings
        self._batcher = batcher
        self._store = store
        self._tokenizer_id = tokenizer_id

    def _requests(self, request: generator_pb2.GenerateRequest, context: grpc.ServicerContext
                  ) -> tuple[list[GenerationRequest], generator_pb2.GenerateRequest]:
        s = self._settings
        try:
            prompt = check_prompt(request.prompt, s.max_prompt_chars)
            n = check_n_samples(request.n_samples, s.max_samples_per_request)
            directions = check_directions([d.name for d in request.directions],
                                          prompt_format=self._budget.format if self._budget else None)
            validated = sampling_from_proto(request.sampling, s.sampling_defaults(), s.sampling_bounds())
            max_new = validated.sampling.max_new_tokens
            check_rollout_dropout(validated.sampling.rollout_dropout, self._rollout_dropout_ok)
            if self._budget and (problem := self._budget.problem(prompt, max_new, directions)):
                raise RequestError("prompt", problem)
        except RequestError as exc:
            abort_invalid(context, exc.field, exc.problem)
        for warning in validated.warnings:
            log.warning("accepted out-of-range sampling (allow_out_of_range_sampling): %s", warning)
        log.info("generate prompt=%s n=%d", Sensitive(prompt), n)
        return [GenerationRequest(prompt, directions, validated.sampling)] * n, request

    def _generation(self, index: int, result: SampleResult, context: grpc.ServicerContext) -> generator_pb2.Generation:
        output = result.output
        response_hash = content_hash(output.text)
        if self._store is not None:
            try:
                self._store.put(output.text, output.token_ids, self._tokenizer_id)
            except StoreUnavailableError as exc:
                abort_unavailable(context, str(exc))
        return generator_pb2.Generation(response=output.text, response_hash=response_hash,
                                        response_tokens=len(output.token_ids), sample_index=index)

    def Generate(self, request: generator_pb2.GenerateRequest, context: grpc.ServicerContext
                 ) -> generator_pb2.GenerateResponse:
        requests, _ = self._requests(request, context)
        results = [future.result() for future in self._batcher.submit(requests)]
        return generator_pb2.GenerateResponse(
            prompt_hash=content_hash(request.prompt), tier=TIER_ENUM[self._settings.tier],
            model_id=results[0].model_id, policy_version=results[0].policy_version,
            generations=[self._generation(i, r, context) for i, r in enumerate(results)],
            sampling=sampling_to_proto(requests[0].sampling),
            device_seconds=sum(r.device_seconds for r in results),
        )

    def GenerateStream(self, request: generator_pb2.GenerateRequest, context: grpc.ServicerContext
                       ) -> Iterator[generator_pb2.GenerateChunk]:
        """One chunk per sample as soon as that sample's batch is done (samples finish independently
        when they land in different batches); token-level streaming is not offered by the HF backend."""
        requests, _ = self._requests(request, context)
        futures = self._batcher.submit(requests)
        index_of = {future: i for i, future in enumerate(futures)}
        for future in as_completed(futures):
            result = future.result()
            generation = self._generation(index_of[future], result, context)
            yield generator_pb2.GenerateChunk(sample_index=generation.sample_index, text_delta=generation.response,
                                              finished=True, generation=generation,
                                              policy_version=result.policy_version)
