"""Escalation on several signals (issue 61): one learned, calibrated rule per light-RM version. Pure numpy.

The light RM's score alone decides today: a Level-1 answer under the threshold escalates. Its bad-case
AUC bounds what any threshold can do (at AUC ~0.8, catching 90 % of bad answers escalates most of them).
Other signals come free with every rollout: the members' disagreement, the generator's own confidence in
its answer (``strata.confidence``: mean and least token log-probability), the answer's form (length,
hitting the token limit, repeated phrases), and the neighbourhood's record: the share of Level-1 answers to
the prompt's similar neighbours that people labelled bad (the scheduler keeps it and routes it on with the
prompt; shrunk towards ``RECORD_PRIOR_*`` where few are labelled). Their directions are learned, not
assumed: a confident answer is often a repeated one.

The rule is a logistic regression over standardised features, fitted on labelled Level-1 answers (the
oracle stands in for the strong RM's and the desk's labels in the zoo; live, the audited and escalated
answers carry them), with an L2 penalty. Its threshold on the predicted probability of a bad answer is
the lowest that escalates the target share of the fitting set's bad answers, as the single threshold's
calibration does. It is stored beside the light RM (``strata_escalation_rule.json``, bound to its
weights' checksum) and served with it; without one, or for an answer missing a signal the rule needs,
the single threshold decides.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RULE_FILE = "strata_escalation_rule.json"
FEATURES = ("light", "spread", "logprob_mean", "logprob_min", "log_tokens", "hit_limit", "repetition",
            "distinct_words", "record_bad")
# The record's bad share starts from 1 bad label in 5 (Level-1's answers on the zoo suite: 13-19 % bad) and
# moves as people's labels come in: a neighbourhood with no label reads 0.2, one with 20 bad of 20 reads 0.84.
RECORD_PRIOR_BAD, RECORD_PRIOR_GOOD = 1.0, 4.0


@dataclass(frozen=True)
class Signals:
    """What the reward worker knows of one Level-1 answer when it decides."""

    light: float                 # the light RM's raw reward
    spread: float                # across the ensemble's members (0 for one RM)
    logprob_mean: float | None   # the generator's confidence (None: not reported)
    logprob_min: float | None
    response_tokens: int
    max_new_tokens: int          # the sampling limit it was generated under (0: unknown)
    response: str
    record_labelled: float | None = None  # the neighbourhood's labelled Level-1 answers (None: no record sent)
    record_bad: float = 0.0               # of those, labelled bad (weights, aged)


def form(response: str) -> tuple[float, float]:
    """(repetition, distinct_words): the share of repeated word trigrams, and distinct words over words."""
    words = response.lower().split()
    if not words:
        return 0.0, 0.0
    trigrams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    repetition = 1.0 - len(set(trigrams)) / len(trigrams) if trigrams else 0.0
    return repetition, len(set(words)) / len(words)


def record_bad_share(labelled: float | None, bad: float) -> float | None:
    """The neighbourhood's bad share under the prior (``RECORD_PRIOR_*``); None without a record."""
    if labelled is None:
        return None
    return (bad + RECORD_PRIOR_BAD) / (labelled + RECORD_PRIOR_BAD + RECORD_PRIOR_GOOD)


def features(signals: Signals) -> dict[str, float | None]:
    """Every feature of ``FEATURES`` for one answer; None where the signal is missing."""
    repetition, distinct = form(signals.response)
    limit = signals.max_new_tokens
    return {
        "light": signals.light, "spread": signals.spread,
        "logprob_mean": signals.logprob_mean, "logprob_min": signals.logprob_min,
        "log_tokens": math.log1p(signals.response_tokens),
        "hit_limit": float(limit > 0 and signals.response_tokens >= limit),
        "repetition": repetition, "distinct_words": distinct,
        "record_bad": record_bad_share(signals.record_labelled, signals.record_bad),
    }


@dataclass(frozen=True)
class EscalationRule:
    """P(bad) = sigmoid(bias + sum(weight * (x - mean) / scale)); escalate at ``threshold`` or above."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float
    threshold: float
    target_catch: float
    checksum: str = ""           # the light RM's weights it was fitted with (``weights_checksum``)
    fitted: Mapping[str, Any] = field(default_factory=dict)  # answers, bad, split, AUCs: for the log

    def probability(self, values: Mapping[str, float | None]) -> float | None:
        """P(bad) for one answer's features; None when a feature the rule uses is missing."""
        z = self.bias
        for name, mu, sigma, w in zip(self.features, self.mean, self.scale, self.weights, strict=True):
            x = values.get(name)
            if x is None or not math.isfinite(x):
                return None
            z += w * (x - mu) / sigma
        return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0

    def escalates(self, values: Mapping[str, float | None]) -> bool | None:
        """Whether the rule escalates this answer; None when it cannot judge it (the threshold decides)."""
        p = self.probability(values)
        return None if p is None else p >= self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {"features": list(self.features), "mean": list(self.mean), "scale": list(self.scale),
                "weights": list(self.weights), "bias": self.bias, "threshold": self.threshold,
                "target_catch": self.target_catch, "checksum": self.checksum, "fitted": dict(self.fitted)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EscalationRule:
        """ValueError naming the field when ``data`` is not a rule."""
        try:
            names = tuple(str(f) for f in data["features"])
            columns = [tuple(float(v) for v in data[key]) for key in ("mean", "scale", "weights")]
            rule = cls(names, columns[0], columns[1], columns[2], float(data["bias"]), float(data["threshold"]),
                       float(data["target_catch"]), str(data.get("checksum", "")), dict(data.get("fitted", {})))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an escalation rule: missing or malformed {exc}") from exc
        if unknown := set(names) - set(FEATURES):
            raise ValueError(f"unknown features {sorted(unknown)}; known: {', '.join(FEATURES)}")
        if not all(len(c) == len(names) for c in columns):
            raise ValueError("mean, scale and weights need one value per feature")
        if not all(s > 0 for s in rule.scale):
            raise ValueError("every scale must be > 0")
        return rule


# -- fitting --------------------------------------------------------------------------------------------

def auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """P(score of a positive > score of a negative), ties half; None without both kinds."""
    pos = [s for s, p in zip(scores, positive, strict=True) if p]
    neg = [s for s, p in zip(scores, positive, strict=True) if not p]
    if not pos or not neg:
        return None
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    values = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(values))
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2 + 1
        i = j + 1
    rank_of = np.empty(len(values))
    rank_of[order] = ranks
    return float((rank_of[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _logistic(x: np.ndarray, y: np.ndarray, l2: float, iterations: int = 50) -> tuple[np.ndarray, float]:
    """Newton's method on the L2-penalised log-loss (the bias unpenalised): (weights, bias)."""
    n, d = x.shape
    design = np.hstack([x, np.ones((n, 1))])
    beta = np.zeros(d + 1)
    penalty = np.diag([l2] * d + [0.0])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ beta, -30, 30)))
        gradient = design.T @ (p - y) + penalty @ beta
        hessian = design.T @ (design * (p * (1 - p))[:, None]) + penalty + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hessian, gradient)
        beta -= step
        if np.max(np.abs(step)) < 1e-8:
            break
    return beta[:d], float(beta[d])


def threshold_for_catch(probabilities: Sequence[float], bad: Sequence[bool], target_catch: float) -> float:
    """The highest probability threshold escalating at least ``target_catch`` of the bad answers."""
    bad_p = sorted((p for p, b in zip(probabilities, bad, strict=True) if b), reverse=True)
    if not bad_p:
        raise ValueError("no bad answer to catch: the labels hold none")
    needed = max(1, math.ceil(target_catch * len(bad_p) - 1e-9))
    return bad_p[needed - 1]


def _matrix(rows: Sequence[Mapping[str, float | None]], names: Sequence[str]) -> np.ndarray:
    return np.array([[float(r[n]) for n in names] for r in rows], dtype=float)  # type: ignore[arg-type]


def fit_rule(rows: Sequence[Mapping[str, float | None]], bad: Sequence[bool], target_catch: float,
             names: Sequence[str] = FEATURES, l2: float = 1.0) -> EscalationRule:
    """The rule over the features ``names`` every row has (a feature missing anywhere is left out).
    ValueError without both good and bad answers."""
    if len(rows) != len(bad):
        raise ValueError(f"one label per answer: {len(rows)} answers, {len(bad)} labels")
    if not any(bad) or all(bad):
        raise ValueError("the labels need good and bad answers to fit a rule")
    usable = [n for n in names if all(r.get(n) is not None and math.isfinite(r[n]) for r in rows)]  # type: ignore[arg-type]
    x = _matrix(rows, usable)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    keep = [i for i, s in enumerate(scale) if s > 1e-9]  # a constant feature says nothing here
    usable, x, mean, scale = [usable[i] for i in keep], x[:, keep], mean[keep], scale[keep]
    weights, bias = _logistic((x - mean) / scale, np.asarray(bad, dtype=float), l2)
    rule = EscalationRule(tuple(usable), tuple(mean.tolist()), tuple(scale.tolist()), tuple(weights.tolist()),
                          bias, 0.0, target_catch)
    probabilities = [rule.probability(r) or 0.0 for r in rows]
    return EscalationRule(rule.features, rule.mean, rule.scale, rule.weights, bias,
                          threshold_for_catch(probabilities, bad, target_catch), target_catch)


@dataclass(frozen=True)
class RuleReport:
    """What each signal buys, out of fold. AUCs are read within each test fold and averaged (weighted by
    its answers): pooling folds would rank one fold's probabilities against another's, whose intercepts
    differ with the folds' bad-answer rates. Catch and escalated share: each fold's threshold is chosen on
    the other folds for the target catch and applied to it, as a rule fitted on one set meets the next."""

    single: Mapping[str, float | None]           # each feature alone, whole set (either direction)
    light_auc: float | None                       # the light RM's score alone (the served threshold's)
    combined_auc: float | None                    # the rule
    light_catch: float | None
    light_escalated: float | None
    combined_catch: float | None
    combined_escalated: float | None
    folds: int


def signal_aucs(rows: Sequence[Mapping[str, float | None]], bad: Sequence[bool]) -> dict[str, float | None]:
    """Each feature alone as a detector of bad answers, in its better direction; None where a row lacks it."""
    single: dict[str, float | None] = {}
    for name in FEATURES:
        values = [r.get(name) for r in rows]
        if any(v is None for v in values):
            single[name] = None
            continue
        a = auc([float(v) for v in values], bad)  # type: ignore[arg-type]
        single[name] = None if a is None else max(a, 1 - a)
    return single


def _fold_figures(train_scores: Sequence[float], train_bad: Sequence[bool], test_scores: Sequence[float],
                  test_bad: Sequence[bool], target_catch: float) -> tuple[float | None, int, int, int]:
    """(AUC on the test fold, bad caught, bad, escalated) at the threshold the training folds choose."""
    cut = threshold_for_catch(train_scores, train_bad, target_catch)
    escalated = [s >= cut for s in test_scores]
    caught = sum(e for e, b in zip(escalated, test_bad, strict=True) if b)
    return auc(test_scores, test_bad), caught, sum(test_bad), sum(escalated)


def fold_of(groups: Sequence[Hashable], folds: int, seed: int = 0) -> list[int]:
    """Each answer's fold: whole groups (paraphrase families, or prompts) dealt round-robin in a seeded order."""
    distinct = sorted(set(groups), key=str)
    order = np.random.default_rng(seed).permutation(len(distinct))
    fold_of_group = {distinct[j]: i % folds for i, j in enumerate(order)}
    return [fold_of_group[g] for g in groups]


def fold_rules(rows: Sequence[Mapping[str, float | None]], bad: Sequence[bool], fold: Sequence[int], folds: int,
               target_catch: float, names: Sequence[str] = FEATURES, l2: float = 1.0) -> dict[int, EscalationRule]:
    """Per fold (``fold``: each answer's, from ``fold_of``), the rule fitted on the other folds' answers; a fold
    that holds no answer, or whose others lack good or bad ones, has none."""
    rules = {}
    for k in range(folds):
        train = [i for i, f in enumerate(fold) if f != k]
        train_bad = [bad[i] for i in train]
        if k in fold and any(train_bad) and not all(train_bad):
            rules[k] = fit_rule([rows[i] for i in train], train_bad, target_catch, names=names, l2=l2)
    return rules


def evaluate_rule(rows: Sequence[Mapping[str, float | None]], bad: Sequence[bool], groups: Sequence[Hashable],
                  target_catch: float, folds: int = 5, l2: float = 1.0, seed: int = 0,
                  names: Sequence[str] = FEATURES) -> RuleReport:
    """Out-of-fold figures of the rule on ``names``: folds split by ``groups`` (paraphrase families), so no
    family is in both the fit and the test of a fold. The light score (each row's ``light``) is judged the same
    way (its threshold chosen on the other folds)."""
    fold = fold_of(groups, folds, seed)
    light = [-(r["light"] or 0.0) for r in rows]  # a lower reward is more likely bad
    sums = {"light": [0.0, 0, 0, 0, 0], "rule": [0.0, 0, 0, 0, 0]}  # AUC x n, n, caught, bad, escalated
    for k, rule in fold_rules(rows, bad, fold, folds, target_catch, names, l2).items():
        train = [i for i, f in enumerate(fold) if f != k]
        test = [i for i, f in enumerate(fold) if f == k]
        train_bad, test_bad = [bad[i] for i in train], [bad[i] for i in test]
        probability = [rule.probability(r) or 0.0 for r in rows]
        for name, scores in (("light", light), ("rule", probability)):
            a, caught, n_bad, escalated = _fold_figures([scores[i] for i in train], train_bad,
                                                        [scores[i] for i in test], test_bad, target_catch)
            total = sums[name]
            if a is not None:
                total[0] += a * len(test)
                total[1] += len(test)
            total[2] += caught
            total[3] += n_bad
            total[4] += escalated
    evaluated = sum(1 for k in range(folds) if any(f == k for f in fold))

    def read(name: str) -> tuple[float | None, float | None, float | None]:
        weighted, n, caught, n_bad, escalated = sums[name]
        return (weighted / n if n else None, caught / n_bad if n_bad else None,
                escalated / len(rows) if rows else None)

    single = signal_aucs(rows, bad)
    light_auc, light_catch, light_escalated = read("light")
    rule_auc, rule_catch, rule_escalated = read("rule")
    return RuleReport(single, light_auc, rule_auc, light_catch, light_escalated, rule_catch, rule_escalated,
                      evaluated)


def select_features(rows: Sequence[Mapping[str, float | None]], bad: Sequence[bool], groups: Sequence[Hashable],
                    target_catch: float, folds: int = 5, l2: float = 1.0, seed: int = 0,
                    min_gain: float = 0.005) -> tuple[list[str], list[tuple[str, float]]]:
    """Forward selection on the out-of-fold AUC: start from the light score, add the feature that raises it
    most while it rises by ``min_gain`` or more (a signal that does not carry across families stays out).
    The features chosen, and each step's (feature added, AUC)."""
    def oof_auc(names: Sequence[str]) -> float:
        sub = [{n: r.get(n) for n in names} for r in rows]
        found = evaluate_rule(sub, bad, groups, target_catch, folds, l2, seed).combined_auc
        return -1.0 if found is None else found

    available = [n for n in FEATURES if all(r.get(n) is not None for r in rows)]
    chosen = ["light"]
    best = oof_auc(chosen)
    steps = [("light", best)]
    while True:
        candidates = [(oof_auc([*chosen, n]), n) for n in available if n not in chosen]
        if not candidates:
            break
        score, name = max(candidates)
        if score < best + min_gain:
            break
        chosen.append(name)
        best = score
        steps.append((name, score))
    return chosen, steps
