"""The zoo build on a micro configuration: stages, caching, and loading through the user-facing loaders."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from strata.config import StrataSettings
from strata.models.loading import load_causal_lm, load_reward_model
from strata.models.reward import score_responses
from strata.models.training import ModelShape, TrainConfig
from strata_tools.rm.recipe import STUDENT_INIT_DIR, groups_of, student_init_dir
from strata_tools.rm.rows import near_miss_rows
from strata_tools.task.oracle import oracle_score
from strata_tools.task.suite import load_suite
from strata_tools.zoo.build import ZooBuilder, ZooPaths, ZooSettings, as_zoo_settings, resolve_config, zoo_paths
from strata_tools.zoo.config import PRESETS, ROLES, ZooConfig, stage_key, with_overrides
from svc_reward.registry import describe

MICRO_SHAPE = ModelShape(n_embd=16, n_layer=1, n_head=2)
MICRO_TRAIN = TrainConfig(steps=2, batch_size=4, lr=1e-3, warmup_steps=1)


def micro_config() -> ZooConfig:
    return with_overrides(
        PRESETS["ci"](), preset="micro", vocab_size=300, lm_responses_per_prompt=1, probe=MICRO_SHAPE,
        probe_train=MICRO_TRAIN, level1=MICRO_SHAPE, level1_train=MICRO_TRAIN, level2=MICRO_SHAPE,
        level2_train=MICRO_TRAIN, rm_group_size=2, rm_model_samples=2, rm_strong_train=MICRO_TRAIN,
        rm_light_train=MICRO_TRAIN, sample_max_new_tokens=4,
        # As the default preset: Level-2 grows after training; the strong RM starts from the probe,
        # takes match steps with feature heads, then grows; the light RM is distilled from it.
        level2_grow_layers=1, level2_grow_train=MICRO_TRAIN, rm_strong_init="probe", rm_strong_init_layers=0,
        rm_strong_match_pairs=2, rm_strong_feature_weight=0.3, rm_strong_widen=2, rm_strong_grow_layers=1,
        rm_strong_grow_train=MICRO_TRAIN, rm_light_distill_pairs=6, rm_light_distill_swaps=2,
    )


def test_presets_and_hashes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert set(PRESETS) >= {"default", "ci"}
    assert ZooConfig().config_hash() == ZooConfig().config_hash()
    assert PRESETS["ci"]().config_hash() != ZooConfig().config_hash()
    assert with_overrides(ZooConfig(), seed=1).config_hash() != ZooConfig().config_hash()
    monkeypatch.setenv("STRATA_ZOO_PRESET", "ci")
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path))
    settings = as_zoo_settings(StrataSettings())  # any service's settings work
    assert resolve_config(settings).preset == "ci"
    paths = zoo_paths(StrataSettings())
    assert paths.root == tmp_path / "zoo" / PRESETS["ci"]().config_hash()
    assert not paths.is_complete()
    monkeypatch.setenv("STRATA_ZOO_PRESET", "huge")
    with pytest.raises(ValueError, match="unknown zoo preset"):
        resolve_config(ZooSettings())


def test_bad_configs_fail_before_building() -> None:
    # The GPT-2 recipe on the probe's trunk (the default before the pretrained trunk): it must grow.
    probe_rm = with_overrides(ZooConfig(), rm_strong_init="probe", rm_strong_widen=3, rm_strong_grow_layers=8,
                              rm_light_layers=0)
    with pytest.raises(ValueError, match=r"rm_max_length \(512\) exceeds n_positions \(256\)"):
        with_overrides(ZooConfig(), rm_max_length=512)
    with pytest.raises(ValueError, match=r"rm_strong_init_layers \(17\) exceeds the level2 LM's 16 layers"):
        with_overrides(ZooConfig(), rm_strong_init="level2", rm_strong_init_layers=17)
    with pytest.raises(ValueError, match=r"rm_strong_init_layers \(5\) exceeds the probe LM's 4 layers"):
        with_overrides(probe_rm, rm_strong_init_layers=5)
    with pytest.raises(ValueError, match=r"rm_strong_init_layers \(7\) exceeds the minilm LM's 6 layers"):
        with_overrides(ZooConfig(), rm_strong_init_layers=7)
    with pytest.raises(ValueError, match="rm_strong_widen must be >= 1"):
        with_overrides(ZooConfig(), rm_strong_widen=0)
    with pytest.raises(ValueError, match="the strong RM must grow"):
        with_overrides(probe_rm, rm_strong_widen=1, rm_strong_grow_layers=0)
    with pytest.raises(ValueError, match=r"a pretrained trunk \(minilm\) widens but does not deepen"):
        with_overrides(ZooConfig(), rm_strong_grow_layers=8)
    with pytest.raises(ValueError, match="rm_light_layers must be 0 or fewer than the strong RM's 6 blocks"):
        with_overrides(ZooConfig(), rm_strong_init="minilm", rm_strong_widen=1, rm_strong_grow_layers=0,
                       rm_light_layers=6)
    with pytest.raises(ValueError, match=r"or the light RM start from its first blocks \(rm_light_layers > 0\)"):
        with_overrides(ZooConfig(), rm_strong_widen=1)
    assert with_overrides(ZooConfig(), rm_strong_widen=1, rm_light_layers=2).rm_light_layers == 2
    grown = with_overrides(ZooConfig(), rm_strong_init="level2", rm_strong_init_layers=16)
    assert grown.rm_strong_init_layers == 16  # all of the grown LM


@pytest.mark.slow
def test_micro_build_loads_through_the_user_loaders_and_is_reused(tmp_path: Path) -> None:
    config = micro_config()
    paths = ZooPaths.under(tmp_path / config.config_hash(), config)
    ZooBuilder(paths, threads=1, progress=False).build()
    assert paths.is_complete()
    manifest = json.loads((paths.root / "manifest.json").read_text())
    assert manifest["config"]["preset"] == "micro"

    for path in (paths.probe, paths.level1, paths.level2):
        lm = load_causal_lm(path, device="cpu")
        assert lm.zoo_info is not None and lm.zoo_info["config_hash"] == config.config_hash()
    level2 = load_causal_lm(paths.level2, device="cpu")
    assert level2.model.config.n_layer == MICRO_SHAPE.n_layer + 1  # grown
    assert level2.zoo_info is not None and level2.zoo_info["grown_from"]["n_layer"] == MICRO_SHAPE.n_layer
    # The strong RM grew from the probe's shape; the light RM is its trunk before growth, distilled from it.
    strong = load_reward_model(paths.strong_rm, device="cpu")
    light = load_reward_model(paths.light_rm, device="cpu")
    strong_shape, light_shape = strong.model.config, light.model.config
    assert (strong_shape.n_layer, strong_shape.n_embd) == (MICRO_SHAPE.n_layer + 1, 2 * MICRO_SHAPE.n_embd)
    assert (light_shape.n_layer, light_shape.n_embd) == (MICRO_SHAPE.n_layer, MICRO_SHAPE.n_embd)
    assert strong.zoo_info is not None and strong.zoo_info["grown_from"]["n_embd"] == MICRO_SHAPE.n_embd
    assert light.zoo_info is not None and light.zoo_info["teacher"] == describe("strong", [paths.strong_rm]).version
    assert light.zoo_info["distill_pairs"] == {"rm_data": 6, "prompt_swaps": 2}
    assert student_init_dir(paths.strong_rm) == paths.strong_rm / STUDENT_INIT_DIR
    for path in (paths.strong_rm, paths.light_rm):
        rm = load_reward_model(path, device="cpu")
        assert rm.model.config.num_labels == config.rm_n_bins
        assert 0.0 <= score_responses(rm, ["Explain recursion."], ["It calls itself."])[0] <= 5.0
    rows = [json.loads(line) for line in paths.rm_data.open()]
    assert {"prompt", "response", "score", "kind", "group"} <= set(rows[0])
    assert any(row["kind"].startswith("sample:level2") for row in rows)
    samples = [row for row in rows if row["kind"].startswith("sample:")]
    assert [row for row in rows if row["kind"].startswith("perturbed:")] == near_miss_rows(
        samples, {record.id: record for record in load_suite("train")}, config.seed + 2)
    for group in groups_of(rows):  # one prompt per group: the contrast is between its answers
        assert len({rows[i]["prompt_id"] for i in group}) == 1 and len(group) >= config.rm_group_size

    stamp = (paths.level2 / "strata_zoo.json").stat().st_mtime_ns
    builder = ZooBuilder(paths, threads=1, progress=False)
    builder.build()
    assert builder.timings == {}  # every stage reused
    assert (paths.level2 / "strata_zoo.json").stat().st_mtime_ns == stamp

    # Another strong-RM recipe in the same cache: only the RMs are trained (the light RM is distilled
    # from the strong one); the rest is copied over.
    changed = with_overrides(config, rm_strong_train=TrainConfig(steps=3, batch_size=4, lr=1e-3, warmup_steps=1))
    changed_paths = ZooPaths.under(tmp_path / changed.config_hash(), changed)
    builder = ZooBuilder(changed_paths, threads=1, progress=False)
    builder.build()
    assert set(builder.timings) == {"rm_strong", "rm_light"}
    assert set(builder.copied) == {"tokenizer", "probe", "level1", "level2", "rm_data"}
    copied = load_causal_lm(changed_paths.level2, device="cpu").zoo_info
    assert copied is not None and copied["config_hash"] == changed.config_hash()
    assert copied["copied_from"] == str(paths.level2)
    # What was trained after copying is what a build from nothing makes (every stage seeds itself).
    fresh_paths = ZooPaths.under(tmp_path / "fresh" / changed.config_hash(), changed)
    fresh = ZooBuilder(fresh_paths, threads=1, progress=False, reuse_other_zoos=False)
    fresh.build()
    assert set(fresh.timings) == set(ROLES) and fresh.copied == {}
    reused_rm = load_reward_model(changed_paths.strong_rm, device="cpu").model.state_dict()
    fresh_rm = load_reward_model(fresh_paths.strong_rm, device="cpu").model.state_dict()
    assert all(torch.equal(reused_rm[name], fresh_rm[name]) for name in fresh_rm)

    # A strong RM on a pretrained trunk (MiniLM's first 2 blocks here, to stay quick) with its own
    # tokenizer, widened 2x after training; the light RM is its first block before growth, distilled
    # from it. Only the RMs are trained.
    trunk = with_overrides(config, rm_strong_init="minilm", rm_strong_init_layers=2, rm_strong_widen=2,
                           rm_strong_grow_layers=0, rm_strong_match_pairs=0, rm_strong_feature_weight=0.0,
                           rm_strong_head_lr_scale=20.0, rm_light_layers=1)
    trunk_paths = ZooPaths.under(tmp_path / trunk.config_hash(), trunk)
    builder = ZooBuilder(trunk_paths, threads=1, progress=False)
    builder.build()
    assert set(builder.timings) == {"rm_strong", "rm_light"}
    strong, light = (load_reward_model(p, device="cpu") for p in (trunk_paths.strong_rm, trunk_paths.light_rm))
    assert strong.model.config.model_type == "bert" and strong.model.config.num_hidden_layers == 2
    assert strong.model.config.hidden_size == 768  # MiniLM's 384, widened
    assert light.model.config.model_type == "bert" and light.model.config.num_hidden_layers == 1
    assert light.model.config.hidden_size == 384
    assert light.zoo_info is not None and light.zoo_info["init"] == f"rm_strong/{STUDENT_INIT_DIR} (first 1 blocks)"
    for rm in (strong, light):  # its own WordPiece vocabulary, reading what the RM was trained on
        assert rm.tokenizer.model_max_length == trunk.rm_max_length
        assert rm.tokenizer("Q: hi")["input_ids"][0] == rm.tokenizer.cls_token_id
        assert 0.0 <= score_responses(rm, ["Explain recursion."], ["It calls itself."])[0] <= 5.0


def test_stage_keys_follow_what_each_stage_reads() -> None:
    base = asdict(ZooConfig())

    def changed_stages(**changes: object) -> set[str]:
        other = asdict(with_overrides(ZooConfig(), **changes))  # type: ignore[arg-type]
        return {role for role in ROLES if stage_key(other, role) != stage_key(base, role)}

    assert changed_stages(preset="renamed") == set()
    # The light RM is distilled from the strong RM: whatever changes the strong RM changes it too.
    assert changed_stages(rm_strong_train=TrainConfig(steps=1, batch_size=1, lr=1e-3)) == {"rm_strong", "rm_light"}
    assert changed_stages(rm_strong_widen=3) == {"rm_strong", "rm_light"}
    assert changed_stages(rm_strong_head_lr_scale=1.0) == {"rm_strong", "rm_light"}
    assert changed_stages(rm_light_layers=3) == {"rm_light"}
    assert changed_stages(rm_strong_grow_train=TrainConfig(steps=1, batch_size=1, lr=1e-3)) == {"rm_strong",
                                                                                              "rm_light"}
    assert changed_stages(rm_light_train=TrainConfig(steps=1, batch_size=1, lr=1e-3)) == {"rm_light"}
    assert changed_stages(rm_light_distill_swaps=3) == {"rm_light"}
    assert changed_stages(rm_max_length=128) == {"rm_strong", "rm_light"}
    assert changed_stages(level1_train=TrainConfig(steps=1, batch_size=1, lr=1e-3)) == {
        "level1", "rm_data", "rm_strong", "rm_light"}
    assert changed_stages(rm_strong_match_pairs=8) == {"rm_strong", "rm_light"}
    assert changed_stages(rm_strong_feature_weight=0.3) == {"rm_strong", "rm_light"}
    # A pretrained trunk depends on no zoo LM: a longer probe changes the probe alone.
    assert changed_stages(probe_train=TrainConfig(steps=1, batch_size=1, lr=1e-3)) == {"probe"}
    # An RM on a zoo LM follows that LM (the light RM the strong RM).
    probe_init = asdict(with_overrides(ZooConfig(), rm_strong_init="probe"))
    longer_probe = asdict(with_overrides(ZooConfig(), rm_strong_init="probe",
                                         probe_train=TrainConfig(steps=1, batch_size=1, lr=1e-3)))
    assert {role for role in ROLES if stage_key(longer_probe, role) != stage_key(probe_init, role)} == {
        "probe", "rm_strong", "rm_light"}
    level2_init = asdict(with_overrides(ZooConfig(), rm_strong_init="level2"))
    longer_level2 = asdict(with_overrides(ZooConfig(), rm_strong_init="level2",
                                          level2_train=TrainConfig(steps=1, batch_size=1, lr=1e-3)))
    assert {role for role in ROLES if stage_key(longer_level2, role) != stage_key(level2_init, role)} == {
        "level2", "rm_data", "rm_strong", "rm_light"}
    assert stage_key(level2_init, "rm_strong") != stage_key(base, "rm_strong")
    assert changed_stages(seed=1) == set(ROLES)


def test_near_misses_join_their_samples_group_re_scored_by_the_oracle() -> None:
    records = load_suite("train")[:3]
    prose = ("The idea is simple. Check the result first. Then measure it again.", "Zebra.")
    samples = [{"prompt_id": r.id, "prompt": r.text, "response": prose[i % 2], "kind": f"sample:level{1 + i % 2}",
                "group": 10 + i, "score": 0.0} for i, r in enumerate(records)]
    rows = near_miss_rows(samples, {r.id: r for r in records}, seed=0)
    assert [row["group"] for row in rows] == [10, 12]  # "Zebra." has nothing to swap or reorder: no near miss
    assert all(row["kind"] == "perturbed:level1" and row["response"] != prose[0] for row in rows)
    rescored = [oracle_score(records[i], row["response"]) for i, row in zip((0, 2), rows, strict=True)]
    assert [row["score"] for row in rows] == rescored
