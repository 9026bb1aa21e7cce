"""Hot swap, reward side (R7): follow ``strata.rm.updated`` and switch the light RM between batches.

Every replica must see every promotion: ``strata.bus.follow.VersionFollower`` reads the single
partition from the beginning without a group, applies only the newest event on start (the version
promoted last wins; a promotion of an older version is a rollback and wins too), then each new one
as it comes. An event is applied by checking the
weights' checksum and calling ``RewardModels.swap_light``, which loads the new version beside the
old one and switches under the scoring lock: a batch is scored entirely by one version, scoring
never stops, and every reward carries the version that produced it. An event that cannot be applied
(weights missing, checksum mismatch, not loadable) is logged and the current version keeps serving.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import Counter

from strata.bus import Topic, topics
from strata.bus.follow import VersionFollower
from strata.bus.producer import Publisher
from strata.bus.security import KafkaTarget
from strata.contract.checksums import weights_checksum
from strata.contract.control import check_rm_update
from strata.models.loading import ModelLoadError
from strata.v1 import events_pb2
from svc_reward.calibrate import ScoreCalibration
from svc_reward.models import RewardModels

log = logging.getLogger(__name__)

SWAPS = Counter("strata_reward_rm_swaps_total", "Light RM versions swapped in", ["outcome"])


class RmWatcher(VersionFollower[events_pb2.RewardModelUpdated]):
    def __init__(self, cluster: KafkaTarget, models: RewardModels, verify_checksum: bool = True,
                 topic: Topic[events_pb2.RewardModelUpdated] = topics.RM_UPDATED, model_root: Path | None = None,
                 dead_letters: Publisher | None = None,
                 threshold_served: Callable[[ScoreCalibration | None], str] | None = None) -> None:
        """``threshold_served``: says which escalation threshold a swapped-in version's calibration brings."""
        super().__init__(cluster, topic, dead_letters, group="svc-reward-rm-watch")
        self._models = models
        self._threshold_served = threshold_served
        self._verify = verify_checksum
        self._root = model_root
        self.swaps = 0  # versions swapped in by this watcher

    def check(self, event: events_pb2.RewardModelUpdated) -> None:
        """Refuse for good paths outside the model root, a missing checksum, a malformed version."""
        check_rm_update(event.rm_version, list(event.ensemble_paths) or [event.path], event.checksum, self._root)

    def apply(self, event: events_pb2.RewardModelUpdated) -> bool:
        """Swap in the version ``event`` announces. False when it is already served or unusable."""
        if event.rm_version == self._models.light_version:
            return False
        paths = list(event.ensemble_paths) or [event.path]
        if self._verify:
            try:
                actual = weights_checksum(paths)
            except OSError as exc:
                return self._reject(event, f"cannot read the weights: {exc}")
            if actual != event.checksum:
                return self._reject(event, f"checksum mismatch (event {event.checksum[:12]}, files {actual[:12]})")
        previous = self._models.light_version
        started = time.perf_counter()
        try:
            self._models.swap_light(paths, event.rm_version)
        except (ModelLoadError, OSError, ValueError) as exc:
            return self._reject(event, f"cannot load: {exc}")
        self.swaps += 1
        SWAPS.labels(outcome="swapped").inc()
        log.info("light RM %s -> %s (%d member(s), loaded in %.2f s)", previous, event.rm_version, len(paths),
                 time.perf_counter() - started)
        if self._threshold_served is not None:
            log.info(self._threshold_served(self._models.light_calibration))
        return True

    def _reject(self, event: events_pb2.RewardModelUpdated, why: str) -> bool:
        self.rejected += 1
        SWAPS.labels(outcome="rejected").inc()
        log.error("RM update %s not applied, still serving %s: %s", event.rm_version, self._models.light_version, why)
        return False
