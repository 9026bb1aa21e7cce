"""``strata bench peers``: Strata's learner and TRL's RLOO each run one update on the ci zoo's policy
(both sides for real: TRL from the `peers` extra, Strata's stack over real Kafka and Redis), and the
pieces the report is made of."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from benchargs import default_args
from safetensors.torch import load_file

from strata.config import StrataSettings
from strata.errors import CliError
from strata_tools.bench import peers, peers_strata
from strata_tools.bench.peers_strata import arm_overrides, update_seconds
from strata_tools.bench.peers_trl import ArmResult, PeersJob, group_per_update
from strata_tools.cli.main import main
from strata_tools.train import RoundStats
from strata_tools.train_summary import Change
from strata_tools.zoo.build import ZooPaths


def _args(**overrides: object) -> argparse.Namespace:
    return default_args(peers.add_arguments, **overrides)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"arms": "tiered,ppo"}, "--arms"),
    ({"n_samples": 1}, "--n-samples"),
    ({"samples_per_update": 30}, "--samples-per-update"),
    ({"eval_prompts": 1}, "--eval-prompts"),
    ({"strong_rm": Path("/no/such/rm")}, "--strong-rm"),
    ({"light_rm": Path("/no/such/rm")}, "--light-rm"),
])
def test_bad_arguments_are_refused_naming_the_flag(overrides: dict, named: str) -> None:
    with pytest.raises(CliError, match=named):
        peers.check_arguments(_args(**overrides))


def test_every_arm_is_judged_by_the_jobs_rms() -> None:
    job = PeersJob(policy_dir="p", light_rm=["light-a", "light-b"], prompts=[], directions=[], prompts_per_round=1,
                   repeat_share=0, paraphrase_share=0, updates=1, samples_per_update=2, n_samples=2,
                   minibatch_size=2, epochs=1, learning_rate=1e-4, kl_coef=0.2, clip_coef=0.2, max_grad_norm=1,
                   adam_eps=1e-8, temperature=1, top_p=1, max_new_tokens=8, rm_max_length=64, seed=0, threads=1,
                   out_dir="o", strong_rm="strong-ensemble")
    for arm in ("tiered", "level1", "conventional"):
        reward = arm_overrides(arm, job, {}).reward
        assert reward["strong_rm"] == "strong-ensemble", arm  # Level-2's and the audits' judge
        # The conventional arm is rewarded by the strong RM on every sample; the others by the light one.
        assert reward["light_rm"] == ("strong-ensemble" if arm == "conventional" else "light-a,light-b"), arm
    with pytest.raises(ValueError, match="strong_rm"):
        arm_overrides("conventional", dataclasses.replace(job, strong_rm=""), {})


def test_a_missing_trl_is_refused_with_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CliError, match=r"pip install -e '\.\[peers\]'"):
        peers.check_arguments(_args(arms="tiered,trl"))
    assert peers.check_arguments(_args(arms="tiered,level1")) == ["tiered", "level1"]  # no TRL needed


def test_the_tiered_arm_is_set_against_the_conventional_one_per_sample_used() -> None:
    # Per sample used (8 a batch): 6e10 over 2 updates = 16 samples against 1.2e11 over 1 = 8 samples.
    results = {"tiered": ArmResult("Strata tiered", param_tokens=6.0e10, updates_done=2, samples=20),
               "conventional": ArmResult("Strata conventional", param_tokens=1.2e11, updates_done=1, samples=8)}
    judged = {"tiered": peers.Judged([0.0] * 4, [2.0, 3.0, 2.5, 1.0]),
              "conventional": peers.Judged([0.0] * 4, [1.0, 3.0, 2.0, 1.5])}
    (line,) = peers.against_conventional(results, judged, 8)
    # Cost 3.75e9 / 1.5e10; oracle differences +1, 0, +.5, -.5: mean .25, SD .645, SE .645 / 2.
    assert "params x tokens per sample the learner used 0.25 of its cost" in line
    assert "tiered minus conventional +0.250 ± 0.323 (paired over 4 prompts, SE clustered by their 4 families)" in line
    # Two families of two: differences +1, 0 and +.5, -.5; residuals .75 + -.25 = .5 and .25 + -.75 = -.5;
    # SE = sqrt(2/1 * (.25 + .25)) / 4 = .25.
    (clustered,) = peers.against_conventional(results, judged, 8, ["a", "a", "b", "b"])
    assert "+0.250 ± 0.250 (paired over 4 prompts, SE clustered by their 2 families)" in clustered
    assert peers.against_conventional({"tiered": results["tiered"]}, judged, 8) == []
    assert peers.generated_per_used(results["tiered"], 8) == 20 / 16
    # Level-2's samples are booked cost, not the driver's surplus: only the policy's own count.
    assert peers.generated_per_used(ArmResult("x", updates_done=2, samples=40, trained_tier_samples=16), 8) == 1.0


def test_the_last_line_carries_the_per_used_sample_figures() -> None:
    results = {"tiered": ArmResult("Strata tiered", param_tokens=4.0e10, updates_done=2, samples=16),
               "conventional": ArmResult("Strata conventional", param_tokens=1.6e11, updates_done=2, samples=24)}
    gains = {"tiered": (Change(0.5, 0.1, 4, 2), Change(0.2, 0.05, 4, 2)),
             "conventional": (Change(0.3, 0.1, 4, 2), Change(0.1, 0.05, 4, 2))}
    job = SimpleNamespace(samples_per_update=8, updates=2)
    line = peers.last_line(results, gains, job)
    # Cost per used sample 2.5e9 against 1e10; gain per cost (0.2 / 4e10) / (0.1 / 1.6e11) = 8.
    assert "cost_per_used_sample_ratio=0.25 gain_per_cost_ratio=8.00" in line
    assert "strata_oracle_gain=+0.200 strata_oracle_gain_se=0.050" in line
    assert "hacking_gap=tiered:+0.300,conventional:+0.200 generated_per_used=tiered:1.00,conventional:1.50" in line
    gains["conventional"] = (Change(0.3, 0.1, 4, 2), Change(-0.1, 0.05, 4, 2))
    assert "gain_per_cost_ratio=nan" in peers.last_line(results, gains, job)  # no ratio to a baseline that lost


def test_several_seeds_are_summed_up_with_between_seed_errors() -> None:
    job = SimpleNamespace(samples_per_update=8, updates=2)
    runs = []
    for seed, (tiered, conventional) in enumerate([(0.3, 0.1), (0.1, 0.2), (0.2, 0.0)]):
        results = {"tiered": ArmResult("Strata tiered", update_seconds=[9.0, 2.0 + seed], param_tokens=4.0e10,
                                       updates_done=2, samples=16),
                   "conventional": ArmResult("Strata conventional", param_tokens=8.0e10, updates_done=2, samples=16)}
        gains = {"tiered": (Change(tiered + 0.4, 0.1, 4, 2), Change(tiered, 0.05, 4, 2)),
                 "conventional": (Change(conventional, 0.1, 4, 2), Change(conventional, 0.05, 4, 2))}
        judged = {"tiered": peers.Judged([0.0] * 2, [2.0 + tiered, 2.0 + tiered]),
                  "conventional": peers.Judged([0.0] * 2, [2.0 + conventional, 2.0 + conventional])}
        runs.append(peers.SeedRun(seed, job, results, gains, judged, ["a", "b"]))
    line = peers.seeds_line(runs)
    # Tiered oracle gains .3, .1, .2: mean .2, SD .1, SE .1 / sqrt(3) = .058; minus conventional's .1, .2, 0:
    # .2, -.1, .2: mean .1, SD .173, SE .1.
    assert "peers seeds=3 strata_s_per_update=3.00" in line
    assert "strata_oracle_gain=+0.200 strata_oracle_gain_se=0.058" in line
    assert "tiered_minus_conventional=+0.100 tiered_minus_conventional_se=0.100 cost_per_used_sample_ratio=0.50" in line
    assert "hacking_gap=tiered:+0.400,conventional:+0.000" in line
    # Gains .2 and .1 at half the cost per used sample: 2 / 0.5 = 4 times the gain per cost.
    assert "cost_per_used_sample_ratio=0.50 gain_per_cost_ratio=4.00" in line
    assert "generated_per_used=tiered:1.00,conventional:1.00" in line and "tiered_l1" not in line
    summary = "\n".join(peers.over_seeds(runs))
    assert "tiered         oracle gain +0.200 ± 0.058 (per seed +0.300, +0.100, +0.200)" in summary


def test_several_seeds_weigh_training_on_level2_and_keep_the_worst_surplus() -> None:
    job = SimpleNamespace(samples_per_update=8, updates=2)
    runs = []
    for seed, (level1_only, both, generated) in enumerate([(0.3, 0.2, 16), (0.1, 0.2, 20), (0.2, 0.0, 16)]):
        results = {"tiered-l1": ArmResult("Strata tiered-l1", param_tokens=4.0e10, updates_done=2,
                                          samples=generated, critical_path={"training": 5.0, "driver": 6.0 - 2 * seed}),
                   "tiered": ArmResult("Strata tiered", param_tokens=2.0e10, updates_done=2, samples=24,
                                       trained_tier_samples=16, critical_path={"training": 5.0}),
                   "conventional": ArmResult("Strata conventional", param_tokens=8.0e10, updates_done=2, samples=16)}
        gains = {"tiered-l1": (Change(level1_only, 0.1, 4, 2), Change(level1_only, 0.05, 4, 2)),
                 "tiered": (Change(both, 0.1, 4, 2), Change(both, 0.05, 4, 2)),
                 "conventional": (Change(0.1, 0.1, 4, 2), Change(0.1, 0.05, 4, 2))}
        judged = {"tiered-l1": peers.Judged([0.0] * 2, [2.0 + level1_only] * 2),
                  "tiered": peers.Judged([0.0] * 2, [2.0 + both] * 2),
                  "conventional": peers.Judged([0.0] * 2, [2.1] * 2)}
        runs.append(peers.SeedRun(seed, job, results, gains, judged, ["a", "b"]))
    line = peers.seeds_line(runs)
    # tiered minus tiered-l1: -.1, +.1, -.2: mean -.067, SD .153, SE .088.
    assert "tiered_minus_tiered_l1=-0.067 tiered_minus_tiered_l1_se=0.088" in line
    # Seed 1's tiered-l1 arm generated 20 for 16 used; tiered trains on both tiers' 16 of its 24.
    assert "generated_per_used=tiered-l1:1.25,tiered:1.00,conventional:1.00" in line
    # The driver was largest in seed 0 only, training in seeds 1 and 2.
    assert line.endswith("critical_path=tiered-l1:training,tiered:training")
    summary = "\n".join(peers.over_seeds(runs))
    assert "(tiered minus tiered-l1), held-out oracle -0.067 ± 0.088" in summary
    assert "tiered-l1 cost per used sample 0.50 ± 0.00 of the conventional arm's" in summary


def test_several_seeds_weigh_the_overlap() -> None:
    job = SimpleNamespace(samples_per_update=8, updates=2)
    runs = []
    for seed, (overlapped, sequential, seconds) in enumerate([(0.1, 0.2, 3.0), (0.2, 0.2, 4.5), (0.3, 0.1, 3.0)]):
        results = {"tiered": ArmResult("Strata tiered", update_seconds=[9.0, 2.0]),
                   "tiered-sequential": ArmResult("Strata tiered-sequential", update_seconds=[9.0, seconds])}
        gains = {"tiered": (Change(overlapped, 0.1, 4, 2), Change(overlapped, 0.05, 4, 2)),
                 "tiered-sequential": (Change(sequential, 0.1, 4, 2), Change(sequential, 0.05, 4, 2))}
        judged = {"tiered": peers.Judged([0.0] * 2, [2.0 + overlapped] * 2),
                  "tiered-sequential": peers.Judged([0.0] * 2, [2.0 + sequential] * 2)}
        runs.append(peers.SeedRun(seed, job, results, gains, judged, ["a", "b"]))
    line = peers.seeds_line(runs)
    # Differences -.1, 0, +.2: mean .033, SD .153, SE .088; speed-ups 1.5, 2.25, 1.5: mean 1.75, SE .25.
    assert "tiered_minus_sequential=+0.033 tiered_minus_sequential_se=0.088" in line
    assert " overlap_speedup=1.75" in line
    summary = "\n".join(peers.over_seeds(runs))
    assert "overlap (tiered against tiered-sequential): 1.75 ± 0.25 times as fast an update; held-out oracle, " \
           "tiered minus sequential +0.033 ± 0.088" in summary


def test_the_overlapped_arm_is_set_against_the_sequential_one() -> None:
    results = {"tiered": ArmResult("Strata tiered", update_seconds=[9.0, 2.0, 2.0]),
               "tiered-sequential": ArmResult("Strata tiered-sequential", update_seconds=[9.0, 3.0, 3.0])}
    judged = {"tiered": peers.Judged([0.0] * 2, [2.0, 3.0]), "tiered-sequential": peers.Judged([0.0] * 2, [2.5, 2.5])}
    (line,) = peers.against_sequential(results, judged)
    assert "2.00 s an update against 3.00 (1.50x as fast)" in line
    assert "tiered minus sequential +0.000 ± 0.500 (paired over 2 prompts" in line
    assert peers.against_sequential({"tiered": results["tiered"]}, judged) == []
    gains = {arm: (Change(0.0, 0.1, 2, 2), Change(0.0, 0.1, 2, 2)) for arm in results}
    assert " overlap_speedup=1.50" in peers.last_line(results, gains, SimpleNamespace(samples_per_update=8, updates=2))
    # The sequential arm keeps one learner batch in flight (the driver waits for each update), the others two.
    job = SimpleNamespace(updates=2, prompts_per_round=8, n_samples=2, seed=0, repeat_share=0.0,
                          paraphrase_share=0.0, samples_per_update=8)
    assert peers_strata.train_options("tiered-sequential", job, Path("w")).max_batches_ahead == 1
    assert peers_strata.train_options("tiered", job, Path("w")).max_batches_ahead == 2
    assert "tiered-sequential" not in peers.DEFAULT_ARMS and "tiered-sequential" in peers.ARMS


def test_stratas_seconds_per_update_are_set_over_trls() -> None:
    assert peers.over_trl({"tiered": 6.0, "level1": 2.0, "trl": 4.0}) == " plain_over_trl=0.50 tiered_over_trl=1.50"
    assert peers.over_trl({"tiered": 6.0, "trl": 4.0}) == " tiered_over_trl=1.50"
    assert peers.over_trl({"tiered": 6.0}) == "" and peers.over_trl({"tiered": 6.0, "trl": float("nan")}) == ""


def test_the_cpu_each_process_spent_puts_a_floor_under_an_update(monkeypatch: pytest.MonkeyPatch) -> None:
    strata = ArmResult("Strata tiered", update_seconds=[9.0, 5.0], updates_done=4,
                       cpu_seconds={"learner": 24.0, "generator": 8.0, "driver": 2.0})
    trl = ArmResult("TRL", update_seconds=[4.0, 4.0, 4.0, 4.0], cpu_seconds={"trl": 20.0})
    # Per update: learner 6, generator 2, driver .5 (over the 4 updates done); TRL 20 over its 4 updates.
    assert strata.cpu_per_update == {"learner": 6.0, "generator": 2.0, "driver": 0.5}
    assert peers.cpu_floor(strata, 2) == 4.25 and peers.cpu_floor(trl, 2) == 2.5
    assert peers.cpu_line(strata, 2) == ("CPU seconds per update: learner 6.00, generator 2.00, driver 0.50; "
                                         "8.50 in all: on 2 cores no update under 4.25 s")
    assert math.isnan(peers.cpu_floor(ArmResult("no cpu"), 2))
    monkeypatch.setattr(peers, "cores_here", lambda: 2)
    gains = {arm: (Change(0.0, 0.1, 2, 2), Change(0.0, 0.1, 2, 2)) for arm in ("tiered", "trl")}
    line = peers.last_line({"tiered": strata, "trl": trl}, gains, SimpleNamespace(samples_per_update=8, updates=4))
    assert " cpu_floor=tiered:4.25,trl:2.50" in line


def test_rounds_are_shared_by_the_updates_they_complete() -> None:
    rounds = [RoundStats(0, 0, 8, {}, 8, 8, 2.0, None, 4.0),   # no update yet
              RoundStats(1, 2, 8, {}, 8, 8, 2.0, None, 2.0),   # two updates: 6 s between them
              RoundStats(2, 3, 8, {}, 8, 8, 2.0, None, 5.0)]
    assert update_seconds(rounds, 0) == [3.0, 3.0, 5.0]
    assert group_per_update([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [3.0, 7.0]  # a partial update is left out


def test_the_first_update_is_left_out_as_warm_up() -> None:
    arm = ArmResult("x", update_seconds=[30.0, 2.0, 4.0], generation_seconds=[9.0], samples=72, train_seconds=36.0)
    assert arm.seconds_per_update() == 3.0
    assert arm.generation_share == pytest.approx(0.25) and arm.samples_per_second == pytest.approx(2.0)
    assert ArmResult("one", update_seconds=[5.0]).seconds_per_update() == 5.0  # nothing else to take


@pytest.mark.integration
@pytest.mark.slow
def test_both_sides_train_one_update_and_the_last_line_parses(
    zoo: ZooPaths, infra: StrataSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("trl", reason="the `peers` extra (make setup installs it)")
    monkeypatch.setenv("STRATA_ZOO_PRESET", zoo.config.preset)
    monkeypatch.setenv("STRATA_CACHE_DIR", str(zoo.root.parent.parent))
    # The Strata arm's process uses the session's Kafka and Redis instead of starting its own.
    monkeypatch.setenv("STRATA_KAFKA_BOOTSTRAP", infra.kafka_address)
    monkeypatch.setenv("STRATA_REDIS_URL", infra.redis_address)
    code = main(["bench", "peers", "--arms", "tiered,tiered-l1,conventional,trl", "--updates", "1",
                 "--samples-per-update", "8", "--minibatch-size", "4", "--epochs", "1", "--eval-prompts", "4",
                 "--threads", "1", "--project-as", "deployment", "--work-dir", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    start = load_file(str(zoo.policy / "model.safetensors"))
    for arm in ("tiered", "tiered-l1", "conventional", "trl"):
        result = ArmResult.read(tmp_path / arm / "result.json")
        assert len(result.update_seconds) == 1 and result.update_seconds[0] > 0, arm
        assert result.samples >= 8 and result.param_tokens > 0 and result.peak_rss_mb > 0, arm
        trained = load_file(str(Path(result.policy_dir) / "model.safetensors"))
        assert any(not trained[name].equal(start[name]) for name in start if name in trained), f"{arm}: no update"
        # Each process's CPU over the training: every Strata service apart (one process each), TRL's own.
        expected = {"trl"} if arm == "trl" else {"scheduler", "probe", "generator", "generator_l2", "reward",
                                                  "learner", "driver"}
        assert set(result.cpu_seconds) == expected and result.cpu_seconds["trl" if arm == "trl" else "learner"] > 0, arm
        # What the projection prices: the ledger's stages of a Strata arm, with the sizes they ran at.
        assert (result.ledger_stages == []) == (arm == "trl"), arm
        assert all(s["params"] > 0 for s in result.ledger_stages if s["stage"] == "generate"), arm
    heading = re.compile(r"  (\S+): \d+ samples, \d+ tokens trained per update")
    projected = [m.group(1) for line in out.splitlines() if (m := heading.fullmatch(line))]
    assert "projection at deployment sizes" in out and projected == ["tiered", "tiered-l1", "conventional"], out
    assert len(re.findall(r"sequential \d+\.\d\d s, overlapped \d+\.\d\d s", out)) == 6, out  # two batches each
    assert "tiered against conventional (strong RM on every sample)" in out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"peers strata_s_per_update=\d+\.\d\d trl_s_per_update=\d+\.\d\d ratio=\d+\.\d\d "
                        r"strata_oracle_gain=[+-]\d\.\d{3} strata_oracle_gain_se=\d+\.\d{3} "
                        r"trl_oracle_gain=[+-]\d\.\d{3} cost_per_used_sample_ratio=\d+\.\d\d "
                        r"gain_per_cost_ratio=(\S+) hacking_gap=\S+ generated_per_used=tiered:\d+\.\d\d,"
                        r"tiered-l1:\d+\.\d\d,conventional:\d+\.\d\d,trl:1\.00 tiered_over_trl=\d+\.\d\d"
                        r" cpu_floor=tiered:\d+\.\d\d,tiered-l1:\d+\.\d\d,conventional:\d+\.\d\d,trl:\d+\.\d\d"
                        r"( critical_path=\S+)?", last), last
