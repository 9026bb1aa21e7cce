"""gRPC ``strata.v1.Scheduler``: translate requests and errors, delegate to the engine.

Errors, all naming what to fix:
- ``INVALID_ARGUMENT "<field>: <problem>"``: empty, oversize, binary or non-UTF-8 prompt, sampling
  out of the generator's bounds (R16), n_samples out of range, malformed hash;
- ``UNAVAILABLE``: Redis down (nothing was published; retry when it is back), or Kafka did not
  acknowledge the prompt (it was *not* accepted; retry).
- ``RESOURCE_EXHAUSTED``: the client is over its Submit rate, or the prompt needs a rollout while the
  tiers are too far behind (``svc_scheduler/backlog.py``); nothing was published. Both carry when to
  retry, in the message and as the ``grpc-retry-pushback-ms`` trailer.

A request whose strings are not valid UTF-8 cannot even be parsed by protobuf; the servicer is
therefore registered with a lenient deserializer that finds which field was bad (``add_to_server``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from strata.content_store import StoreUnavailableError
from strata.hashing import is_content_hash
from strata.models.budget import TokenBudget
from strata.ratelimit import RateLimiter, RetryHints, StreamLimiter
from strata.rpc import abort_exhausted, abort_invalid, abort_unavailable, set_retry_pushback
from strata.rpc_auth import CallerIdentity
from strata.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc
from strata.validation import PromptRequest, RequestError, SubmitLimits, requested_sampling, validate_submit
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.engine import Accepted, NotAcceptedError, PromptShedError, RequestGoneError, SchedulerEngine
from svc_scheduler.routing import Route
from svc_scheduler.watch import WatchHub

log = logging.getLogger(__name__)

SERVICE_NAME = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name

_TIER = {Route.SKIP: common_pb2.TIER_UNSPECIFIED, Route.LEVEL_1: common_pb2.TIER_LEVEL_1,
         Route.LEVEL_2: common_pb2.TIER_LEVEL_2}
_DECISION = {Route.SKIP: common_pb2.DECISION_SKIP, Route.LEVEL_1: common_pb2.DECISION_LEVEL_1,
             Route.LEVEL_2: common_pb2.DECISION_LEVEL_2}
_REDIS_DOWN = "the scheduler's Redis is unavailable, so no decision can be made; nothing was published, retry later"


# -- requests that protobuf cannot parse -------------------------------------------------------------

@dataclass(frozen=True)
class Malformed:
    """Stands in for a request that did not parse; the handler answers INVALID_ARGUMENT."""

    field: str
    problem: str


# String fields (and nested messages) of the requests, by field number, to find a bad UTF-8 field.
_SUBMIT_STRINGS: dict[int, Any] = {1: "prompt", 4: "request_id"}
_SCHEMAS: dict[str, dict[int, Any]] = {
    "SubmitRequest": _SUBMIT_STRINGS,
    "SubmitBatchRequest": {1: ("requests", _SUBMIT_STRINGS)},
    "WatchRequest": {1: "prompt_hash"},
}


_MAX_VARINT_BYTES = 10  # a 64-bit varint; a longer run of continuation bytes is not protobuf


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """One varint at ``pos``; IndexError past the end or past 10 bytes (so garbage costs linear time:
    an unbounded run would build an ever larger int, quadratic in its length)."""
    value = shift = 0
    for _ in range(_MAX_VARINT_BYTES):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise IndexError("varint longer than 10 bytes")


def _bad_utf8_field(data: bytes, schema: dict[int, Any], prefix: str = "") -> str | None:
    """The path of the first string field whose bytes are not UTF-8 (wire-format scan)."""
    pos, seen = 0, dict[int, int]()
    try:
        while pos < len(data):
            tag, pos = _varint(data, pos)
            number, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                _, pos = _varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                length, pos = _varint(data, pos)
                chunk, pos = data[pos : pos + length], pos + length
                spec = schema.get(number)
                if isinstance(spec, str):
                    try:
                        chunk.decode("utf-8")
                    except UnicodeDecodeError:
                        return prefix + spec
                elif isinstance(spec, tuple):
                    index = seen[number] = seen.get(number, -1) + 1
                    found = _bad_utf8_field(chunk, spec[1], f"{prefix}{spec[0]}[{index}].")
                    if found:
                        return found
            else:
                return None
    except IndexError:
        return None
    return None


def lenient(message_type: type[Message]) -> Callable[[bytes], Any]:
    schema = _SCHEMAS.get(message_type.__name__, {})

    def deserialize(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except DecodeError:
            field = _bad_utf8_field(data, schema)
            if field is not None:
                return Malformed(field, "is not valid UTF-8 (binary data is not a prompt)")
            return Malformed("request", f"is not a valid {message_type.__name__}")

    return deserialize


def add_to_server(servicer: SchedulerServicer, server: grpc.Server) -> None:
    """Like the generated ``add_SchedulerServicer_to_server``, with lenient request parsing."""
    pb = scheduler_pb2
    handlers = {
        "Submit": grpc.unary_unary_rpc_method_handler(
            servicer.Submit, lenient(pb.SubmitRequest), pb.SubmitResponse.SerializeToString),
        "SubmitBatch": grpc.unary_unary_rpc_method_handler(
            servicer.SubmitBatch, lenient(pb.SubmitBatchRequest), pb.SubmitBatchResponse.SerializeToString),
        "Watch": grpc.unary_stream_rpc_method_handler(
            servicer.Watch, lenient(pb.WatchRequest), pb.WatchEvent.SerializeToString),
        "Stats": grpc.unary_unary_rpc_method_handler(
            servicer.Stats, pb.StatsRequest.FromString, pb.StatsResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))


# -- translation ---------------------------------------------------------------------------------------

def request_of(message: scheduler_pb2.SubmitRequest, limits: SubmitLimits,
               budgets: Sequence[TokenBudget] = ()) -> PromptRequest:
    return validate_submit(message.prompt, requested_sampling(message.sampling), message.n_samples,
                           message.request_id, limits, budgets)


def response_of(accepted: Accepted) -> scheduler_pb2.SubmitResponse:
    d = accepted.decision
    response = scheduler_pb2.SubmitResponse(
        prompt_hash=accepted.prompt_hash, decision=_DECISION[d.route], tier=_TIER[d.route], reason=d.reason,
        neighbours=d.neighbours, low_variance_neighbours=d.low_variance_neighbours, request_id=accepted.request_id,
    )
    if d.reused_reward is not None:
        response.reused_reward = d.reused_reward
    return response


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self, engine: SchedulerEngine, hub: WatchHub, settings: SchedulerSettings, stop: threading.Event | None = None,
        budgets: Sequence[TokenBudget] = (), identity: CallerIdentity | None = None,
    ) -> None:
        self.engine = engine
        self.hub = hub
        self.settings = settings
        self.stop = stop or threading.Event()
        self.limits = settings.submit_limits()  # built once, not per prompt
        self.budgets = tuple(budgets)  # the tiers' models: what a prompt must fit (validate_submit)
        self.identity = identity or CallerIdentity()  # who is calling: the token's client, else the address
        self.watch_streams = StreamLimiter(settings.max_watch_streams, settings.max_watch_streams_per_client,
                                           "Watch streams")
        self.submit_rate = RateLimiter(settings.submit_rate_per_client, settings.submit_burst_per_client)
        self.retry_hints = RetryHints()

    def _charge(self, context: grpc.ServicerContext, prompts: int) -> None:
        """Per-client Submit rate: RESOURCE_EXHAUSTED, with when to retry, past it."""
        wait_s = self.submit_rate.take(self.identity.of(context), max(prompts, 1))
        if wait_s is not None:
            rate, burst = self.settings.submit_rate_per_client, self.settings.submit_burst_per_client
            limits = f"{rate:g} prompts/s, burst {burst}"
            abort_exhausted(context, f"this client is over its Submit rate ({limits}); retry in {wait_s:.2f} s", wait_s)

    def _refund_shed(self, context: grpc.ServicerContext, shed: int, retry_after_s: float) -> None:
        """Shed prompts cost a client that honoured its last retry hint none of its Submit rate (the retry the
        new hint asks for must not be refused for the rate); one that came back early pays for them, so that
        looping through refusals, each an encoder pass, is stopped by the rate."""
        client = self.identity.of(context)
        if self.retry_hints.honoured(client):
            self.submit_rate.refund(client, shed)
        self.retry_hints.told(client, retry_after_s)

    def Submit(self, request: Any, context: grpc.ServicerContext) -> scheduler_pb2.SubmitResponse:
        self._charge(context, 1)
        if isinstance(request, Malformed):
            abort_invalid(context, request.field, request.problem)
        try:
            prompt = request_of(request, self.limits, self.budgets)
        except RequestError as exc:
            abort_invalid(context, exc.field, exc.problem)
        [result] = self._submit(context, [prompt])
        if isinstance(result, PromptShedError):
            self._refund_shed(context, 1, result.shed.retry_after_s)
            abort_exhausted(context, str(result), result.shed.retry_after_s)
        if isinstance(result, NotAcceptedError):
            abort_unavailable(context, str(result))
        return response_of(result)

    def SubmitBatch(self, request: Any, context: grpc.ServicerContext) -> scheduler_pb2.SubmitBatchResponse:
        self._charge(context, 1 if isinstance(request, Malformed) else len(request.requests))
        if isinstance(request, Malformed):
            abort_invalid(context, request.field, request.problem)
        if len(request.requests) > self.settings.max_batch_size:
            abort_invalid(context, "requests", f"{len(request.requests)} prompts, over the limit of "
                          f"{self.settings.max_batch_size} per batch")
        results: list[scheduler_pb2.SubmitBatchResult] = []
        valid: list[tuple[int, PromptRequest]] = []
        for i, item in enumerate(request.requests):
            try:
                valid.append((i, request_of(item, self.limits, self.budgets)))
                results.append(scheduler_pb2.SubmitBatchResult())
            except RequestError as exc:
                results.append(scheduler_pb2.SubmitBatchResult(error=f"requests[{i}].{exc}"))
        outcomes = self._submit(context, [p for _, p in valid]) if valid else []
        retry_after_s = 0.0
        for (i, _), outcome in zip(valid, outcomes, strict=True):
            if isinstance(outcome, PromptShedError):
                results[i].error = f"requests[{i}]: RESOURCE_EXHAUSTED: {outcome}"
                retry_after_s = max(retry_after_s, outcome.shed.retry_after_s)
            elif isinstance(outcome, NotAcceptedError):  # the code a retrying client reads, as a shed item's
                results[i].error = f"requests[{i}]: UNAVAILABLE: {outcome}"
            else:
                results[i].response.CopyFrom(response_of(outcome))
        if retry_after_s:  # the batch is answered; the trailer says when its shed prompts may come again
            self._refund_shed(context, sum(isinstance(o, PromptShedError) for o in outcomes), retry_after_s)
            set_retry_pushback(context, retry_after_s)
        return scheduler_pb2.SubmitBatchResponse(results=results)

    def _submit(self, context: grpc.ServicerContext, prompts: list[PromptRequest]) -> list[Any]:
        try:
            # A caller that went away (cancelled, or past its deadline) before publishing gets nothing
            # published: its work is dropped instead of rolled out for no one.
            return self.engine.submit(prompts, still_wanted=context.is_active)
        except RequestGoneError:
            context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled or its deadline passed; "
                          "nothing was published")
        except StoreUnavailableError as exc:
            log.warning("Submit refused: %s", exc)
            abort_unavailable(context, f"{_REDIS_DOWN} ({exc})")

    def Watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[scheduler_pb2.WatchEvent]:
        if isinstance(request, Malformed):
            abort_invalid(context, request.field, request.problem)
        if not is_content_hash(request.prompt_hash):
            abort_invalid(context, "prompt_hash", "must be 64 lowercase hex digits (the hash Submit returned)")
        client = self.identity.of(context)
        if (full := self.watch_streams.acquire(client)) is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, full)
        once = threading.Lock()

        def release() -> None:  # when the client cancels (at once), or when the loop below ends
            if once.acquire(blocking=False):
                self.watch_streams.release(client)

        context.add_callback(release)
        subscription = self.hub.subscribe(request.prompt_hash)
        deadline = time.monotonic() + self.settings.watch_max_s
        try:
            while context.is_active() and not self.stop.is_set() and time.monotonic() < deadline:
                event = subscription.get(0.25)
                if event is not None:
                    yield event
        finally:
            subscription.close()
            release()

    def Stats(self, request: Any, context: grpc.ServicerContext) -> scheduler_pb2.StatsResponse:
        try:
            stats = self.engine.stats()
        except StoreUnavailableError as exc:
            abort_unavailable(context, f"the scheduler's Redis is unavailable ({exc})")
        return scheduler_pb2.StatsResponse(
            decisions=stats.decisions, skip_rate=stats.skip_rate, index_size=stats.index_size,
            submitted=stats.submitted, high_uncertainty_marks=stats.high_uncertainty_marks,
            audits=stats.audits.audits, audits_scored=stats.audits.scored,
            audit_reuse_mae=stats.audits.reuse_mae, audit_precision=stats.audits.precision,
            audit_tolerance=stats.audits.tolerance, audit_reuse_mae_ci95=stats.audits.reuse_mae_ci95,
            audit_distrusts=stats.audit_distrusts,
            audit_similarity_floors=stats.audit_similarity_floors,
        )
