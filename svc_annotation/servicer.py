"""gRPC ``strata.v1.Annotation``: who is calling, then delegate to the store.

The annotator is the caller: with tokens on (``grpc_tokens_file``), the client name of its bearer
token (a request's ``annotator_id`` may be empty or that name; another name is PERMISSION_DENIED);
with tokens off, the request's ``annotator_id`` (trusted as given: turn tokens on wherever the port
is reachable by more than one person). Refusals, each naming what to fix:

- ``INVALID_ARGUMENT "<field>: <problem>"``: a score outside [0, 5] or not a number, a malformed
  item id, a missing or malformed annotator_id;
- ``NOT_FOUND``: no such item; ``ALREADY_EXISTS``: this annotator already scored it (the first
  score stands); ``FAILED_PRECONDITION``: not assigned to this annotator, its stale assignment went to
  someone else, or the item is closed;
- ``UNAUTHENTICATED``: no or an unknown token (the interceptor, before any handler);
- ``UNAVAILABLE``: Redis is down (nothing was recorded; retry).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import redis

from strata.content_store import ContentNotFoundError, StoreUnavailableError
from strata.rpc import abort_invalid, abort_unavailable
from strata.rpc_auth import CallerIdentity
from strata.v1 import annotation_pb2, annotation_pb2_grpc
from svc_annotation.core import (
    AlreadyScoredError,
    InvalidRequestError,
    NotAssignedError,
    UnknownItemError,
    check_annotator,
)
from svc_annotation.drift_book import DriftBook
from svc_annotation.store import AnnotationStore

log = logging.getLogger(__name__)

SERVICE_NAME = annotation_pb2.DESCRIPTOR.services_by_name["Annotation"].full_name
_CLIENT = "client:"  # CallerIdentity's prefix of a token's client name


@contextmanager
def _refusals(context: grpc.ServicerContext) -> Iterator[None]:
    """The desk's errors as gRPC statuses."""
    try:
        yield
    except InvalidRequestError as exc:
        abort_invalid(context, exc.field, exc.problem)
    except UnknownItemError as exc:
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    except AlreadyScoredError as exc:
        context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
    except NotAssignedError as exc:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except ContentNotFoundError as exc:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"the item's texts are gone from the content store: {exc}")
    except (redis.ConnectionError, redis.TimeoutError, StoreUnavailableError) as exc:
        abort_unavailable(context, f"the annotation desk's Redis is unavailable, nothing was recorded: {exc}")


class AnnotationServicer(annotation_pb2_grpc.AnnotationServicer):
    def __init__(self, store: AnnotationStore, identity: CallerIdentity | None = None,
                 drift: DriftBook | None = None) -> None:
        self.store = store
        self.identity = identity or CallerIdentity()
        self.drift = drift

    def annotator(self, claimed: str, context: grpc.ServicerContext) -> str:
        """The calling annotator (see the module's docstring)."""
        if self.identity.tokens is None:
            try:
                return check_annotator(claimed)
            except InvalidRequestError as exc:
                abort_invalid(context, exc.field, exc.problem)
        caller = self.identity.of(context)
        if not caller.startswith(_CLIENT):  # the interceptor lets no such call through; be sure anyway
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "this server needs a bearer token")
        name = caller[len(_CLIENT):]
        if claimed and claimed != name:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"annotator_id: your token is {name}'s; leave annotator_id empty or send {name!r}")
        try:
            return check_annotator(name)
        except InvalidRequestError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"the token's client name cannot name an annotator ({exc.problem})")
        raise AssertionError("unreachable")  # context.abort raises

    def Next(self, request: annotation_pb2.NextRequest, context: grpc.ServicerContext) -> annotation_pb2.NextResponse:
        annotator = self.annotator(request.annotator_id, context)
        with _refusals(context):
            offer = self.store.next_item(annotator)
        if offer is None:
            return annotation_pb2.NextResponse(has_item=False)
        reply = annotation_pb2.NextResponse(has_item=True, item_id=offer.item_id, prompt=offer.prompt,
                                            response=offer.response)
        reply.assigned_until.FromNanoseconds(int(offer.assigned_until * 1e9))
        return reply

    def Score(self, request: annotation_pb2.AnnotationScoreRequest,
              context: grpc.ServicerContext) -> annotation_pb2.AnnotationScoreResponse:
        annotator = self.annotator(request.annotator_id, context)
        with _refusals(context):
            count = self.store.submit_score(annotator, request.item_id, request.score, request.unsafe,
                                            request.off_topic)
        log.info("annotation score item=%s annotator=%s", request.item_id, annotator)
        return annotation_pb2.AnnotationScoreResponse(item_id=request.item_id, scored_by_you=count)

    def Status(self, request: annotation_pb2.StatusRequest,
               context: grpc.ServicerContext) -> annotation_pb2.StatusResponse:
        with _refusals(context):
            status = self.store.status()
            drift = {s.annotator: s for s in self.drift.snapshots()} if self.drift is not None else {}
        response = annotation_pb2.StatusResponse(
            queue_depth=status.queue_depth, assigned=status.assigned, enqueued=status.enqueued,
            completed=status.completed, expired=status.expired, gold_items=status.gold_items,
            annotators={who: annotation_pb2.AnnotatorStatus(
                scored=a.scored, gold_scored=a.gold_scored, assignments=a.assignments, mean_score=a.mean_score,
                has_open_assignment=a.has_open_assignment) for who, a in status.annotators.items()},
        )
        for who, snap in drift.items():
            row = response.annotators[who]
            row.drift_status = snap.status
            row.gold_bias = math.nan if snap.gold.bias is None else snap.gold.bias
            row.gold_window = snap.gold.n
            row.peer_agreement = math.nan if snap.peers.within is None else snap.peers.within
        return response
