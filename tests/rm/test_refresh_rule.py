"""A refresh turn refits the escalation rule for its candidate light RM when the version in service has one
(``strata_tools.rm.rule_refit``): on people's labels of held-out Level-1 answers, with the signals the reward
worker kept for each, re-scored by the candidate; bound to the candidate's weights. Tiny RMs, no zoo; the kept
signals are given as the reward worker would have stored them."""

from __future__ import annotations

import dataclasses as dc
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rmutil import N_BINS, TINY
from transformers import PreTrainedTokenizerFast

from strata.contract.checksums import weights_checksum
from strata.hashing import content_hash
from strata_tools.rm.rule_refit import FIT_FEATURES, RefitRows, RuleSpec, carry_rule, refit
from strata_tools.rm.train import new_reward_model
from svc_reward.calibration_store import read_rule, write_rule
from svc_reward.escalation_rule import EscalationRule
from svc_reward.models import served_rule
from svc_reward.registry import describe
from svc_reward.signals_store import StoredSignals


def varied_rm(tmp_path: Path, tokenizer: PreTrainedTokenizerFast) -> Path:
    out = tmp_path / "candidate"
    new_reward_model(tokenizer, TINY, n_positions=128, n_bins=N_BINS, seed=7).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def with_rule(model_dir: Path, bad_threshold: float = 2.0) -> Path:
    """A rule in service on the light score and the generator's confidence, fitted for ``model_dir``."""
    write_rule(model_dir, EscalationRule(("light", "logprob_mean"), (3.0, -1.0), (1.0, 0.5), (-1.0, -1.0), -1.5,
                                         0.3, 0.9, weights_checksum([str(model_dir)]),
                                         {"bad_threshold": bad_threshold, "l2": 1.0}))
    return model_dir


def labelled(n: int, seed: int = 0) -> tuple[list[dict[str, object]], dict[str, StoredSignals]]:
    """``n`` Level-1 answers to n/3 prompts; the bad ones (a person scored them 1) are those the generator was
    unsure of, which the candidate's score (a random tiny RM) does not see."""
    rng = random.Random(seed)
    rows, kept = [], {}
    for i in range(n):
        bad = rng.random() < 0.3
        response = f"A: answer {i} about the tide and the moon{' and the moon' * (i % 3)}."
        rows.append({"prompt": f"Q: question {i // 3} about tides?", "response": response,
                     "score": 1.0 if bad else 4.0, "source": "human"})
        kept[content_hash(response)] = StoredSignals(
            (-2.5 if bad else -0.6) + rng.gauss(0, 0.3), -6.0, 20 + i % 7, 64, None, 0.0, 2)
    return rows, kept


def reader(kept: Mapping[str, StoredSignals]) -> Callable[[Sequence[str]], Mapping[str, StoredSignals]]:
    return lambda hashes: {h: kept[h] for h in hashes if h in kept}


def test_the_candidate_gets_a_rule_refitted_on_peoples_labels_and_bound_to_its_weights(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    current = with_rule(make_rm("current", 3.0))
    candidate_dir = varied_rm(tmp_path, tiny_tokenizer)
    candidate = describe("light", [candidate_dir])
    rows, kept = labelled(90)
    rows.append({"prompt": "Q: a Level-2 answer's label", "response": "A: no signals kept", "score": 1.0})
    said: list[str] = []
    text = carry_rule([current], candidate, rows, reader(kept), min_answers=40, min_bad=8, progress=said.append)

    n_bad = sum(1 for r in rows[:90] if r["score"] == 1.0)
    assert text.startswith(f"refitted on 90 held-out Level-1 answers ({n_bad} bad under 2)")  # the row without
    rule = served_rule([str(candidate_dir)])  # signals left out; the line the rule in service was fitted with
    assert rule is not None and rule.checksum == weights_checksum([str(candidate_dir)])
    assert set(rule.features) <= {"light", "logprob_mean"} and "logprob_mean" in rule.features
    assert rule.weights[rule.features.index("logprob_mean")] < 0  # unsure answers are the bad ones here
    assert rule.fitted["labels"] == "people" and rule.fitted["answers"] == 90
    assert rule.fitted["combined_auc"] > 0.9  # out of fold, by prompt
    assert rule.target_catch == 0.9
    unsure = {"light": 3.0, "logprob_mean": -2.5}
    sure = {"light": 3.0, "logprob_mean": -0.6}
    assert rule.escalates(unsure) and not rule.escalates(sure)
    assert said and candidate.version in said[0]
    assert served_rule([str(current)]) is not None  # the rule in service is left as it was
    # A lower target catch, given: the threshold rises (fewer escalations), the rest as before.
    text = carry_rule([current], candidate, rows, reader(kept), min_answers=40, min_bad=8, target_catch=0.6,
                      progress=lambda line: None)
    lower = served_rule([str(candidate_dir)])
    assert lower is not None and lower.target_catch == 0.6 and "for a 60% catch" in text
    assert lower.threshold >= rule.threshold and lower.features == rule.features


def test_too_few_labels_leave_the_candidate_without_a_rule_and_say_so(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    current = with_rule(make_rm("current", 3.0))
    candidate_dir = varied_rm(tmp_path, tiny_tokenizer)
    rows, kept = labelled(30)
    text = carry_rule([current], describe("light", [candidate_dir]), rows, reader(kept), min_answers=40, min_bad=8,
                      progress=lambda line: None)
    assert text.startswith("not refitted: 30 labelled Level-1 answers with kept signals held out")
    assert "rule_min_answers" in text and read_rule(candidate_dir) is None
    # Expired signals count as none.
    text = carry_rule([current], describe("light", [candidate_dir]), labelled(90)[0], reader({}), min_answers=40,
                      min_bad=8, progress=lambda line: None)
    assert text.startswith("not refitted: 0 labelled") and read_rule(candidate_dir) is None


def test_nothing_is_refitted_when_the_version_in_service_has_no_rule(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    candidate_dir = varied_rm(tmp_path, tiny_tokenizer)
    rows, kept = labelled(90)
    assert carry_rule([make_rm("current", 3.0)], describe("light", [candidate_dir]), rows, reader(kept),
                      min_answers=40, min_bad=8, progress=lambda line: None) == ""
    assert read_rule(candidate_dir) is None


def test_a_rule_whose_signals_are_constant_on_the_labels_is_not_refitted() -> None:
    spec = RuleSpec.of(EscalationRule(("record_bad",), (0.2,), (0.1,), (1.0,), 0.0, 0.5, 0.9))
    rows = RefitRows([{"record_bad": 0.2, "light": i / 50} for i in range(50)], [i % 4 == 0 for i in range(50)],
                     [str(i // 2) for i in range(50)])
    result = refit(spec, rows, min_answers=40, min_bad=8)
    assert isinstance(result, str) and "constant" in result
    assert isinstance(refit(spec, RefitRows(rows.features, [True] * 50, rows.groups), 40, 8), str)  # all bad


def test_a_rule_that_ranks_no_better_than_the_light_score_is_not_served() -> None:
    """Out of fold, on the same labels: a rule on the light score alone ranks exactly as the score does, and a
    rule on a signal that says nothing ranks worse; either way the threshold should decide."""
    rng = random.Random(3)
    light = [rng.gauss(3.0, 1.0) for _ in range(120)]
    bad = [x + rng.gauss(0, 0.8) < 2.3 for x in light]
    groups = [str(i // 2) for i in range(120)]
    alone = refit(RuleSpec(("light",), 0.9, 1.0, 1.5), RefitRows([{"light": x} for x in light], bad, groups), 40, 8)
    assert isinstance(alone, str) and "no better than the light score alone" in alone
    noise = RefitRows([{"light": x, "repetition": rng.random()} for x in light], bad, groups)
    assert isinstance(refit(RuleSpec(("repetition",), 0.9, 1.0, 1.5), noise, 40, 8), str)
    # A signal that carries what the score lacks passes.
    carried = RefitRows([{"light": x, "logprob_mean": -2.5 if b else -0.6} for x, b in zip(light, bad, strict=True)],
                        bad, groups)
    fitted = refit(RuleSpec(("light", "logprob_mean"), 0.9, 1.0, 1.5), carried, 40, 8)
    assert not isinstance(fitted, str) and fitted[1].combined_auc > fitted[1].light_auc


def test_with_fit_rule_a_first_rule_is_fitted_on_the_score_and_the_record(
        make_rm: Callable[..., Path], tiny_tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    """No rule in service: ``fit_rule`` fits one on the light score and the neighbourhood's record from people's
    labels; here the bad answers come from neighbourhoods people found bad before."""
    candidate_dir = varied_rm(tmp_path, tiny_tokenizer)
    rows, kept = labelled(120, seed=4)
    kept = {h: dc.replace(k, record_labelled=10.0, record_bad=8.0 if k.logprob_mean < -1.5 else 1.0)
            for h, k in kept.items()}
    said: list[str] = []
    text = carry_rule([make_rm("current", 3.0)], describe("light", [candidate_dir]), rows, reader(kept),
                      min_answers=40, min_bad=8, fit_new=True, progress=said.append)
    assert text.startswith("fitted on 120 held-out Level-1 answers") and "bad under 1.5" in text
    rule = served_rule([str(candidate_dir)])
    assert rule is not None and rule.features == FIT_FEATURES and rule.fitted["labels"] == "people"
    assert rule.fitted["combined_auc"] > rule.fitted["light_auc"]


def test_a_turn_that_cannot_read_the_kept_signals_says_so_and_fits_nothing() -> None:
    from types import SimpleNamespace

    from strata_tools.rm.loop import _kept_signals

    said: list[str] = []
    settings = SimpleNamespace(redis_address="redis://127.0.0.1:1/0", redis_address_masked="redis://127.0.0.1:1/0")
    assert _kept_signals(settings, ["a" * 64], said.append) == {}
    assert said and said[0].startswith("could not read the kept escalation signals from Redis (redis://127.0.0.1:1/0)")
