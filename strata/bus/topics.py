"""Every Kafka topic of Strata, in one place: its name, its one protobuf message type and its key.

The key of every event is the prompt hash, so all events of one prompt land in one partition, in
order, and a consumer group spreads prompts (not pieces of a prompt) across replicas. Each topic
has a dead-letter twin ``<name>.dlq`` that receives the original bytes of messages that could not be
decoded or kept failing, with the reason in headers (see ``strata.bus.worker``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf.message import Message

from strata.v1 import common_pb2, events_pb2

M = TypeVar("M", bound=Message)

DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True)
class Topic(Generic[M]):
    """A topic and the single message type it carries."""

    name: str
    message_type: type[M]
    key_field: str = "prompt_hash"
    # Compacted topics keep the newest event of each key for ever instead of deleting by age: the
    # control topics, whose announcements a restart must find however old they are.
    compacted: bool = False

    @property
    def dlq(self) -> str:
        return self.name + DLQ_SUFFIX

    def key_of(self, message: M) -> bytes:
        return str(getattr(message, self.key_field)).encode("utf-8")


PROMPTS_LEVEL0: Topic[events_pb2.PromptRouted] = Topic("strata.prompts.level0", events_pb2.PromptRouted)
PROMPTS_LEVEL1: Topic[events_pb2.PromptRouted] = Topic("strata.prompts.level1", events_pb2.PromptRouted)
PROMPTS_LEVEL2: Topic[events_pb2.PromptRouted] = Topic("strata.prompts.level2", events_pb2.PromptRouted)
ROLLOUTS_GENERATED: Topic[events_pb2.RolloutGenerated] = Topic(
    "strata.rollouts.generated", events_pb2.RolloutGenerated
)
REWARDS_SCORED: Topic[events_pb2.RewardScored] = Topic("strata.rewards.scored", events_pb2.RewardScored)
POLICY_UPDATED: Topic[events_pb2.PolicyUpdated] = Topic(
    "strata.policy.updated", events_pb2.PolicyUpdated, key_field="policy_version", compacted=True
)
RM_UPDATED: Topic[events_pb2.RewardModelUpdated] = Topic(
    "strata.rm.updated", events_pb2.RewardModelUpdated, key_field="rm_version", compacted=True
)
ANNOTATIONS_REQUESTED: Topic[events_pb2.AnnotationRequested] = Topic(
    "strata.annotations.requested", events_pb2.AnnotationRequested
)
ANNOTATIONS_COMPLETED: Topic[events_pb2.AnnotationCompleted] = Topic(
    "strata.annotations.completed", events_pb2.AnnotationCompleted
)
ROLLOUT_LOG: Topic[events_pb2.RolloutLogRecord] = Topic("strata.rollout-log", events_pb2.RolloutLogRecord)
PROMPTS_INDEXED: Topic[events_pb2.PromptIndexed] = Topic("strata.scheduler.indexed", events_pb2.PromptIndexed)

ALL_TOPICS: tuple[Topic, ...] = (
    PROMPTS_LEVEL0,
    PROMPTS_LEVEL1,
    PROMPTS_LEVEL2,
    ROLLOUTS_GENERATED,
    REWARDS_SCORED,
    POLICY_UPDATED,
    RM_UPDATED,
    ANNOTATIONS_REQUESTED,
    ANNOTATIONS_COMPLETED,
    ROLLOUT_LOG,
    PROMPTS_INDEXED,
)

# Control topics are tiny and must be totally ordered: one partition.
SINGLE_PARTITION_TOPICS: frozenset[str] = frozenset({POLICY_UPDATED.name, RM_UPDATED.name})

_PROMPTS_BY_TIER: dict[int, Topic[events_pb2.PromptRouted]] = {
    common_pb2.TIER_LEVEL_0: PROMPTS_LEVEL0,
    common_pb2.TIER_LEVEL_1: PROMPTS_LEVEL1,
    common_pb2.TIER_LEVEL_2: PROMPTS_LEVEL2,
}


def prompts_topic(tier: int) -> Topic[events_pb2.PromptRouted]:
    """The prompt topic of a tier (``common_pb2.TIER_LEVEL_*``)."""
    try:
        return _PROMPTS_BY_TIER[tier]
    except KeyError:
        raise ValueError(f"no prompt topic for tier {tier!r}; expected one of TIER_LEVEL_0/1/2") from None


def by_name(name: str) -> Topic:
    for topic in ALL_TOPICS:
        if topic.name == name:
            return topic
    raise KeyError(f"unknown topic {name!r}")
