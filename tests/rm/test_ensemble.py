"""An RM directory of several members (issue 61: a strong RM of members trained on different data), read
as one model by everything that loads an RM: its score is the members' mean, its cost their sum.

Tiny constant RMs (``rmutil.constant_rm``): each scores every pair about the score it was built with.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from rmutil import TINY

from strata.contract.checksums import weights_checksum
from strata.contract.ensemble import ENSEMBLE_FILE
from strata.errors import CliError
from strata.models.loading import ModelLoadError, load_reward_model
from strata.models.reward import score_responses
from strata_tools.cli.main import main
from strata_tools.rm.ensemble import write_ensemble
from strata_tools.rm.recipe import student_init_dir
from strata_tools.rm.train import new_reward_model
from svc_reward.config import RewardSettings
from svc_reward.models import RewardModels, ScoringOptions

PROMPTS, RESPONSES = ["Q: How do I bake bread?", "Q: Tea?"], ["A: First, check the flour.", "A: Tea is calm."]


def test_an_ensemble_scores_the_members_mean_at_their_summed_cost(make_rm: Callable[..., Path],
                                                                   tmp_path: Path) -> None:
    low, high = make_rm("low", 1.0), make_rm("high", 4.0, seed=1)
    version = write_ensemble([low, high], tmp_path / "strong")
    ensemble = load_reward_model(tmp_path / "strong", device="cpu")
    members = [load_reward_model(d, device="cpu") for d in (low, high)]
    each = [score_responses(m, PROMPTS, RESPONSES) for m in members]
    assert each[0] == [pytest.approx(1.0, abs=0.05)] * 2 and each[1] == [pytest.approx(4.0, abs=0.05)] * 2
    assert score_responses(ensemble, PROMPTS, RESPONSES) == [pytest.approx((a + b) / 2, abs=1e-4)
                                                            for a, b in zip(*each, strict=True)]
    assert ensemble.n_params == sum(m.n_params for m in members)
    # Its version is its members' weights, in order: neither member's, and another order is another RM.
    checksum = weights_checksum([tmp_path / "strong"])
    assert version == f"strong-{checksum[:12]}" and checksum == weights_checksum([low, high])
    assert weights_checksum([tmp_path / "strong"]) != weights_checksum([low])
    # A light RM distilled from it starts from its first member.
    assert student_init_dir(tmp_path / "strong") == tmp_path / "strong" / "member-0"
    assert not (tmp_path / "strong.partial").exists()


def test_the_reward_service_serves_an_ensemble_as_its_strong_rm(make_rm: Callable[..., Path], tmp_path: Path) -> None:
    write_ensemble([make_rm("low", 1.0), make_rm("high", 4.0, seed=1)], tmp_path / "strong")
    options = dataclasses.replace(ScoringOptions.of(RewardSettings()), device="cpu", dtype="float32",
                                  temperature=1.0, batch_size=8, max_length=64)
    models = RewardModels([str(make_rm("light", 3.0, seed=2))], str(tmp_path / "strong"), options)
    scores = models.score(PROMPTS, RESPONSES, strong=True)
    assert scores.rewards == [pytest.approx(2.5, abs=0.05)] * 2
    light_params = load_reward_model(tmp_path / "light", device="cpu").n_params
    # Booked at the parameters it runs: both members.
    assert {c.params for c in scores.charges} == {2 * light_params}
    assert models.strong_version == f"strong-{weights_checksum([tmp_path / 'strong'])[:12]}"


def test_a_bad_ensemble_is_refused_naming_what_to_fix(make_rm: Callable[..., Path], tmp_path: Path) -> None:
    a, b = make_rm("a", 1.0), make_rm("b", 2.0, seed=1)
    with pytest.raises(CliError, match="at least two"):
        write_ensemble([a], tmp_path / "one")
    with pytest.raises(CliError, match="not an RM directory"):
        write_ensemble([a, tmp_path], tmp_path / "bad")
    write_ensemble([a, b], tmp_path / "e")
    with pytest.raises(CliError, match="exists"):
        write_ensemble([a, b], tmp_path / "e")
    with pytest.raises(CliError, match="ensemble itself"):
        write_ensemble([tmp_path / "e", a], tmp_path / "nested")
    manifest = tmp_path / "e" / ENSEMBLE_FILE
    for members, named in (([".." + "/a", "member-1"], "subdirectory"), (["member-0"], "at least two"),
                           (["member-0", "member-9"], "member-9")):
        manifest.write_text(json.dumps({"members": members}))
        with pytest.raises(ModelLoadError, match=named):
            load_reward_model(tmp_path / "e", device="cpu")
    manifest.write_text("{not json")
    with pytest.raises(ModelLoadError, match=ENSEMBLE_FILE):
        load_reward_model(tmp_path / "e", device="cpu")


def test_members_that_score_over_other_bins_are_refused(make_rm: Callable[..., Path], tiny_tokenizer,
                                                        tmp_path: Path) -> None:
    other = tmp_path / "five-bins"
    new_reward_model(tiny_tokenizer, TINY, n_positions=128, n_bins=5, seed=3).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    write_ensemble([make_rm("a", 1.0), other], tmp_path / "mixed")
    with pytest.raises(ModelLoadError, match="different numbers of bins"):
        load_reward_model(tmp_path / "mixed", device="cpu")


def test_the_cli_writes_an_ensemble_and_says_how_to_serve_it(make_rm: Callable[..., Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "strong"
    assert main(["rm", "ensemble", "--member", str(make_rm("a", 1.0)), "--member", str(make_rm("b", 2.0, seed=1)),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"--strong-rm {out}" in printed and json.loads((out / ENSEMBLE_FILE).read_text()) == {
        "members": ["member-0", "member-1"]}
    assert main(["rm", "ensemble", "--member", str(tmp_path / "a"), "--out", str(tmp_path / "x")]) != 0
