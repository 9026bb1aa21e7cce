"""The learner's core without Kafka: offset bookkeeping, staleness at batch time, weight-sync timing."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from strata.models.tiny import build_char_policy
from svc_learner.checkpoint import verify_checkpoint
from svc_learner.config import LearnerSettings
from svc_learner.core import LearnerEngine, Outcome, Sample, Source, WeightSync

TOPIC = "rewards"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_char_policy(tmp_path_factory.mktemp("policy") / "tiny")


def engine_for(policy_dir: Path, tmp_path: Path, **extra: object) -> LearnerEngine:
    settings = LearnerSettings(policy_model_path=policy_dir, checkpoint_dir=tmp_path / "ckpt", device="cpu",
                               batch_size=2, minibatch_size=2, update_epochs=1, **extra)  # fmt: skip
    return LearnerEngine.start(settings, policy_dir, initial_offsets={(TOPIC, 0): 5, (TOPIC, 1): 0})


def sample(partition: int, offset: int, version: int = 0) -> Sample:
    return Sample(f"p{partition}:r{offset}:q:0", Source(TOPIC, partition, offset), (5, 6, 7), (8, 9), 1.0, version)


def test_start_writes_v0_with_the_starting_offsets(policy_dir: Path, tmp_path: Path) -> None:
    engine = engine_for(policy_dir, tmp_path)
    info = verify_checkpoint(tmp_path / "ckpt" / "v0")
    assert (engine.version, engine.step, info.version) == (0, 0, 0)
    assert dict(info.applied.offsets) == {f"{TOPIC}:0": 5, f"{TOPIC}:1": 0}
    assert engine.classify("any", 0, Source(TOPIC, 0, 4)) is Outcome.APPLIED  # below where this lineage starts
    assert engine.classify("any", 0, Source(TOPIC, 0, 5)) is None


def test_applied_offsets_stop_at_the_first_sample_still_pending(policy_dir: Path, tmp_path: Path) -> None:
    engine = engine_for(policy_dir, tmp_path)
    assert engine.offer(sample(0, 5)) is Outcome.ACCEPTED
    engine.discard(Source(TOPIC, 1, 0), Outcome.REUSED)
    assert engine.offer(sample(1, 1)) is Outcome.ACCEPTED
    assert engine.offer(sample(0, 6)) is Outcome.ACCEPTED  # pending after the batch
    engine.discard(Source(TOPIC, 0, 7), Outcome.NOT_FINAL)
    engine.discard(Source(TOPIC, 1, 2), Outcome.NOT_FINAL)
    assert engine.offer(sample(0, 5)) is Outcome.DUPLICATE  # same id, pending

    result = engine.update()
    assert result is not None and result.checkpoint is not None and result.samples == 2
    # Partition 0: offset 6 is still pending, so 6 (not 8) is the first offset not applied.
    # Partition 1: everything seen (0, 1, 2) was learned or skipped.
    assert dict(result.checkpoint.info.applied.offsets) == {f"{TOPIC}:0": 6, f"{TOPIC}:1": 3}
    assert [s.source.offset for s in engine.pending()] == [6]
    assert engine.classify("p0:r5:q:0", 1, Source(TOPIC, 0, 99)) is Outcome.DUPLICATE  # learned recently
    assert engine.update() is None  # one sample pending: no batch


def test_samples_taken_into_updates_are_unversioned_until_a_version_holds_them(policy_dir: Path,
                                                                             tmp_path: Path) -> None:
    engine = engine_for(policy_dir, tmp_path, checkpoint_every_updates=2)
    for offset in (5, 6, 7, 8):
        engine.offer(sample(0, offset))
    assert (engine.status().pending, engine.status().unversioned) == (4, 0)
    first = engine.update()
    assert first is not None and first.checkpoint is None  # one update of two before a version is written
    assert (engine.status().pending, engine.status().unversioned, engine.version) == (2, 2, 0)
    second = engine.update()
    assert second is not None and second.checkpoint is not None
    assert (engine.status().pending, engine.status().unversioned, engine.version) == (0, 0, 1)


def test_pending_samples_that_became_stale_are_dropped_when_the_batch_forms(policy_dir: Path, tmp_path: Path) -> None:
    engine = engine_for(policy_dir, tmp_path, max_staleness=0, keep_checkpoints=1)
    for offset in (5, 6, 7):
        engine.offer(sample(0, offset, version=0))
    assert engine.update() is not None and engine.version == 1  # the v0 sample at offset 7 waits
    assert engine.offer(sample(1, 0, version=1)) is Outcome.ACCEPTED
    assert engine.update() is None  # offset 7 is now one version behind, over max_staleness = 0
    counts = engine.status().counts
    assert (counts["accepted"], counts["dropped_stale"]) == (4, 1)
    assert engine.classify("new", 0, Source(TOPIC, 1, 5)) is Outcome.STALE
    assert engine.classify("new", 2, Source(TOPIC, 1, 5)) is Outcome.FUTURE


def test_a_lagging_sample_is_refused_when_its_checkpoint_is_gone(policy_dir: Path, tmp_path: Path) -> None:
    engine = engine_for(policy_dir, tmp_path, max_staleness=1, keep_checkpoints=2)
    for version in range(2):  # v1, then v2 (v0 pruned: keep 2)
        engine.offer(sample(0, 5 + 2 * version, version))
        engine.offer(sample(1, 2 * version, version))
        assert engine.update() is not None
    assert engine.version == 2 and not (tmp_path / "ckpt" / "v0").exists()
    assert engine.classify("new", 1, Source(TOPIC, 1, 9)) is None  # lag 1: corrected with v1's log-probs
    shutil.rmtree(tmp_path / "ckpt" / "v1")  # e.g. removed by hand: the behaviour policy is gone
    assert engine.classify("new", 1, Source(TOPIC, 1, 9)) is Outcome.STALE
    assert engine.classify("new", 2, Source(TOPIC, 1, 9)) is None


def test_weight_sync_is_publish_to_first_rollout_on_the_version() -> None:
    sync = WeightSync()
    sync.published(3, at=10.0)
    sync.published(4, at=12.0)
    assert sync.observed(2, at=10.5) == []  # an older version does not complete it
    assert sync.observed(4, at=13.0) == [(3, 3.0), (4, 1.0)]  # a generator may skip a version
    assert sync.observed(4, at=14.0) == []  # only the first rollout counts
    assert (sync.last_version, sync.last_seconds) == (4, 1.0)


def test_escalated_level1_samples_train_unless_turned_off() -> None:
    from strata.v1 import common_pb2, events_pb2
    from svc_learner.core import Outcome
    from svc_learner.worker import skip_reason

    tiers = frozenset({1})
    escalated = events_pb2.RewardScored(response_hash="r", tier=common_pb2.TIER_LEVEL_1, final=False, escalated=True,
                                        scorer=common_pb2.SCORER_LIGHT)
    assert skip_reason(escalated, tiers) is None
    assert skip_reason(escalated, tiers, train_on_escalated=False) is Outcome.NOT_FINAL
    pending = events_pb2.RewardScored(response_hash="r", tier=common_pb2.TIER_LEVEL_1, final=False, escalated=False)
    assert skip_reason(pending, tiers) is Outcome.NOT_FINAL


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), float("-inf")])
def test_a_reward_that_is_not_a_number_never_reaches_a_batch(reward: float) -> None:
    from strata.v1 import common_pb2, events_pb2
    from svc_learner.core import Outcome
    from svc_learner.worker import skip_reason

    event = events_pb2.RewardScored(response_hash="r", tier=common_pb2.TIER_LEVEL_1, final=True, reward=reward,
                                    scorer=common_pb2.SCORER_LIGHT)
    assert skip_reason(event, frozenset({1})) is Outcome.UNUSABLE


def test_a_checkpoint_of_another_initial_policy_is_refused_with_the_fix(policy_dir: Path, tmp_path: Path) -> None:
    settings = LearnerSettings(policy_model_path=policy_dir, checkpoint_dir=tmp_path / "ckpt", device="cpu",
                               batch_size=2, minibatch_size=2, update_epochs=1)
    first = {"initial_policy": "/zoo/default/level1"}
    LearnerEngine.start(settings, policy_dir, extra_config=first)
    # The same initial policy resumes; another one (a zoo preset switched on the same state) is refused.
    assert LearnerEngine.start(settings, policy_dir, extra_config=first).version == 0
    with pytest.raises(ValueError, match=r"continues the policy /zoo/default/level1.*starts from /zoo/ci/level1.*"
                                         r"checkpoint dir of its own"):
        LearnerEngine.start(settings, policy_dir, extra_config={"initial_policy": "/zoo/ci/level1"})


def test_a_resumed_lineage_says_when_the_tiers_it_trains_on_changed(policy_dir: Path, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    from svc_learner.core import recipe_changes

    assert recipe_changes({"train_tiers": "1"}, {"train_tiers": "1,2"}) == ["train_tiers was '1' for this lineage, "
                                                                            "now '1,2'"]
    assert recipe_changes({"train_tiers": "1,2"}, {"train_tiers": "1,2"}) == []
    assert recipe_changes({}, {"train_tiers": "1,2"}) == []  # a checkpoint from before the setting: nothing to say
    base = dict(policy_model_path=policy_dir, checkpoint_dir=tmp_path / "ckpt", device="cpu", batch_size=2,
                minibatch_size=2, update_epochs=1)
    LearnerEngine.start(LearnerSettings(**base, train_tiers="1"), policy_dir)
    with caplog.at_level(logging.WARNING, logger="svc_learner.core"):
        assert LearnerEngine.start(LearnerSettings(**base, train_tiers="1,2"), policy_dir).version == 0
    assert "with another recipe: train_tiers was '1' for this lineage, now '1,2'" in caplog.text
