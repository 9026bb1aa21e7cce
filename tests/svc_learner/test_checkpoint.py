"""Checkpoints: atomic layout, checksum verification, latest version, plain-transformers loading, resume state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from svc_learner.checkpoint import (
    MAX_BATCH_IDS,
    META_FILE,
    OPTIMIZER_FILE,
    WEIGHTS_FILE,
    AppliedBatches,
    CheckpointError,
    ChecksumMismatchError,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    sha256_file,
    verify_checkpoint,
)
from svc_learner.config import LearnerSettings
from svc_learner.policy import VALUE_HEAD_FILE, PolicyWithValueHead

IDS = torch.tensor([[1, 2, 3, 4, 5]])


def word_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, **{f"w{i}": i for i in range(1, 16)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<pad>")


def save(root: Path, policy: PolicyWithValueHead, version: int, **kwargs: object):
    config = LearnerSettings(checkpoint_dir=root).as_log_dict()
    return save_checkpoint(root, policy, version, step=version * 10, learner_config=config, **kwargs)  # type: ignore[arg-type]


def test_round_trip(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    torch.nn.init.normal_(tiny_policy.value_head.weight)
    optimizer = torch.optim.Adam(tiny_policy.parameters(), lr=1e-3)
    out = tiny_policy(IDS, torch.ones_like(IDS))
    (out.values.sum() - out.logprobs.sum()).backward()
    optimizer.step()  # gives the optimizer some state to save
    applied = AppliedBatches().after_batch("batch-1", {("strata.rewards.scored", 0): 12})
    metrics = {"losses/policy_loss": -0.5}

    info = save(tmp_path, tiny_policy, 1, applied=applied, optimizer=optimizer, metrics=metrics,
                tokenizer=word_tokenizer())  # fmt: skip
    assert info.path == tmp_path / "v1"
    assert info.checksum == sha256_file(tmp_path / "v1" / WEIGHTS_FILE)
    assert {WEIGHTS_FILE, VALUE_HEAD_FILE, "config.json", "learner_config.json", OPTIMIZER_FILE} <= set(info.files)
    assert [p.name for p in tmp_path.iterdir()] == ["v1"]  # no temp dir left behind

    loaded = load_checkpoint(tmp_path / "v1", device="cpu")
    assert (loaded.info.version, loaded.info.step, loaded.info.checksum) == (1, 10, info.checksum)
    assert loaded.info.applied == applied
    assert loaded.info.metrics == metrics
    assert loaded.info.learner_config["checkpoint_dir"] == str(tmp_path)
    assert loaded.info.learner_config["kl_warmup_updates"] == 100
    with torch.no_grad():
        expected = tiny_policy(IDS, torch.ones_like(IDS))
        got = loaded.policy(IDS, torch.ones_like(IDS))
    torch.testing.assert_close(got.logprobs, expected.logprobs)
    torch.testing.assert_close(got.values, expected.values)

    assert loaded.optimizer_state is not None
    resumed = torch.optim.Adam(loaded.policy.parameters(), lr=1e-3)
    resumed.load_state_dict(loaded.optimizer_state)
    assert resumed.state_dict()["state"][0]["step"] == 1


def test_checkpoint_loads_with_plain_transformers(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    info = save(tmp_path, tiny_policy, 3, tokenizer=word_tokenizer())
    lm = AutoModelForCausalLM.from_pretrained(info.path, local_files_only=True)  # what a generator does
    with torch.no_grad():
        torch.testing.assert_close(lm(IDS).logits, tiny_policy.lm(IDS).logits)
    tokenizer = AutoTokenizer.from_pretrained(info.path, local_files_only=True)
    assert tokenizer("w3 w5")["input_ids"] == [3, 5]


def test_checksum_mismatch_is_detected(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    info = save(tmp_path, tiny_policy, 1)
    weights = info.path / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # flip bits in the last tensor's data
    weights.write_bytes(bytes(data))
    with pytest.raises(
        ChecksumMismatchError, match=rf"{WEIGHTS_FILE} has sha256 [0-9a-f]{{64}}, expected {info.checksum}"
    ):
        load_checkpoint(info.path, device="cpu")


def test_a_modified_value_head_or_missing_file_is_detected(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    info = save(tmp_path, tiny_policy, 1)
    head = info.path / VALUE_HEAD_FILE
    head.write_bytes(head.read_bytes()[:-1] + b"\x01")
    with pytest.raises(ChecksumMismatchError, match=VALUE_HEAD_FILE):
        verify_checkpoint(info.path)
    head.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        verify_checkpoint(info.path)
    with pytest.raises(CheckpointError, match="not a Strata checkpoint"):
        verify_checkpoint(tmp_path)


def test_latest_checkpoint_is_the_highest_complete_version(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    assert latest_checkpoint(tmp_path / "absent") is None
    assert latest_checkpoint(tmp_path) is None
    for version in (1, 2, 10):
        save(tmp_path, tiny_policy, version)
    (tmp_path / ".tmp-v11-abc").mkdir()  # a crashed write
    (tmp_path / "v12").mkdir()  # a directory without metadata
    (tmp_path / "notes").mkdir()
    assert latest_checkpoint(tmp_path) == tmp_path / "v10"  # numeric, not lexicographic, order
    assert list_checkpoints(tmp_path) == [tmp_path / "v1", tmp_path / "v2", tmp_path / "v10"]
    assert verify_checkpoint(tmp_path / "v10").step == 100


def test_versions_are_never_overwritten(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    save(tmp_path, tiny_policy, 1)
    with pytest.raises(CheckpointError, match="already exists"):
        save(tmp_path, tiny_policy, 1)


def test_a_failed_write_leaves_nothing(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    class BrokenTokenizer:
        def save_pretrained(self, directory: Path) -> None:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, tiny_policy, 1, tokenizer=BrokenTokenizer())
    assert list(tmp_path.iterdir()) == []
    assert latest_checkpoint(tmp_path) is None


def test_prune_keeps_the_newest(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    for version in range(1, 5):
        save(tmp_path, tiny_policy, version)
    removed = prune_checkpoints(tmp_path, keep=2)
    assert removed == [tmp_path / "v1", tmp_path / "v2"]
    assert list_checkpoints(tmp_path) == [tmp_path / "v3", tmp_path / "v4"]


def test_applied_batches_prevent_double_application() -> None:
    applied = AppliedBatches()
    assert not applied.is_applied("t", 0, 0)
    applied = applied.after_batch("b1", {("t", 0): 10, ("t", 1): 4})
    applied = applied.after_batch("b2", {("t", 0): 7, ("t", 2): 3})  # offsets never move backwards
    assert applied.offsets == {"t:0": 10, "t:1": 4, "t:2": 3}
    assert applied.is_applied("t", 0, 9) and not applied.is_applied("t", 0, 10)
    assert not applied.is_applied("t", 3, 0) and not applied.is_applied("other", 0, 0)
    assert applied.batch_ids == ("b1", "b2")
    assert AppliedBatches.from_json(json.loads(json.dumps(applied.to_json()))) == applied
    for i in range(MAX_BATCH_IDS + 5):
        applied = applied.after_batch(f"x{i}", {})
    assert len(applied.batch_ids) == MAX_BATCH_IDS and applied.batch_ids[-1] == f"x{MAX_BATCH_IDS + 4}"


def test_metadata_file_is_plain_json(tmp_path: Path, tiny_policy: PolicyWithValueHead) -> None:
    info = save(tmp_path, tiny_policy, 4, applied=AppliedBatches({"t:0": 5}, ("b",)))
    meta = json.loads((info.path / META_FILE).read_text())
    assert meta["version"] == 4 and meta["step"] == 40 and meta["checksum"] == info.checksum
    assert meta["applied"] == {"offsets": {"t:0": 5}, "batch_ids": ["b"]}
