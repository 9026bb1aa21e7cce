"""Weight sync, generator side (R13): follow ``strata.policy.updated`` and load new weights.

Every replica must see every update, so this is not a consumer group: each replica reads the single
partition from the beginning (the newest version wins) and hands verified checkpoints to the batcher,
which swaps them in between batches. The event carries a path and a checksum, never tensors.
"""

from __future__ import annotations

import logging
import threading

from kafka import KafkaConsumer, TopicPartition

from strata.bus import PoisonMessageError, decode, topics
from strata.contract.checksums import policy_checksum
from strata.v1 import events_pb2
from svc_generator.batcher import DynamicBatcher

log = logging.getLogger(__name__)

class PolicyWatcher:
    def __init__(self, bootstrap: str, batcher: DynamicBatcher,
                 topic: topics.Topic[events_pb2.PolicyUpdated] = topics.POLICY_UPDATED) -> None:
        self._bootstrap = bootstrap
        self._batcher = batcher
        self._topic = topic
        self.latest_seen = -1
        self.lineage = ""

    def run(self, stop: threading.Event) -> None:
        consumer = KafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False,
                                 auto_offset_reset="earliest", group_id=None)
        consumer.assign([TopicPartition(self._topic.name, 0)])
        try:
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=500).values():
                    for record in records:
                        self.on_record(record.value, record.key)
        finally:
            consumer.close()

    def on_record(self, value: bytes, key: bytes | None) -> None:
        try:
            event = decode(self._topic, value, key)
        except PoisonMessageError as exc:
            log.error("ignoring an undecodable policy update: %s", exc)
            return
        if event.lineage != self.lineage:
            # A new training run: its versions start again, so the old high-water mark does not apply.
            log.info("policy lineage %s -> %s", self.lineage or "-", event.lineage or "-")
            self.lineage, self.latest_seen = event.lineage, -1
            self._batcher.reset_version_floor()
        if event.policy_version <= self.latest_seen:
            return
        self.latest_seen = event.policy_version
        try:
            actual = policy_checksum(event.checkpoint_path)
        except OSError as exc:
            log.error("policy v%d: cannot read %s: %s", event.policy_version, event.checkpoint_path, exc)
            return
        if event.checksum and actual != event.checksum:
            log.error("policy v%d: checksum mismatch at %s (event %s, file %s); not loading",
                      event.policy_version, event.checkpoint_path, event.checksum[:12], actual[:12])
            return
        self._batcher.request_weights(event.checkpoint_path, event.policy_version)
