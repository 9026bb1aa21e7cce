"""gRPC ``Probe``: validate, delegate to the core."""

from __future__ import annotations

import grpc

from strata.hashing import content_hash
from strata.rpc import abort_invalid
from strata.v1 import common_pb2, probe_pb2, probe_pb2_grpc
from strata.validation import RequestError, check_prompt
from svc_probe.worker import ProbeFn


class ProbeServicer(probe_pb2_grpc.ProbeServicer):
    def __init__(self, probe_fn: ProbeFn, max_prompt_chars: int, max_top_k: int) -> None:
        self._probe = probe_fn
        self._max_prompt_chars = max_prompt_chars
        self._max_top_k = max_top_k

    def Directions(self, request: probe_pb2.DirectionsRequest, context: grpc.ServicerContext
                   ) -> probe_pb2.DirectionsResponse:
        try:
            prompt = check_prompt(request.prompt, self._max_prompt_chars)
        except RequestError as exc:
            abort_invalid(context, exc.field, exc.problem)
        top_k = request.top_k or self._max_top_k
        if top_k > self._max_top_k:
            abort_invalid(context, "top_k", f"must be at most {self._max_top_k}, got {top_k}")
        [result] = self._probe([prompt])
        return probe_pb2.DirectionsResponse(
            prompt_hash=content_hash(prompt),
            directions=[common_pb2.Direction(name=n, score=s) for n, s in result.directions[:top_k]],
            caution=result.caution, caution_reason=result.caution_reason, confidence=result.confidence,
        )
