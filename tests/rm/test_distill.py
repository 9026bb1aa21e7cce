import json
import math
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from rmutil import N_BINS, TINY
from transformers import PreTrainedTokenizerFast

from strata.contract.checksums import version_id, weights_checksum
from strata.models.loading import load_reward_model
from strata.models.reward import expected_reward
from strata.models.training import TrainConfig
from strata_tools.cli.main import CliError, main
from strata_tools.rm import recipe as recipe_module
from strata_tools.rm.distill import (
    DistillConfig,
    collate,
    comparison_metrics,
    distill_loss,
    in_length_order,
    kl_per_pair,
    length_buckets,
    lr_at,
    rank_metrics,
    train_light,
)
from strata_tools.rm.lifecycle import read_pairs
from strata_tools.rm.light import DistillOptions, _fit_light_members
from strata_tools.rm.recipe import (
    FRESH_LIGHT_TRAIN,
    RM_LIGHT_TRAIN,
    STUDENT_INIT_DIR,
    LightRecipe,
    fit_light,
    student_init_dir,
)
from strata_tools.rm.train import new_reward_model
from strata_tools.rm.versions import RM_INFO_FILE
from strata_tools.zoo.config import PRESETS, ZooConfig, with_overrides
from svc_reward.registry import describe


def logits_of(*rows: list[float]) -> torch.Tensor:
    return torch.log(torch.tensor(rows, dtype=torch.float64))


def test_kl_is_zero_for_equal_distributions_whatever_the_logit_offset() -> None:
    strong = logits_of([0.2, 0.3, 0.5])
    assert kl_per_pair(strong, strong + 7.0).item() == pytest.approx(0.0, abs=1e-7)


def test_kl_by_hand() -> None:
    strong, light = logits_of([0.5, 0.5]), logits_of([0.25, 0.75])
    by_hand = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.1438 nats
    assert kl_per_pair(strong, light).item() == pytest.approx(by_hand, rel=1e-6)
    # KL is not symmetric: the strong RM's distribution weighs the log ratio.
    reverse = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert kl_per_pair(light, strong).item() == pytest.approx(reverse, rel=1e-6)
    assert reverse != pytest.approx(by_hand)


def test_kl_per_pair_is_per_row() -> None:
    strong = logits_of([0.5, 0.5], [0.9, 0.1])
    light = logits_of([0.25, 0.75], [0.9, 0.1])
    kl = kl_per_pair(strong, light)
    assert kl.shape == (2,)
    assert kl[1].item() == pytest.approx(0.0, abs=1e-7)


def test_temperature_softens_both_distributions() -> None:
    strong, light = logits_of([0.5, 0.5]), logits_of([0.25, 0.75])
    # At T = 2, softmax(log p / 2) is proportional to sqrt(p).
    q = torch.tensor([0.25, 0.75], dtype=torch.float64).sqrt()
    q = q / q.sum()
    by_hand = 0.5 * math.log(0.5 / q[0].item()) + 0.5 * math.log(0.5 / q[1].item())
    assert kl_per_pair(strong, light, temperature=2.0).item() == pytest.approx(by_hand, rel=1e-6)
    assert kl_per_pair(strong, light, 2.0) < kl_per_pair(strong, light, 1.0)
    assert kl_per_pair(strong, light, 1000.0).item() == pytest.approx(0.0, abs=1e-6)


def test_distill_loss_is_t_squared_times_the_mean_kl() -> None:
    strong = logits_of([0.5, 0.5], [0.9, 0.1])
    light = logits_of([0.25, 0.75], [0.6, 0.4])
    kl = kl_per_pair(strong, light, 2.0)
    assert distill_loss(strong, light, 2.0).item() == pytest.approx(4.0 * kl.mean().item(), rel=1e-9)


def test_gradient_pulls_the_light_distribution_towards_the_strong_one() -> None:
    # d KL(p || softmax(z)) / dz = softmax(z) - p, per row (T = 1).
    strong = logits_of([0.1, 0.2, 0.7])
    light = torch.zeros(1, 3, requires_grad=True)
    kl_per_pair(strong, light).sum().backward()
    expected = torch.tensor([[1 / 3 - 0.1, 1 / 3 - 0.2, 1 / 3 - 0.7]])
    assert torch.allclose(light.grad, expected.float(), atol=1e-6)


def test_loss_rejects_mismatched_bins_and_bad_temperature() -> None:
    with pytest.raises(ValueError, match="same shape"):
        kl_per_pair(torch.zeros(2, 11), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="temperature"):
        kl_per_pair(torch.zeros(1, 3), torch.zeros(1, 3), temperature=0.0)


def test_rank_metrics() -> None:
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    convex = [v**3 for v in x]  # same order, not a straight line
    metrics = rank_metrics(convex, x)
    assert metrics["spearman"] == pytest.approx(1.0)
    assert 0.9 < metrics["pearson"] < 1.0
    assert rank_metrics(list(reversed(x)), x)["spearman"] == pytest.approx(-1.0)
    assert math.isnan(rank_metrics([2.0] * 5, x)["spearman"])
    with pytest.raises(ValueError):
        rank_metrics([1.0], x)


def test_comparison_metric_names() -> None:
    light = {"eval": [1.0, 2.0, 3.0]}
    strong = {"eval": [1.0, 2.5, 3.0]}
    oracle = {"eval": [3.0, 2.0, 1.0]}
    metrics = comparison_metrics(light, strong, oracle)
    assert metrics["spearman/strong_eval"] == pytest.approx(1.0)
    assert metrics["spearman/oracle_eval"] == pytest.approx(-1.0)
    assert metrics["strong/spearman/oracle_eval"] == pytest.approx(-1.0)
    assert {"pearson/strong_eval", "pearson/oracle_eval", "strong/pearson/oracle_eval"} <= set(metrics)


def test_schedule_buckets_and_collate() -> None:
    cfg = DistillConfig(steps=100, warmup_steps=10, lr=1.0)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(99, cfg) == pytest.approx(0.1, abs=0.01)
    assert length_buckets([5, 1, 3, 2], 2) == [[1, 3], [2, 0]]
    ids, mask = collate([[7, 8, 9], [4]], [0, 1], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [4, 0, 0]]
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]


def test_in_length_order_returns_rows_in_the_original_order() -> None:
    prompts, responses = ["ccc", "a", "bb"], ["", "", ""]
    seen: list[list[str]] = []

    def score(p: list[str], r: list[str]) -> torch.Tensor:
        seen.append(p)
        return torch.tensor([[float(len(x))] for x in p])

    out = in_length_order(score, prompts, responses, chunk=2)
    assert out[:, 0].tolist() == [3.0, 1.0, 2.0]
    assert seen == [["a", "bb"], ["ccc"]]  # shortest first


def test_training_fits_the_strong_distributions(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    # Teacher: texts about bread score high (4.5), the others low (1.0), with some spread over bins.
    texts = [f"Q: q{i}\nA: {'bread dough flour' if i % 2 else 'tea coffee calm'} {i}" for i in range(24)]
    means = torch.tensor([4.5 if i % 2 else 1.0 for i in range(24)])
    bins = torch.linspace(0, 5, N_BINS)
    teacher = -((bins[None, :] - means[:, None]) ** 2) / 0.5  # (N, bins) logits around the mean
    model = new_reward_model(tiny_tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=1)
    cfg = DistillConfig(shape=TINY, steps=80, batch_size=8, lr=1e-2, warmup_steps=5, temperature=1.0, max_length=64)

    def kl_now() -> float:
        with torch.no_grad():
            batch = tiny_tokenizer(texts, return_tensors="pt", padding=True)
            return kl_per_pair(teacher, model(**batch).logits).mean().item()

    before = kl_now()
    losses: list[float] = []
    final = train_light(model, tiny_tokenizer, texts, teacher, cfg, on_step=lambda step, loss: losses.append(loss))
    assert len(losses) == cfg.steps and final == losses[-1]
    after = kl_now()
    assert after < before / 4
    with torch.no_grad():
        rewards = expected_reward(model(**tiny_tokenizer(texts, return_tensors="pt", padding=True)).logits)
    assert rank_metrics(rewards.tolist(), means.tolist())["spearman"] > 0.8


def test_training_refuses_other_bins(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    model = new_reward_model(tiny_tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=1)
    with pytest.raises(ValueError, match="bins"):
        train_light(model, tiny_tokenizer, ["a"], torch.zeros(1, 5), DistillConfig(steps=1))
    with pytest.raises(ValueError, match="one row"):
        train_light(model, tiny_tokenizer, ["a", "b"], torch.zeros(1, N_BINS), DistillConfig(steps=1))


# --- the CLI on tiny models (smoke runs, no zoo, no Kafka/Redis) ------------------------------------


@pytest.fixture
def tiny_strong(tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast) -> Path:
    out = tmp_path / "strong"
    new_reward_model(tiny_tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=3).save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


@pytest.fixture
def pairs_file(tmp_path: Path) -> Path:
    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"How do I bake bread {i}?", "response": f"First, check the flour. Then bake it {i}.",
             "score": (i % 6) * 0.8} for i in range(12)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_cli_distill_writes_a_light_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_strong: Path,
                                            pairs_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "light"
    code = main(["rm", "distill", "--strong", str(tiny_strong), "--no-zoo-pairs", "--data", str(pairs_file),
                 "--no-rollout-log", "--steps", "3", "--n-embd", "32", "--n-layer", "1", "--max-length", "64",
                 "--no-register", "--out", str(out), "--threads", "1"])
    assert code == 0
    info = json.loads((out / RM_INFO_FILE).read_text())
    assert info["kind"] == "light" and info["version"] == version_id("light", weights_checksum([out]))
    assert info["parent"] == describe("strong", [tiny_strong]).version
    assert {"spearman/strong_eval", "pearson/oracle_fresh"} <= set(info["metrics"])
    assert info["config"]["n_augmented"] > 0  # synonym and reorder copies by default
    light = load_reward_model(out, "cpu")
    assert light.model.config.num_labels == N_BINS and light.tokenizer.model_max_length == 64  # as trained
    assert f"light RM {info['version']}" in capsys.readouterr().out


def test_cli_train_strong_from_a_user_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_strong: Path,
                                           pairs_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "strong2"
    code = main(["rm", "train-strong", "--data", str(pairs_file), "--init", str(tiny_strong), "--steps", "2",
                 "--batch-size", "4", "--max-length", "64", "--no-pseudo-label", "--no-register", "--out", str(out),
                 "--threads", "1"])
    assert code == 0
    info = json.loads((out / RM_INFO_FILE).read_text())
    assert info["kind"] == "strong" and info["config"]["n_pairs"] == 12
    assert info["version"] == describe("strong", [out]).version
    # Serving truncates to what training read; unset numbers took the zoo's recipe.
    assert load_reward_model(out, "cpu").tokenizer.model_max_length == 64
    assert info["config"]["lr"] == ZooConfig().rm_strong_train.lr
    assert info["config"]["match_pairs"] == 0  # a user's prompts are not in the suite: no match steps by default

    code = main(["rm", "train-strong", "--data", str(pairs_file), "--init", str(tiny_strong), "--steps", "2",
                 "--match-pairs", "-1", "--no-pseudo-label", "--no-register", "--out", str(tmp_path / "strong4")])
    assert code == 2 and not (tmp_path / "strong4").exists()
    assert "--match-pairs must be at least 0" in capsys.readouterr().err

    # Reading past the init model's positions is refused before any training, and nothing is written.
    too_long = tmp_path / "strong3"
    code = main(["rm", "train-strong", "--data", str(pairs_file), "--init", str(tiny_strong), "--steps", "2",
                 "--max-length", "512", "--no-pseudo-label", "--no-register", "--out", str(too_long)])
    assert code == 2 and not too_long.exists()
    assert "--max-length 512 exceeds the 128 positions of" in capsys.readouterr().err


def test_cli_train_strong_reads_the_init_with_its_first_blocks(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_tokenizer: PreTrainedTokenizerFast, pairs_file: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    init = tmp_path / "two-blocks"
    two_blocks = new_reward_model(tiny_tokenizer, replace(TINY, n_layer=2), n_positions=128, n_bins=N_BINS, seed=3)
    two_blocks.save_pretrained(init)
    tiny_tokenizer.save_pretrained(init)
    out = tmp_path / "shallow"
    code = main(["rm", "train-strong", "--data", str(pairs_file), "--init", str(init), "--init-layers", "1",
                 "--steps", "2", "--max-length", "64", "--no-pseudo-label", "--no-register", "--out", str(out),
                 "--threads", "1"])
    assert code == 0
    assert load_reward_model(out, "cpu").model.config.n_layer == 1
    # More blocks than the init has would start the extra ones at random: refused, nothing written.
    deep = tmp_path / "deep"
    code = main(["rm", "train-strong", "--data", str(pairs_file), "--init", str(init), "--init-layers", "3",
                 "--steps", "2", "--no-pseudo-label", "--no-register", "--out", str(deep)])
    assert code == 2 and not deep.exists()
    assert "--init-layers 3 exceeds the 2 blocks" in capsys.readouterr().err
    # The light RM's init is held to the same check.
    light = tmp_path / "light"
    code = main(["rm", "distill", "--strong", str(init), "--init", str(init), "--init-layers", "3", "--no-zoo-pairs",
                 "--data", str(pairs_file), "--no-rollout-log", "--steps", "1", "--no-register", "--out", str(light)])
    assert code == 2 and not light.exists()
    assert "--init-layers 3 exceeds the 2 blocks" in capsys.readouterr().err


def test_cli_grown_strong_rm_keeps_its_student_init_and_distill_starts_from_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_strong: Path, pairs_file: Path) -> None:
    monkeypatch.setenv("STRATA_CACHE_DIR", str(tmp_path / "cache"))
    strong = tmp_path / "grown"
    code = main(["rm", "train-strong", "--data", str(pairs_file), "--init", str(tiny_strong), "--steps", "2",
                 "--widen", "2", "--grow-layers", "1", "--grow-steps", "2", "--max-length", "64",
                 "--no-pseudo-label", "--no-register", "--out", str(strong), "--threads", "1"])
    assert code == 0
    grown = load_reward_model(strong, "cpu").model.config
    assert (grown.n_embd, grown.n_layer) == (2 * TINY.n_embd, TINY.n_layer + 1)
    info = json.loads((strong / RM_INFO_FILE).read_text())
    assert info["student_init"] == STUDENT_INIT_DIR and info["grown_from"]["n_embd"] == TINY.n_embd
    assert student_init_dir(strong) == strong / STUDENT_INIT_DIR
    assert describe("strong", [strong]).checksum != describe("strong", [strong / STUDENT_INIT_DIR]).checksum

    light = tmp_path / "light"
    code = main(["rm", "distill", "--strong", str(strong), "--no-zoo-pairs", "--data", str(pairs_file),
                 "--no-rollout-log", "--augment", "none", "--steps", "2", "--max-length", "64", "--no-register",
                 "--out", str(light), "--threads", "1"])
    assert code == 0
    info = json.loads((light / RM_INFO_FILE).read_text())
    assert info["config"]["init"] == str(strong / STUDENT_INIT_DIR)
    assert info["parent"] == describe("strong", [strong]).version
    assert 0.0 <= info["metrics"]["match/light_eval"] <= 1.0
    assert load_reward_model(light, "cpu").model.config.n_embd == TINY.n_embd  # the trunk's size, not the teacher's
    # A bad init is refused before any training, naming the flag.
    code = main(["rm", "distill", "--strong", str(strong), "--no-zoo-pairs", "--data", str(pairs_file),
                 "--no-rollout-log", "--init", str(pairs_file), "--no-register", "--out", str(tmp_path / "l2")])
    assert code == 2 and not (tmp_path / "l2").exists()


def test_an_empty_answer_is_a_training_row(tmp_path: Path) -> None:
    """A real model can stop at once (SmolLM2 as Level-2 did in a demo): people score the empty answer, and the
    RM loop's data holds it."""
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"prompt": "p", "response": "r", "score": 4}\n{"prompt": "p", "response": "", "score": 0.5}\n')
    assert [row["response"] for row in read_pairs(path, need_score=True)] == ["r", ""]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("not json", "not JSON"),
        ('{"prompt": "p"}', "'response' must be a string"),
        ('{"prompt": " ", "response": "r", "score": 1}', "'prompt' must be a non-empty string"),
        ('{"prompt": "p", "response": "r", "score": 7}', "'score' must be a number in [0, 5]"),
        ('{"prompt": "p", "response": "r"}', "'score' must be a number"),
    ],
)
def test_bad_training_data_is_a_clear_error(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "p", "response": "r", "score": 1}\n' + line + "\n")
    with pytest.raises(CliError) as caught:
        read_pairs(path, need_score=True)
    assert str(caught.value).startswith(f"{path}:2: ") and problem in str(caught.value)


def test_a_missing_data_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CliError, match=r"nope\.jsonl: no such file"):
        read_pairs(tmp_path / "nope.jsonl", need_score=False)


@pytest.mark.parametrize(("options", "problem"), [
    (DistillOptions(init_layers=0), "--init-layers must be at least 1"),
    (DistillOptions(init="fresh", init_layers=2), "needs an init to take blocks from"),
])
def test_init_layers_need_an_init_and_at_least_one_block(options: DistillOptions, problem: str) -> None:
    with pytest.raises(CliError, match=problem):
        options.validate()


# --- the light RM's recipe: one for the zoo build and `strata rm distill` ---------------------------


def test_light_recipe_of_zoo_reads_every_light_field_of_the_config() -> None:
    train = TrainConfig(steps=11, batch_size=5, lr=1e-4, warmup_steps=3, weight_decay=0.05, grad_clip=0.5)
    config = with_overrides(ZooConfig(), seed=7, rm_light_temperature=1.5, rm_max_length=200, rm_light_train=train)
    recipe = LightRecipe.of_zoo(config)
    assert recipe == LightRecipe(train=train, max_length=200, temperature=1.5, seed=7)
    # All of the schedule reaches the loop (shape: not read by it).
    assert recipe.distill_config() == DistillConfig(steps=11, batch_size=5, lr=1e-4, warmup_steps=3, weight_decay=0.05,
                                                    grad_clip=0.5, temperature=1.5, max_length=200, seed=7)


def test_the_ci_zoo_distils_with_the_numbers_it_always_had() -> None:
    # The zoo's ids hash configs only: a change here would silently change the ci zoo's light RM.
    ci = PRESETS["ci"]()
    assert LightRecipe.of_zoo(ci).distill_config() == DistillConfig(
        steps=150, batch_size=32, lr=5e-4, warmup_steps=10, weight_decay=0.1, grad_clip=1.0, temperature=2.0,
        max_length=ci.rm_max_length, seed=0)


def test_fit_light_is_train_light_by_the_recipe(tiny_tokenizer: PreTrainedTokenizerFast) -> None:
    texts = [f"Q: q{i}\nA: {'bread dough' if i % 2 else 'tea'} {i}" for i in range(8)]
    teacher = torch.randn(len(texts), N_BINS, generator=torch.Generator().manual_seed(0))
    recipe = LightRecipe(TrainConfig(steps=4, batch_size=4, lr=1e-2, warmup_steps=2), max_length=64, seed=3)
    fitted, by_hand = (new_reward_model(tiny_tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=1) for _ in "ab")
    loss = fit_light(fitted, tiny_tokenizer, texts, teacher, recipe, "light", progress=False)
    assert loss == train_light(by_hand, tiny_tokenizer, texts, teacher, recipe.distill_config())
    for a, b in zip(fitted.parameters(), by_hand.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("init", "zoo", "steps", "lr", "expected"), [
    # From an init: the zoo's whole schedule (warm-up, weight decay, clip), its steps and rate unless given.
    ("strong", PRESETS["ci"](), None, None, PRESETS["ci"]().rm_light_train),
    ("strong", PRESETS["ci"](), 5, 1e-3, replace(PRESETS["ci"]().rm_light_train, steps=5, lr=1e-3)),
    ("strong", None, None, None, RM_LIGHT_TRAIN),  # no zoo read: the default zoo's schedule
    # A fresh model: its own longer, faster schedule, as before the recipe (DistillConfig's other defaults).
    ("fresh", PRESETS["ci"](), None, None, FRESH_LIGHT_TRAIN),
    ("fresh", None, 9, None, replace(FRESH_LIGHT_TRAIN, steps=9)),
])
def test_cli_members_distil_by_the_light_recipe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_strong: Path,
                                                tiny_tokenizer: PreTrainedTokenizerFast, init: str,
                                                zoo: ZooConfig | None, steps: int | None, lr: float | None,
                                                expected: TrainConfig) -> None:
    seen: list[LightRecipe] = []

    def fit_light_spy(*args: Any) -> float:  # fit_light(student, tokenizer, texts, teacher_logits, recipe, desc)
        seen.append(args[4])
        return 0.0

    monkeypatch.setattr(recipe_module, "fit_light", fit_light_spy)
    options = DistillOptions(init=str(tiny_strong) if init == "strong" else "fresh", steps=steps, lr=lr,
                             n_embd=32, n_layer=1, max_length=64, members=2, seed=4)
    strong = SimpleNamespace(tokenizer=tiny_tokenizer, zoo_info=None)
    _fit_light_members(options, None if zoo is None else SimpleNamespace(config=zoo), strong, tiny_strong, ["a"],
                       torch.zeros(1, N_BINS), tmp_path / "staging")
    assert seen == [LightRecipe(expected, max_length=64, temperature=2.0, seed=seed) for seed in (4, 5)]
    if init == "fresh" and steps is None:
        assert seen[0].distill_config() == DistillConfig(steps=700, batch_size=32, lr=3e-3, max_length=64, seed=4)
