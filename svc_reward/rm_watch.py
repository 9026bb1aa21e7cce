"""Hot swap, reward side (R7): follow ``strata.rm.updated`` and switch the light RM between batches.

Every replica must see every promotion, so this is not a consumer group: each replica reads the
single partition from the beginning. On start (``catch_up``) it reads up to the end and applies only
the newest event, so the version promoted last wins (a promotion of an older version is a rollback
and wins too). Afterwards each new event is applied as it comes. An event is applied by checking the
weights' checksum and calling ``RewardModels.swap_light``, which loads the new version beside the
old one and switches under the scoring lock: a batch is scored entirely by one version, scoring
never stops, and every reward carries the version that produced it. An event that cannot be applied
(weights missing, checksum mismatch, not loadable) is logged and the current version keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time

from kafka import KafkaConsumer, TopicPartition
from prometheus_client import Counter

from strata.bus import PoisonMessageError, Topic, decode, topics
from strata.contract.checksums import weights_checksum
from strata.models.loading import ModelLoadError
from strata.v1 import events_pb2
from svc_reward.models import RewardModels

log = logging.getLogger(__name__)

SWAPS = Counter("strata_reward_rm_swaps_total", "Light RM versions swapped in", ["outcome"])


class RmWatcher:
    def __init__(self, bootstrap: str, models: RewardModels, verify_checksum: bool = True,
                 topic: Topic[events_pb2.RewardModelUpdated] = topics.RM_UPDATED) -> None:
        self._bootstrap = bootstrap
        self._models = models
        self._verify = verify_checksum
        self._topic = topic
        self._partition = TopicPartition(topic.name, 0)
        self._consumer: KafkaConsumer | None = None
        self.swaps = 0  # versions swapped in by this watcher
        self.rejected = 0  # events that could not be applied

    def connect(self) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False,
                                       auto_offset_reset="earliest", group_id=None)
        self._consumer.assign([self._partition])
        self._consumer.seek_to_beginning(self._partition)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _require(self) -> KafkaConsumer:
        if self._consumer is None:
            raise RuntimeError("watcher is not connected; call connect() or run()")
        return self._consumer

    def catch_up(self, timeout_s: float = 30.0) -> bool:
        """Read every event published so far and apply the newest one. True if one was swapped in."""
        consumer = self._require()
        end = consumer.end_offsets([self._partition])[self._partition]
        newest: events_pb2.RewardModelUpdated | None = None
        deadline = time.monotonic() + timeout_s
        while consumer.position(self._partition) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {self._topic.name} up to offset {end} in {timeout_s:.0f} s")
            newest = self._newest(consumer.poll(timeout_ms=500)) or newest
        return newest is not None and self.apply(newest)

    def poll_once(self, timeout_s: float = 0.5) -> bool:
        """Apply the newest event of one poll, if any. True if a version was swapped in."""
        newest = self._newest(self._require().poll(timeout_ms=int(timeout_s * 1000)))
        return newest is not None and self.apply(newest)

    def run(self, stop: threading.Event) -> None:
        """Catch up, then follow the topic until ``stop`` is set (a ``ServiceParts`` loop)."""
        if self._consumer is None:
            self.connect()
            self.catch_up()
        try:
            while not stop.is_set():
                self.poll_once(0.5)
        finally:
            self.close()

    def _newest(self, batches: dict) -> events_pb2.RewardModelUpdated | None:
        newest = None
        for records in batches.values():
            for record in records:
                try:
                    newest = decode(self._topic, record.value, record.key)
                except PoisonMessageError as exc:
                    log.error("ignoring an undecodable RM update at offset %d: %s", record.offset, exc)
        return newest

    def apply(self, event: events_pb2.RewardModelUpdated) -> bool:
        """Swap in the version ``event`` announces. False when it is already served or unusable."""
        if event.rm_version == self._models.light_version:
            return False
        paths = list(event.ensemble_paths) or [event.path]
        if self._verify and event.checksum:
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
        return True

    def _reject(self, event: events_pb2.RewardModelUpdated, why: str) -> bool:
        self.rejected += 1
        SWAPS.labels(outcome="rejected").inc()
        log.error("RM update %s not applied, still serving %s: %s", event.rm_version, self._models.light_version, why)
        return False
