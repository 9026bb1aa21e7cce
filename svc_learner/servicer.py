"""gRPC ``Learner``: status and checkpoint-now; translates and delegates, nothing else."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from strata.bus import PublishError
from strata.rpc import abort_unavailable
from strata.v1 import events_pb2, learner_pb2, learner_pb2_grpc
from svc_learner.core import LearnerStatus


def status_to_proto(status: LearnerStatus) -> learner_pb2.LearnerStatus:
    """The engine's status on the wire; sample counts and sync time join the metrics map."""
    metrics = dict(status.metrics)
    metrics.update({f"samples/{outcome}": float(count) for outcome, count in status.counts.items()})
    metrics["samples/pending"] = float(status.pending)
    metrics["samples/unversioned"] = float(status.unversioned)
    return learner_pb2.LearnerStatus(
        policy_version=status.policy_version,
        step=status.step,
        checkpoint_path=status.checkpoint_path,
        metrics=metrics,
        samples_accepted=status.counts.get("accepted", 0),
        samples_dropped_stale=status.counts.get("dropped_stale", 0),
    )


class LearnerServicer(learner_pb2_grpc.LearnerServicer):
    def __init__(self, status: Callable[[], LearnerStatus], checkpoint: Callable[[], events_pb2.PolicyUpdated]) -> None:
        self._status = status
        self._checkpoint = checkpoint

    def Status(
        self, request: learner_pb2.LearnerStatusRequest, context: grpc.ServicerContext
    ) -> learner_pb2.LearnerStatus:
        return status_to_proto(self._status())

    def Checkpoint(
        self, request: learner_pb2.CheckpointRequest, context: grpc.ServicerContext
    ) -> learner_pb2.CheckpointResponse:
        try:
            event = self._checkpoint()
        except PublishError as exc:
            abort_unavailable(context, f"Kafka (the policy update was written but not acknowledged: {exc})")
        return learner_pb2.CheckpointResponse(
            policy_version=event.policy_version, checkpoint_path=event.checkpoint_path, checksum=event.checksum
        )
