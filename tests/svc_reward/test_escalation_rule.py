"""The learned escalation rule (issue 61): features, fit, threshold, storage and what each signal buys."""

from __future__ import annotations

import random

import pytest

from svc_reward.escalation_rule import (
    EscalationRule,
    Signals,
    auc,
    evaluate_rule,
    features,
    fit_rule,
    form,
    threshold_for_catch,
)


def test_auc_counts_ties_half() -> None:
    assert auc([3, 2, 1], [True, False, False]) == 1.0
    assert auc([1, 1], [True, False]) == 0.5
    assert auc([1, 2, 3, 4], [False, True, False, True]) == 0.75
    assert auc([1, 2], [True, True]) is None


def test_form_and_features() -> None:
    assert form("a b c a b c a b c") == (pytest.approx(1 - 3 / 7), pytest.approx(3 / 9))
    assert form("") == (0.0, 0.0)
    values = features(Signals(2.5, 0.1, -1.2, -6.0, 96, 96, "the same the same the same"))
    assert values["hit_limit"] == 1.0 and values["logprob_min"] == -6.0 and values["light"] == 2.5
    assert features(Signals(2.5, 0.0, None, None, 10, 0, "x"))["logprob_mean"] is None


def constructed(n: int = 600, seed: int = 0) -> tuple[list[dict], list[bool], list[int]]:
    """Bad answers: a light score that overlaps the good ones, and a least-likely token that says more."""
    rng = random.Random(seed)
    rows, bad, groups = [], [], []
    for i in range(n):
        is_bad = rng.random() < 0.2
        light = rng.gauss(2.0 if is_bad else 2.8, 0.6)
        low = rng.gauss(-7.0 if is_bad else -4.0, 1.2)
        rows.append(features(Signals(light, 0.0, low / 3, low, rng.randrange(5, 90), 96,
                                     " ".join(rng.choice("abcdefgh") for _ in range(12)))))
        bad.append(is_bad)
        groups.append(i // 6)  # families of six
    return rows, bad, groups


def test_the_rule_learns_a_signal_the_score_lacks_and_keeps_its_catch() -> None:
    rows, bad, groups = constructed()
    rule = fit_rule(rows, bad, target_catch=0.9)
    probabilities = [rule.probability(r) for r in rows]
    caught = sum(p >= rule.threshold for p, b in zip(probabilities, bad, strict=True) if b) / sum(bad)
    assert caught >= 0.9
    assert "spread" not in rule.features  # constant here: left out
    w = dict(zip(rule.features, rule.weights, strict=True))
    assert w["logprob_min"] < 0 and w["light"] < 0  # lower is worse, learned, not assumed
    report = evaluate_rule(rows, bad, groups, target_catch=0.9)
    assert report.combined_auc is not None and report.light_auc is not None
    assert report.combined_auc > report.light_auc + 0.05
    assert report.combined_escalated is not None and report.light_escalated is not None
    assert report.combined_escalated < report.light_escalated
    assert report.single["logprob_min"] > report.single["repetition"]


def test_a_missing_signal_leaves_the_decision_to_the_threshold() -> None:
    rows, bad, _ = constructed(200)
    rule = fit_rule(rows, bad, target_catch=0.9)
    lacking = dict(rows[0], logprob_min=None)
    assert rule.probability(lacking) is None and rule.escalates(lacking) is None


def test_a_rule_round_trips_and_bad_files_name_the_problem() -> None:
    rows, bad, _ = constructed(200)
    rule = fit_rule(rows, bad, target_catch=0.8)
    again = EscalationRule.from_dict(rule.to_dict())
    assert again == rule and again.probability(rows[3]) == rule.probability(rows[3])
    with pytest.raises(ValueError, match="missing or malformed"):
        EscalationRule.from_dict({"features": ["light"]})
    broken = dict(rule.to_dict(), features=["light", "mood", *rule.features[2:]])
    with pytest.raises(ValueError, match="unknown features"):
        EscalationRule.from_dict(broken)


def test_threshold_for_catch_and_labels_without_both_kinds() -> None:
    assert threshold_for_catch([0.9, 0.8, 0.1, 0.7], [True, True, False, True], 2 / 3) == 0.8
    with pytest.raises(ValueError, match="good and bad"):
        fit_rule([{"light": 1.0}], [True], 0.9)


def test_the_rules_verdict_replaces_the_threshold_where_it_judged() -> None:
    from svc_reward.decide import RuleVerdict, decide

    high, low = 4.0, 1.0  # the threshold (3.2) would pass the first and escalate the second
    escalate = decide(1, high, caution=False, threshold=3.2, rule=RuleVerdict(True, 0.61, 0.3))
    assert escalate.escalate and not escalate.final and "P(bad) 0.610 >= 0.300" in escalate.reason
    passed = decide(1, low, caution=False, threshold=3.2, rule=RuleVerdict(False, 0.1, 0.3))
    assert passed.final and not passed.escalate and "P(bad) 0.100 < 0.300" in passed.reason
    # Unsafe advice and caution still escalate whatever the rule says; no verdict: the threshold decides.
    assert decide(1, high, caution=False, threshold=3.2, unsafe=True, rule=RuleVerdict(False, 0.1, 0.3)).escalate
    assert decide(1, high, caution=True, threshold=3.2, rule=RuleVerdict(False, 0.1, 0.3)).escalate
    assert decide(1, low, caution=False, threshold=3.2, rule=None).escalate


def test_the_worker_reads_the_signals_from_the_event() -> None:
    from strata.v1 import common_pb2, events_pb2
    from svc_reward.worker import rule_verdict

    rows, bad, _ = constructed(300)
    rule = fit_rule(rows, bad, target_catch=0.9)
    event = events_pb2.RolloutGenerated(tier=common_pb2.TIER_LEVEL_1, response_tokens=40,
                                        sampling=common_pb2.SamplingParams(max_new_tokens=96))
    assert rule_verdict(rule, event, 2.5, 0.0, "an answer") is None  # no log-probabilities: the threshold decides
    event.response_logprob_mean, event.response_logprob_min = -3.0, -9.0
    verdict = rule_verdict(rule, event, 2.5, 0.0, "an answer of a few words")
    assert verdict is not None and verdict.escalate  # a very unlikely token: bad in this construction
    event.response_logprob_mean, event.response_logprob_min = -0.7, -2.0
    assert not rule_verdict(rule, event, 3.6, 0.0, "an answer of a few words").escalate
    assert rule_verdict(None, event, 2.5, 0.0, "x") is None


def test_forward_selection_keeps_the_signal_that_carries_and_leaves_noise_out() -> None:
    from svc_reward.escalation_rule import select_features

    rows, bad, groups = constructed()
    chosen, steps = select_features(rows, bad, groups, target_catch=0.9)
    assert chosen[:2] == ["light", "logprob_min"] or chosen[:2] == ["light", "logprob_mean"]
    assert "repetition" not in chosen and "distinct_words" not in chosen
    assert [a for _, a in steps] == sorted(a for _, a in steps)  # each step raised the AUC


def test_every_signal_is_read_alone_whatever_the_rule_keeps() -> None:
    from svc_reward.escalation_rule import FEATURES, signal_aucs

    rows, bad, _ = constructed(300)
    single = signal_aucs(rows, bad)
    assert set(single) == set(FEATURES)
    assert single["logprob_min"] is not None and single["logprob_min"] > 0.8
    assert single["spread"] == 0.5  # constant here: no better than chance
    assert signal_aucs([dict(r, logprob_min=None) for r in rows], bad)["logprob_min"] is None


def test_the_neighbourhoods_record_is_a_bad_share_under_its_prior() -> None:
    from svc_reward.escalation_rule import RECORD_PRIOR_BAD, RECORD_PRIOR_GOOD, record_bad_share

    prior = RECORD_PRIOR_BAD / (RECORD_PRIOR_BAD + RECORD_PRIOR_GOOD)
    assert record_bad_share(None, 0.0) is None  # no record sent: the rule leaves it to the threshold
    assert record_bad_share(0.0, 0.0) == pytest.approx(prior)  # a record of no label: the prior
    shares = [record_bad_share(n, n) for n in (1.0, 5.0, 20.0, 200.0)]
    assert shares == sorted(shares) and prior < shares[0] and shares[-1] > 0.97  # labels move it towards theirs
    assert record_bad_share(20.0, 0.0) < prior
    values = features(Signals(2.5, 0.0, None, None, 10, 0, "x", record_labelled=4.0, record_bad=3.0))
    assert values["record_bad"] == pytest.approx(4.0 / 9.0)
    assert features(Signals(2.5, 0.0, None, None, 10, 0, "x"))["record_bad"] is None


def test_a_rule_on_the_record_escalates_by_the_neighbourhood_the_event_carries() -> None:
    from strata.v1 import common_pb2, events_pb2
    from svc_reward.worker import rule_verdict

    # Bad answers come from neighbourhoods people found bad; the light score overlaps, the record separates.
    rng = random.Random(1)
    rows, bad = [], []
    for _ in range(400):
        is_bad = rng.random() < 0.2
        labelled = float(rng.randrange(0, 12))
        bad_labels = float(sum(rng.random() < (0.7 if is_bad else 0.1) for _ in range(int(labelled))))
        rows.append(features(Signals(rng.gauss(2.2 if is_bad else 2.6, 0.6), 0.0, None, None, 40, 96, "a b c",
                                     record_labelled=labelled, record_bad=bad_labels)))
        bad.append(is_bad)
    rule = fit_rule(rows, bad, target_catch=0.9, names=("light", "record_bad"))
    assert rule.features == ("light", "record_bad")
    assert dict(zip(rule.features, rule.weights, strict=True))["record_bad"] > 0
    event = events_pb2.RolloutGenerated(tier=common_pb2.TIER_LEVEL_1, response_tokens=40)
    assert rule_verdict(rule, event, 2.4, 0.0, "a b c") is None  # no record on the event: the threshold decides
    event.level1_record.labelled, event.level1_record.bad = 10.0, 0.0
    good_place = rule_verdict(rule, event, 2.4, 0.0, "a b c")
    event.level1_record.bad = 9.0
    bad_place = rule_verdict(rule, event, 2.4, 0.0, "a b c")
    assert good_place is not None and bad_place is not None
    assert not good_place.escalate and bad_place.escalate  # the same score, judged by where it was written
