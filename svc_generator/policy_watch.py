"""Weight sync, generator side (R13): follow ``strata.policy.updated`` and load new weights.

Every replica must see every update: ``strata.bus.follow.VersionFollower`` reads the single partition
from the beginning without a group (the newest version wins), and this watcher hands verified
checkpoints to the batcher, which swaps them in between batches. The event carries a path and a
checksum, never tensors.
"""

from __future__ import annotations

import logging
from pathlib import Path

from strata.bus import topics
from strata.bus.follow import VersionFollower
from strata.bus.producer import Publisher
from strata.bus.security import KafkaTarget
from strata.contract.checksums import policy_checksum, recorded_policy_version
from strata.contract.control import check_policy_update
from strata.v1 import events_pb2
from svc_generator.batcher import DynamicBatcher

log = logging.getLogger(__name__)


class PolicyWatcher(VersionFollower[events_pb2.PolicyUpdated]):
    def __init__(self, cluster: KafkaTarget, batcher: DynamicBatcher,
                 topic: topics.Topic[events_pb2.PolicyUpdated] = topics.POLICY_UPDATED,
                 checkpoint_root: Path | None = None, dead_letters: Publisher | None = None) -> None:
        super().__init__(cluster, topic, dead_letters, group="svc-generator-policy-watch")
        self._batcher = batcher
        self._root = checkpoint_root
        self.latest_seen = -1
        self.lineage = ""

    def check(self, event: events_pb2.PolicyUpdated) -> None:
        """Refuse for good (strata.contract.control) a path outside the checkpoint root, a missing
        checksum, or a version the checkpoint's own metadata does not record, so a forged version
        (2^63) cannot outrank every later update and freeze this replica."""
        check_policy_update(event.policy_version, event.checkpoint_path, event.checksum, self._root,
                            recorded_policy_version)

    def apply(self, event: events_pb2.PolicyUpdated) -> bool:
        """Hand a checkpoint newer than any seen to the batcher once its checksum matches."""
        if event.lineage != self.lineage:
            # A new training run: its versions start again, so the old high-water mark does not apply.
            log.info("policy lineage %s -> %s", self.lineage or "-", event.lineage or "-")
            self.lineage, self.latest_seen = event.lineage, -1
            self._batcher.reset_version_floor()
        if event.policy_version <= self.latest_seen:
            return False
        self.latest_seen = event.policy_version
        try:
            actual = policy_checksum(event.checkpoint_path)
        except OSError as exc:
            self.rejected += 1
            log.error("policy v%d: cannot read %s: %s", event.policy_version, event.checkpoint_path, exc)
            return False
        if actual != event.checksum:
            self.rejected += 1
            log.error("policy v%d: checksum mismatch at %s (event %s, file %s); not loading",
                      event.policy_version, event.checkpoint_path, event.checksum[:12], actual[:12])
            return False
        self._batcher.request_weights(event.checkpoint_path, event.policy_version)
        return True
