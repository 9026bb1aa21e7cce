"""Level-2 samples: the Level-2 model is their behaviour policy (no Kafka: the engine, the intake with fakes).

Two tiny GPT-2s share the character tokenizer of ``build_char_policy`` but not their weights: one is
the policy (Level 1), the other, in another directory, plays the Level-2 model.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, GPT2LMHeadModel

from strata.bus import Delivery, topics
from strata.content_store import ContentNotFoundError
from strata.contract.template import format_prompt
from strata.models.tiny import build_char_policy
from strata.models.tokens import tokenizer_id
from strata.v1 import common_pb2, events_pb2
from svc_learner.config import LearnerSettings
from svc_learner.core import LEVEL2, LearnerEngine, Outcome, Sample, Source
from svc_learner.service import level2_behaviour_path
from svc_learner.worker import RewardIntake, sample_key, skip_reason

TOPIC = "rewards"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_policy(tmp_path_factory.mktemp("policy") / "tiny-level1")


@pytest.fixture(scope="module")
def level2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_policy(tmp_path_factory.mktemp("level2") / "tiny-level2", seed=1)


@pytest.fixture(scope="module")
def other_vocab_dir(level2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Level-2 model with one token more in its tokenizer: another vocabulary."""
    directory = tmp_path_factory.mktemp("other") / "tiny-other-vocab"
    shutil.copytree(level2_dir, directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.add_tokens(["<|extra|>"])
    tokenizer.save_pretrained(directory)
    return directory


def engine_for(policy_dir: Path, tmp_path: Path, level2: Path | None, **extra: object) -> LearnerEngine:
    values: dict = dict(policy_model_path=policy_dir, checkpoint_dir=tmp_path / "ckpt", device="cpu", batch_size=4,
                        minibatch_size=4, update_epochs=1, learning_rate=1e-3, train_tiers="1,2")  # fmt: skip
    values.update(extra)
    return LearnerEngine.start(LearnerSettings(**values), policy_dir, initial_offsets={(TOPIC, 0): 0, (TOPIC, 1): 0},
                               level2_model_path=level2)  # fmt: skip


def level1(offset: int, version: int = 0) -> Sample:
    return Sample(f"l1:{offset}", Source(TOPIC, 0, offset), (40, 41, 42), (50, 51, 52, 0), 3.0, version)


def level2(offset: int, version: int = 0, response: tuple[int, ...] = (60, 61, 62, 63, 64, 0)) -> Sample:
    return Sample(f"l2:{offset}", Source(TOPIC, 1, offset), (40, 41, 42, 43), response, 4.0, version, LEVEL2)


def token_logprobs(model: GPT2LMHeadModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """A plain forward of a causal LM: log p(input_ids[:, j+1] | prefix), (B, T-1)."""
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]  # (B, T-1, V)
    return F.log_softmax(logits.float(), -1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)


def test_a_mixed_batch_updates_with_level2_rows_weighted_against_the_level2_model(
    policy_dir: Path, level2_dir: Path, tmp_path: Path
) -> None:
    engine = engine_for(policy_dir, tmp_path, level2_dir)
    samples = [level1(0), level2(0, version=7), level1(1), level2(1, version=7, response=(70, 71, 0))]
    assert [engine.offer(s) for s in samples] == [Outcome.ACCEPTED] * 4

    batch, off_policy = engine._collate(samples)
    assert off_policy == 2 and batch.off_policy is not None and batch.behaviour_logprobs is not None
    assert batch.off_policy.tolist() == [False, True, False, True]  # v0 Level-1 rows are the current weights
    mask = (batch.response_mask[:, 1:] * batch.attention_mask[:, 1:]).bool()  # (B, T-1)
    rows = batch.off_policy
    expected = token_logprobs(GPT2LMHeadModel.from_pretrained(level2_dir), batch.input_ids, batch.attention_mask)
    torch.testing.assert_close(batch.behaviour_logprobs[rows][mask[rows]], expected[rows][mask[rows]])
    policy = token_logprobs(GPT2LMHeadModel.from_pretrained(policy_dir), batch.input_ids, batch.attention_mask)
    assert not torch.allclose(policy[rows][mask[rows]], expected[rows][mask[rows]])  # another model indeed
    # The truncated weight min(1, π_old/π_level2) per Level-2 token; π_old is the policy before the update.
    weights = torch.exp((policy - expected).clamp(max=0.0))[rows][mask[rows]]

    result = engine.update()
    assert result is not None and (result.samples, result.off_policy, engine.version) == (4, 2, 1)
    assert result.metrics["samples/level2_fraction"] == 0.5
    assert result.metrics["off_policy/level2_is_weight_mean"] == pytest.approx(weights.mean().item(), rel=1e-4)
    assert 0.0 < result.metrics["off_policy/level2_is_weight_mean"] < 1.0
    assert torch.isfinite(torch.tensor(list(result.metrics.values()))).all()


def test_a_level2_sample_skips_the_version_checks_only(policy_dir: Path, level2_dir: Path, tmp_path: Path) -> None:
    engine = engine_for(policy_dir, tmp_path, level2_dir, batch_size=2, minibatch_size=2, max_staleness=0,
                        keep_checkpoints=1)  # fmt: skip
    # Stamped with a version this learner never wrote: the Level-2 generator's stamp, not a refusal.
    assert engine.classify("l2:9", 9, Source(TOPIC, 1, 9), LEVEL2) is None
    assert engine.classify("l1:9", 9, Source(TOPIC, 0, 9)) is Outcome.FUTURE
    assert engine.offer(level2(0, version=9)) is Outcome.ACCEPTED
    assert engine.offer(level2(0, version=9)) is Outcome.DUPLICATE  # the other checks still hold
    long_response = tuple(range(10, 10 + 200))  # over the 160 positions of both models
    assert engine.offer(level2(1, response=long_response)) is Outcome.UNUSABLE
    assert engine.offer(level1(0)) is Outcome.ACCEPTED
    assert engine.update() is not None and engine.version == 1
    assert engine.classify("l2:0", 0, Source(TOPIC, 1, 0), LEVEL2) is Outcome.APPLIED

    # v0 is now over max_staleness = 0 (and pruned): a Level-1 v0 sample is stale, a Level-2 one is not.
    assert engine.offer(level1(1, version=0)) is Outcome.STALE
    assert engine.offer(level2(2, version=0)) is Outcome.ACCEPTED
    assert engine.offer(level1(2, version=1)) is Outcome.ACCEPTED
    result = engine.update()
    assert result is not None and result.off_policy == 1  # the Level-2 row; the v1 row is on-policy
    counts = engine.status().counts
    assert (counts["dropped_future"], counts["dropped_stale"], counts["accepted"]) == (0, 1, 4)


def test_with_train_tiers_1_level2_samples_are_skipped_tier(policy_dir: Path, level2_dir: Path, tmp_path: Path) -> None:
    engine = engine_for(policy_dir, tmp_path, level2_dir, train_tiers="1")
    assert engine.trained_tiers == {1} and engine.level2_model_path is None  # the Level-2 model is not even read
    event = events_pb2.RewardScored(response_hash="r", tier=common_pb2.TIER_LEVEL_2, final=True, reward=4.0,
                                    scorer=common_pb2.SCORER_STRONG)  # fmt: skip
    assert skip_reason(event, engine.trained_tiers) is Outcome.OTHER_TIER
    assert skip_reason(event, LearnerSettings().trained_tiers) is None  # both tiers train by default
    assert skip_reason(event, LearnerSettings(train_tiers="1").trained_tiers) is Outcome.OTHER_TIER
    assert engine.offer(level2(0)) is Outcome.OTHER_TIER
    assert engine.status().counts["skipped_tier"] == 1


def test_a_level2_model_with_another_vocabulary_switches_level2_training_off(
    policy_dir: Path, other_vocab_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="svc_learner.core"):
        engine = engine_for(policy_dir, tmp_path, other_vocab_dir)
    assert "another vocabulary than the policy" in caplog.text and "switched off" in caplog.text
    assert engine.trained_tiers == {1} and engine.level2_model_path is None and engine.level2_tokenizer is None
    assert engine.offer(level2(0)) is Outcome.OTHER_TIER
    assert engine.offer(level1(0)) is Outcome.ACCEPTED
    assert engine.status().counts["skipped_tier"] == 1
    with pytest.raises(ValueError, match="nothing would train the policy"):
        engine_for(policy_dir, tmp_path / "only2", other_vocab_dir, train_tiers="2")


def test_the_level2_model_comes_from_the_setting_else_the_zoo_else_none(
    level2_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert level2_behaviour_path(LearnerSettings(level2_model_path=level2_dir, train_tiers="1,2")) == level2_dir
    assert level2_behaviour_path(LearnerSettings(level2_model_path=level2_dir)) == level2_dir  # both by default
    assert level2_behaviour_path(LearnerSettings(level2_model_path=level2_dir, train_tiers="1")) is None
    with caplog.at_level(logging.WARNING, logger="svc_learner.service"):
        assert level2_behaviour_path(LearnerSettings(cache_dir=tmp_path, zoo_preset="ci", train_tiers="1,2")) is None
    assert "no level2 model configured" in caplog.text and "--level2-model-path" in caplog.text


class FakeStore:
    """The content store's reads: texts by hash, token ids by (hash, tokenizer id)."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.tokens: dict[tuple[str, str], list[int]] = {}

    def get_text(self, digest: str) -> str:
        return self.texts[digest]

    def get_tokens(self, digest: str, tokenizer: str) -> list[int]:
        if (digest, tokenizer) not in self.tokens:
            raise ContentNotFoundError(f"no token ids under {digest} for {tokenizer}")
        return self.tokens[(digest, tokenizer)]


class NoMarks:
    def which(self, samples: list[str]) -> set[str]:
        return set()


def test_the_intake_reads_level2_token_ids_under_the_level2_tokenizer_id(
    policy_dir: Path, level2_dir: Path, tmp_path: Path
) -> None:
    engine = engine_for(policy_dir, tmp_path, level2_dir)
    assert engine.level2_tokenizer is not None
    policy_id = tokenizer_id(engine.tokenizer)
    assert tokenizer_id(engine.level2_tokenizer) == policy_id  # same vocabulary, same derived key
    level2_id = "custom-level2-key"  # a key set by hand (level2_tokenizer_id)
    store = FakeStore()
    store.texts["p"] = "how do i fix the sink"
    store.tokens[("r1", policy_id)] = [50, 51, 0]
    store.tokens[("r2", level2_id)] = [60, 61, 0]
    store.tokens[("r3", policy_id)] = [70, 71, 0]  # a Level-2 response under the policy's key only: missing
    settings = engine.settings
    intake = RewardIntake(settings, engine, store, None, NoMarks(), policy_id, level2_id)  # type: ignore[arg-type]

    def delivery(offset: int, response: str, tier: int) -> Delivery[events_pb2.RewardScored]:
        event = events_pb2.RewardScored(prompt_hash="p", response_hash=response, tier=tier, policy_version=5,
                                        reward=3.0, scorer=common_pb2.SCORER_STRONG, final=True, request_id="q",
                                        directions=[common_pb2.Direction(name="give_steps")])  # fmt: skip
        return Delivery(topics.REWARDS_SCORED, event, None, 0, offset, 1, 0)

    deliveries = [delivery(0, "r1", common_pb2.TIER_LEVEL_1), delivery(1, "r2", common_pb2.TIER_LEVEL_2),
                  delivery(2, "r3", common_pb2.TIER_LEVEL_2)]  # fmt: skip
    intake.handle_batch(deliveries)
    pending = {s.key: s for s in engine.pending()}
    counts = engine.status().counts
    # The Level-1 sample's v5 is a version this v0 learner never wrote; r3 is not under the Level-2 key.
    assert (counts["dropped_future"], counts["dropped_missing"], counts["accepted"]) == (1, 1, 1)
    sample = pending[sample_key(deliveries[1].message)]
    assert (sample.behaviour, sample.policy_version, sample.response_ids) == (LEVEL2, 5, (60, 61, 0))
    prompt = format_prompt("how do i fix the sink", ("give_steps",))
    assert list(sample.prompt_ids) == engine.tokenizer(prompt)["input_ids"]  # the policy's tokenizer
