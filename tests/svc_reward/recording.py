"""A publisher for the reward worker's tests: it records what the worker publishes, as (topic name, event), and
acknowledges at once (no Kafka)."""

from __future__ import annotations


class RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[tuple[str, object]] = []

    def publish(self, topic, message):
        self.published.append((topic.name, message))
        return None

    def wait(self, futures) -> None:
        pass
