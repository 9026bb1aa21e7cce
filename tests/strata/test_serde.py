import pytest

from strata.bus import topics
from strata.bus.serde import PoisonMessageError, decode, encode
from strata.hashing import content_hash
from strata.v1 import common_pb2, events_pb2


def _routed() -> events_pb2.PromptRouted:
    message = events_pb2.PromptRouted(
        prompt_hash=content_hash("p"), tier=common_pb2.TIER_LEVEL_1, decision=common_pb2.DECISION_LEVEL_1,
        n_samples=2, policy_version=7,
    )
    message.sampling.temperature = 0.7
    message.routed_at.GetCurrentTime()
    return message


def test_round_trip_with_key() -> None:
    message = _routed()
    value = encode(topics.PROMPTS_LEVEL1, message)
    assert decode(topics.PROMPTS_LEVEL1, value, topics.PROMPTS_LEVEL1.key_of(message)) == message


def test_encoding_is_deterministic_across_map_insertion_order() -> None:
    first = events_pb2.PolicyUpdated(policy_version=3)
    second = events_pb2.PolicyUpdated(policy_version=3)
    names = [f"losses/m{i}" for i in range(50)]
    for i, name in enumerate(names):
        first.metrics[name] = float(i)
    for i, name in reversed(list(enumerate(names))):
        second.metrics[name] = float(i)
    assert encode(topics.POLICY_UPDATED, first) == encode(topics.POLICY_UPDATED, second)


def test_wrong_message_type_is_refused() -> None:
    with pytest.raises(TypeError, match="carries RewardScored, not PromptRouted"):
        encode(topics.REWARDS_SCORED, _routed())


def test_missing_key_field_is_refused() -> None:
    with pytest.raises(ValueError, match=r"PromptRouted\.prompt_hash must be set"):
        encode(topics.PROMPTS_LEVEL1, events_pb2.PromptRouted())


@pytest.mark.parametrize("garbage", [b"\xff\xff\xff\xff", b"\x0a\x10short", b"\x08"])
def test_undecodable_bytes_are_poison(garbage: bytes) -> None:
    with pytest.raises(PoisonMessageError):
        decode(topics.PROMPTS_LEVEL1, garbage)


def test_key_mismatch_is_poison() -> None:
    value = encode(topics.PROMPTS_LEVEL1, _routed())
    with pytest.raises(PoisonMessageError, match="does not match"):
        decode(topics.PROMPTS_LEVEL1, value, key=b"another-key")


def test_tombstone_is_poison() -> None:
    with pytest.raises(PoisonMessageError, match="tombstone"):
        decode(topics.PROMPTS_LEVEL1, None)


def test_prompt_topic_per_tier() -> None:
    assert topics.prompts_topic(common_pb2.TIER_LEVEL_2) is topics.PROMPTS_LEVEL2
    with pytest.raises(ValueError, match="no prompt topic"):
        topics.prompts_topic(common_pb2.TIER_UNSPECIFIED)


def test_topic_names_are_unique_and_dlq_twins_exist() -> None:
    names = [t.name for t in topics.ALL_TOPICS]
    assert len(names) == len(set(names))
    assert all(t.dlq == t.name + ".dlq" for t in topics.ALL_TOPICS)
