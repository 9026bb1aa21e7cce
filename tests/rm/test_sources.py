"""What each kind of RM data adds (strata_tools.rm.sources): the rules, and one small run on the ci zoo."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from strata_tools.cli.main import main
from strata_tools.rm.onpolicy import PolicyAnswer
from strata_tools.rm.sources import (
    EXTRA_ARMS,
    REPORT_DIR,
    SourcesOptions,
    best_of_n,
    level1_gain,
    newest_policy_checkpoint,
)
from strata_tools.zoo.build import ZooPaths


def test_best_of_n_takes_the_draw_the_rm_rates_highest_per_prompt_and_the_first_of_equals() -> None:
    rewards = [[1.0, 3.0, 2.0], [2.0, 1.0, 2.0], [0.5, 3.0, 1.0]]  # rewards[draw][prompt]
    assert best_of_n(rewards) == [1, 0, 0]
    with pytest.raises(ValueError, match="one reward per prompt"):
        best_of_n([[1.0, 2.0], [1.0]])
    with pytest.raises(ValueError):
        best_of_n([])


def answers(oracle: list[float], tier: str = "level1") -> list[PolicyAnswer]:
    return [PolicyAnswer(f"p{i}", f"prompt {i}", tier, f"answer {i}", (), score) for i, score in enumerate(oracle)]


def test_the_gain_is_level1_spearman_over_the_base_arm_on_the_same_answers() -> None:
    oracle = [0.5, 1.0, 2.0, 2.5, 3.0, 4.0, 4.5, 1.5, 3.5, 0.0]
    judged = answers(oracle) + answers([5.0 - x for x in oracle], "level2")  # Level-2 answers do not count
    perfect = oracle + oracle
    reversed_ = [-x for x in oracle] + oracle
    gain, se = level1_gain(perfect, reversed_, judged, 200, 0)
    assert gain == pytest.approx(2.0)
    assert se == pytest.approx(0.0, abs=1e-9)
    gain, _ = level1_gain(perfect, perfect, judged, 200, 0)
    assert gain == 0.0


def test_options_name_unknown_or_repeated_sources_and_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SourcesOptions().arms == EXTRA_ARMS
    with pytest.raises(ValidationError, match="unknown source"):
        SourcesOptions(arms=("samples", "rlhf"))
    with pytest.raises(ValidationError, match="named twice"):
        SourcesOptions(arms=("samples", "samples"))
    with pytest.raises(ValidationError):
        SourcesOptions(best_of=1)
    monkeypatch.setenv("STRATA_RM_SOURCES_PROMPTS", "40")
    assert SourcesOptions().prompts == 40


def write_checkpoint(root: Path, version: int, initial_policy: Path) -> Path:
    path = root / f"v{version}"
    path.mkdir(parents=True)
    (path / "learner_config.json").write_text(json.dumps({"initial_policy": str(initial_policy)}))
    (path / "strata_checkpoint.json").write_text("{}")
    return path


def test_the_newest_checkpoint_is_taken_only_from_a_ppo_run_that_started_from_this_zoos_policy(
        tmp_path: Path) -> None:
    ours, theirs = tmp_path / "zoo-a" / "level1", tmp_path / "zoo-b" / "level1"
    root = tmp_path / "checkpoints"
    assert newest_policy_checkpoint(root, ours) is None  # no learner ran
    write_checkpoint(root, 3, ours)
    v4 = write_checkpoint(root, 4, ours)
    write_checkpoint(root, 12, theirs)
    (root / "v13").mkdir()  # half-written: no metadata
    assert newest_policy_checkpoint(root, ours) == v4
    assert newest_policy_checkpoint(root, tmp_path / "zoo-c" / "level1") is None


@pytest.mark.integration
def test_a_small_sources_run_on_the_ci_zoo_judges_every_arm_and_says_why_one_was_skipped(
        zoo: ZooPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        one_torch_thread: None) -> None:
    monkeypatch.setenv("STRATA_ZOO_PRESET", zoo.config.preset)
    monkeypatch.setenv("STRATA_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("STRATA_CHECKPOINT_DIR", str(tmp_path / "no-learner-ran"))
    assert main(["rm", "sources", "--prompts", "12", "--eval-prompts", "24", "--best-of", "2", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(r"rm_sources base_l1=-?\d\.\d{3} samples=[+-]\d\.\d{3}±\d\.\d{3} best_of_n=[+-]\d\.\d{3}±"
                        r"\d\.\d{3} perturbed=[+-]\d\.\d{3}±\d\.\d{3} policy_checkpoint=skipped", last), last
    assert "policy_checkpoint  skipped: no learner checkpoint started from" in out
    (report_file,) = (tmp_path / "state" / REPORT_DIR).glob(f"{zoo.root.name}-*.json")
    report = json.loads(report_file.read_text())
    arms = {arm["arm"]: arm for arm in report["arms"]}
    assert list(arms) == ["none", "base", "samples", "best_of_n", "perturbed"]
    # One Level-1 and one Level-2 answer per prompt live Level-1 would answer (the probe not cautious).
    answered = arms["base"]["n_labels"] // 2
    assert arms["base"]["n_labels"] == 2 * answered and 0 < answered <= 12
    assert arms["samples"]["n_added"] == arms["best_of_n"]["n_added"] == answered
    assert 0 < arms["perturbed"]["n_added"] <= answered
    for name in ("samples", "best_of_n", "perturbed"):
        assert arms[name]["n_labels"] == 2 * answered + arms[name]["n_added"]
        n_level1 = arms[name]["figures"]["n_level1"]
        assert n_level1 == arms[name]["figures"]["n_level2"] and 0 < n_level1 <= 24
    # The light RM's pick out of two draws, the first being the control's, is rated at least as high.
    assert arms["best_of_n"]["added_light"] >= arms["samples"]["added_light"]
