"""The routing rules R10-R12 on constructed neighbourhoods (pure, no I/O)."""

from __future__ import annotations

import dataclasses

import pytest

from svc_scheduler.config import SchedulerSettings
from svc_scheduler.routing import (
    Neighbour,
    Route,
    VersionState,
    audit,
    audit_draw,
    audit_erred,
    decide,
    detect_risk,
    unusable_reason,
)
from svc_scheduler.stats import RewardStats

NOW = 1_000_000.0
SETTINGS = SchedulerSettings(min_close_paraphrases=0)  # R10-R12 as the brief states them; CLOSE below adds the rule
VERSIONS = VersionState(policy_version=10, rm_version="rm-1")
LOW, MID, HIGH = 0.1, 0.5, 0.9  # variances: low (< 0.3), in between, high (> 0.8)


def stats(variance: float, mean: float = 3.0, count: int = 5, age_s: float = 60.0, rm: str = "rm-1",
          policy: int = 10, unsafe: bool = False) -> RewardStats:
    # Unit weights: the weighted variance is the plain unbiased one, m2 / (count - 1).
    return RewardStats(count, mean, variance * (count - 1), float(count), float(count), policy, policy,
                       {"light": rm}, NOW - age_s, unsafe)


def neighbours(n_low: int, k: int = 10, other: float = MID, similarity: float = 0.9) -> list[Neighbour]:
    return [
        Neighbour(f"h{i}", similarity - i * 0.001, stats(LOW if i < n_low else other, mean=3.0 + 0.1 * (i % 3)))
        for i in range(k)
    ]


def route(ns: list[Neighbour], text: str = "Explain how binary search works.", prompt_hash: str = "self",
          settings: SchedulerSettings = SETTINGS, versions: VersionState = VERSIONS, exemplars=None):
    risk = detect_risk(text, exemplars or {}, settings)
    return decide(prompt_hash, ns, risk, NOW, versions, settings)


def test_exactly_seven_of_ten_low_variance_neighbours_skip_and_reuse_their_mean() -> None:
    decision = route(neighbours(7))
    assert decision.route is Route.SKIP
    assert decision.low_variance_neighbours == 7 and decision.neighbours == 10
    low_means = [3.0 + 0.1 * (i % 3) for i in range(7)]
    assert min(low_means) <= decision.reused_reward <= max(low_means)
    assert decision.reused_reward == pytest.approx(sum(low_means) / 7, abs=1e-3)  # near-equal weights
    assert decision.reused_rm_version == "rm-1"
    assert "7 of the 10" in decision.reason


def test_six_of_ten_do_not_skip() -> None:
    decision = route(neighbours(6))
    assert decision.route is Route.LEVEL_1
    assert decision.reused_reward is None
    assert "6 of the 10" in decision.reason and "need 7" in decision.reason


def test_reused_reward_is_similarity_weighted() -> None:
    ns = [Neighbour(f"h{i}", 0.9, stats(LOW, mean=2.0)) for i in range(7)]
    ns[0] = Neighbour("h0", 1.0, stats(LOW, mean=4.0))
    decision = route(ns)
    assert decision.reused_reward == pytest.approx((4.0 * 1.0 + 2.0 * 0.9 * 6) / (1.0 + 0.9 * 6))


def test_own_low_variance_history_skips_without_seven_stable_neighbours() -> None:
    ns = neighbours(1)  # only one low-variance neighbour ...
    ns[0] = Neighbour("self", 1.0, stats(LOW, mean=4.2))  # ... and it is the prompt itself
    decision = route(ns)
    assert decision.route is Route.SKIP
    assert decision.reused_reward == pytest.approx(4.2)
    assert decision.reused_reward_std == pytest.approx(LOW**0.5)
    assert "of its own" in decision.reason
    assert route(ns, settings=SchedulerSettings(own_history_skip=False)).route is Route.LEVEL_1


@pytest.mark.parametrize(
    ("own", "why"),
    [
        (stats(MID, mean=4.2), "its own variance is not low"),
        (stats(LOW, mean=4.2, count=2), "too few samples of its own"),
        (stats(LOW, mean=4.2, age_s=SETTINGS.stats_ttl_s + 1), "its statistics expired"),
        (stats(LOW, mean=4.2, unsafe=True), "it was flagged unsafe"),
    ],
)
def test_own_history_must_be_usable_to_skip(own: RewardStats, why: str) -> None:
    ns = neighbours(1)
    ns[0] = Neighbour("self", 1.0, own)
    assert route(ns).route is not Route.SKIP, why


def test_own_history_outranks_a_marked_neighbourhood_but_not_risk() -> None:
    ns = neighbours(10)
    ns[0] = Neighbour("self", 1.0, stats(LOW))
    for i in range(1, 1 + SETTINGS.min_marked_neighbours):
        ns[i] = Neighbour(f"h{i}", 0.88, stats(LOW), marked_at=NOW - 60)
    assert route(ns).route is Route.SKIP  # measured directly: the neighbours' uncertainty says less
    ns[0] = Neighbour("self", 1.0, stats(MID))
    assert route(ns).route is Route.LEVEL_2  # no stable history of its own: the mark decides
    ns = [Neighbour("self", 1.0, stats(LOW))]
    assert route(ns, text="What dose of ibuprofen is safe?").route is Route.LEVEL_2


def test_variance_over_point_eight_marks_and_escalates() -> None:
    ns = neighbours(7, other=HIGH)  # 3 neighbours with variance 0.9: a high-uncertainty neighbourhood
    decision = route(ns)
    assert decision.route is Route.LEVEL_2
    assert decision.marked_neighbours == 3
    exactly = route(neighbours(6, other=0.8))  # 0.8 is not "over 0.8"
    assert exactly.route is Route.LEVEL_1 and exactly.marked_neighbours == 0


def test_marked_neighbourhood_goes_straight_to_level_2() -> None:
    ns = neighbours(10)  # would skip ...
    for i in range(SETTINGS.min_marked_neighbours):  # ... but enough neighbours are marked
        ns[i] = Neighbour(f"h{i}", 0.88, stats(LOW), marked_at=NOW - 3600)
    decision = route(ns)
    assert decision.route is Route.LEVEL_2
    assert "high-uncertainty" in decision.reason
    ns[0] = Neighbour("h0", 0.88, stats(LOW))  # one mark fewer: the known reward is reused
    assert route(ns).route is Route.SKIP
    assert route(ns, settings=SchedulerSettings(min_marked_neighbours=1)).route is Route.LEVEL_2


def test_expired_mark_and_dissimilar_mark_do_not_escalate() -> None:
    one = SchedulerSettings(min_marked_neighbours=1)
    ns = neighbours(10)
    ns[4] = Neighbour("h4", 0.88, stats(LOW), marked_at=NOW - one.mark_ttl_s - 1)
    ns[9] = Neighbour("h9", 0.5, stats(LOW), marked_at=NOW)  # marked but not similar enough
    assert route(ns, settings=one).route is Route.SKIP


def test_unsafe_is_never_reused() -> None:
    ns = neighbours(7)
    ns[0] = Neighbour("h0", 0.95, stats(LOW, unsafe=True))
    decision = route(ns)
    assert decision.route is Route.LEVEL_1
    assert decision.ignored == {"flagged unsafe": 1}
    assert decision.low_variance_neighbours == 6


def test_prompt_flagged_unsafe_itself_goes_to_level_2() -> None:
    ns = neighbours(10)
    ns[0] = Neighbour("self", 1.0, stats(LOW, unsafe=True))
    decision = route(ns, prompt_hash="self")
    assert decision.route is Route.LEVEL_2
    assert "unsafe" in decision.reason


def test_expired_stats_are_ignored() -> None:
    ns = neighbours(7)
    ns[3] = Neighbour("h3", 0.9, stats(LOW, age_s=SETTINGS.stats_ttl_s + 1))
    decision = route(ns)
    assert decision.route is Route.LEVEL_1
    assert decision.ignored == {"expired": 1}


def test_neighbours_need_min_samples() -> None:
    ns = neighbours(7)
    ns[2] = Neighbour("h2", 0.9, stats(LOW, count=SETTINGS.min_samples_per_neighbour - 1))
    assert route(ns).route is Route.LEVEL_1
    ns[2] = Neighbour("h2", 0.9, stats(LOW, count=SETTINGS.min_samples_per_neighbour))
    assert route(ns).route is Route.SKIP


def test_similarity_floor_counts_not_only_rank() -> None:
    ns = neighbours(7)
    ns[6] = Neighbour("h6", SETTINGS.min_similarity - 0.01, stats(LOW))
    decision = route(ns)
    assert decision.route is Route.LEVEL_1
    assert decision.ignored == {"below similarity floor": 1}
    assert decision.similar_neighbours == 9


def test_fewer_than_k_neighbours_still_need_seven() -> None:
    assert route(neighbours(7, k=7)).route is Route.SKIP
    assert route(neighbours(6, k=6)).route is Route.LEVEL_1
    assert route([]).route is Route.LEVEL_1


def test_stats_of_another_reward_model_or_an_old_policy_are_ignored() -> None:
    ns = neighbours(7)
    ns[1] = Neighbour("h1", 0.9, stats(LOW, rm="rm-0"))
    assert route(ns).route is Route.LEVEL_1
    assert route(ns, settings=SchedulerSettings(rm_version_policy="any")).route is Route.SKIP
    assert route(ns, versions=VersionState(10, None)).route is Route.SKIP  # no RM promoted yet: any
    ns = neighbours(7)
    ns[1] = Neighbour("h1", 0.9, stats(LOW, policy=10 - SETTINGS.max_policy_lag - 1))
    decision = route(ns)
    assert decision.route is Route.LEVEL_1 and decision.ignored == {"older policy": 1}


def test_strong_rm_rewards_stay_usable_when_a_new_light_rm_is_promoted() -> None:
    # The promoted version is the light RM's; the strong RM it is distilled from keeps its scale.
    ns = neighbours(7)
    strong_only = dataclasses.replace(stats(LOW), rm_versions={"strong": "strong-s"})
    ns[1] = Neighbour("h1", 0.9, strong_only)
    assert unusable_reason(ns[1], NOW, VERSIONS, SETTINGS) is None
    both = dataclasses.replace(stats(LOW), rm_versions={"strong": "strong-s", "light": "rm-0"})
    assert unusable_reason(Neighbour("h1", 0.9, both), NOW, VERSIONS, SETTINGS) == "older reward model"


def test_audit_rolls_out_a_share_of_would_be_skips_reproducibly() -> None:
    skip = route(neighbours(7))
    assert skip.route is Route.SKIP
    assert audit(skip, "p", "r", 0.0) is skip
    audited = audit(skip, "p", "r", 1.0)
    assert audited.route is Route.LEVEL_1 and audited.audited_reward == skip.reused_reward
    assert audited.reused_reward is None and audited.reason.startswith("Level-1 (audit")
    level1 = route(neighbours(3))
    assert audit(level1, "p", "r", 1.0) is level1  # only skips are audited
    draws = [audit_draw("p", f"request-{i}") for i in range(2000)]
    assert all(0.0 <= d < 1.0 for d in draws) and len(set(draws)) == 2000
    share = sum(audit(skip, "p", f"request-{i}", 0.1).route is Route.LEVEL_1 for i in range(2000)) / 2000
    assert 0.08 < share < 0.12


def test_a_skip_names_the_neighbours_it_reused_and_its_audit_keeps_them() -> None:
    skip = route(neighbours(8))
    assert skip.reused_from == tuple(f"h{i}" for i in range(8))
    assert skip.reused_similarity == pytest.approx(tuple(0.9 - i * 0.001 for i in range(8)))
    audited = audit(skip, "p", "r", 1.0)
    assert (audited.reused_from, audited.reused_similarity) == (skip.reused_from, skip.reused_similarity)
    assert route(neighbours(3)).reused_from == ()
    own = route([Neighbour("self", 1.0, stats(LOW, count=4)), *neighbours(3)[:9]])
    assert own.route is Route.SKIP and own.reused_from == ("self",)


def test_an_audit_that_caught_its_skip_erring_takes_the_reused_neighbours_out_of_reuse() -> None:
    ns = neighbours(7)
    ns[0] = dataclasses.replace(ns[0], distrusted_at=NOW - 60)
    decision = route(ns)
    assert decision.route is Route.LEVEL_1 and decision.ignored == {"audit erred": 1}
    assert "1 audit erred" in decision.reason
    ns[0] = dataclasses.replace(ns[0], distrusted_at=NOW - SETTINGS.audit_distrust_ttl_s - 1)  # expired
    assert route(ns).route is Route.SKIP


def test_a_neighbour_is_reused_only_above_its_own_audited_similarity_floor() -> None:
    ns = neighbours(7)  # h0 at cosine 0.9: seven low-variance neighbours, a skip
    ns[0] = dataclasses.replace(ns[0], similarity_floor=0.9)  # an audit erred reusing h0 at 0.9
    decision = route(ns)
    assert decision.route is Route.LEVEL_1 and decision.ignored == {"below its audited similarity floor": 1}
    ns[0] = dataclasses.replace(ns[0], similarity_floor=0.95)  # erred closer than this prompt is
    assert route(ns).route is Route.LEVEL_1
    ns[0] = dataclasses.replace(ns[0], similarity_floor=0.85)  # erred only for prompts farther away
    assert route(ns).route is Route.SKIP
    ns[0] = dataclasses.replace(ns[0], similarity_floor=None)
    assert route(ns).route is Route.SKIP
    ns[0] = dataclasses.replace(ns[0], similarity_floor=0.95)
    no_floors = SchedulerSettings(audit_similarity_floor_ttl_s=0)  # off: floors already stored are ignored
    assert route(ns, settings=no_floors).route is Route.SKIP


def test_a_prompt_own_history_ignores_the_floor_it_got_as_another_prompt_neighbour() -> None:
    own = Neighbour("self", 1.0, stats(LOW, mean=4.2), similarity_floor=1.0)  # a near-duplicate erred at 1.0
    decision = route([own, *neighbours(3)[:9]])
    assert decision.route is Route.SKIP and decision.reused_from == ("self",)


@pytest.mark.parametrize(("reused", "count", "total", "expected", "erred"), [
    (4.0, 2, 6.0, 2, True),    # complete, mean 3.0: off by 1.0 > 0.5
    (4.0, 2, 7.4, 2, False),   # complete, mean 3.7: within the tolerance
    (4.0, 1, 2.0, 2, False),   # not complete yet: one noisy sample does not judge
    (4.0, 3, 9.0, 2, False),   # judged once, on the expected count; later rewards (escalations) do not
    (4.0, 2, 6.0, 0, False),   # an audit recorded without its expected count is never judged
])
def test_an_audit_is_judged_once_on_its_expected_fresh_rewards(
        reused: float, count: int, total: float, expected: int, erred: bool) -> None:
    assert audit_erred(reused, count, total, expected, 0.5) is erred


@pytest.mark.parametrize(
    ("text", "topic"),
    [
        ("What dose of ibuprofen is safe for a child?", "medical"),
        ("Can my LANDLORD keep the deposit after I leave?", "legal"),
        ("Should I hire an attorney?", "legal"),
    ],
)
def test_risk_keywords_go_to_level_2_even_when_the_reward_is_known(text: str, topic: str) -> None:
    decision = route(neighbours(10), text=text)
    assert decision.route is Route.LEVEL_2
    assert decision.risk is not None and decision.risk.topic == topic
    assert "high-risk" in decision.reason


def test_risk_keywords_match_whole_words_only() -> None:
    assert detect_risk("I have an issue with my lawnmower.", {}, SETTINGS) is None  # "sue" in "issue"
    assert detect_risk("Explain how binary search works.", {}, SETTINGS) is None


def test_risk_exemplar_similarity() -> None:
    floor = SETTINGS.risk_exemplar_min_similarity
    match = detect_risk("my kid is burning up", {"medical": floor, "legal": 0.1}, SETTINGS)
    assert match is not None and match.topic == "medical" and "exemplar" in match.evidence
    assert detect_risk("my kid is burning up", {"medical": floor - 0.01}, SETTINGS) is None


def test_unusable_reason_order() -> None:
    far = Neighbour("x", 0.1, None)
    assert unusable_reason(far, NOW, VERSIONS, SETTINGS) == "below similarity floor"
    assert unusable_reason(Neighbour("x", 0.9, None), NOW, VERSIONS, SETTINGS) == "no rewards yet"
    assert unusable_reason(Neighbour("x", 0.9, stats(LOW)), NOW, VERSIONS, SETTINGS) is None


# -- cluster marking (R11: variance > 0.8 marks the prompt's cluster) ---------------------------------


def clustered(leader_similarity: float, marked_at: float | None, n_low: int = 8) -> list[Neighbour]:
    """Low-variance neighbours (they alone would skip) in one cluster led by ``lead``."""
    ns = [dataclasses.replace(n, cluster="lead") for n in neighbours(n_low)]
    ns[0] = Neighbour("lead", leader_similarity, stats(LOW), cluster="lead", cluster_marked_at=marked_at)
    return ns


MARKING = SchedulerSettings(cluster_marking=True)


def test_a_prompt_of_a_marked_cluster_goes_to_level_2_where_its_neighbours_alone_would_skip() -> None:
    assert route(clustered(0.9, None), settings=MARKING).route is Route.SKIP
    assert route(clustered(0.9, NOW - 60)).route is Route.SKIP  # off by default (docs/scheduler.md says why)
    decision = route(clustered(0.9, NOW - 60), settings=MARKING)
    assert decision.route is Route.LEVEL_2 and decision.marked_neighbours == 0  # no neighbour mark: the cluster's
    assert "cluster" in decision.reason and "lead" in decision.reason
    assert decision.cluster == "lead"


def test_cluster_marking_off_expired_or_a_leader_too_far_do_not_escalate() -> None:
    off = SchedulerSettings(cluster_marking=False)
    assert route(clustered(0.9, NOW - 60), settings=off).route is Route.SKIP
    assert route(clustered(0.9, NOW - SETTINGS.mark_ttl_s - 1), settings=MARKING).route is Route.SKIP
    far = route(clustered(SETTINGS.cluster_similarity - 0.01, NOW - 60), settings=MARKING)
    assert far.route is Route.SKIP and far.cluster == "self"  # no leader close enough: it leads a new cluster


def test_the_cluster_is_the_closest_leader_and_members_never_lead() -> None:
    ns = clustered(0.8, None)
    ns[1] = Neighbour("other-lead", 0.95, stats(LOW), cluster="other-lead", cluster_marked_at=NOW - 60)
    ns[2] = Neighbour("member", 0.99, stats(LOW), cluster="other-lead", cluster_marked_at=NOW - 60)
    decision = route(ns, settings=MARKING)
    assert decision.cluster == "other-lead" and decision.route is Route.LEVEL_2  # 0.95 beats 0.8; not the member
    ns[1] = dataclasses.replace(ns[1], cluster_marked_at=None)
    assert route(ns, settings=MARKING).route is Route.SKIP  # the member's copy of a mark is not read: the leader's
    assert route(ns, prompt_hash="lead").cluster == "lead"  # a leader is its own cluster, however close another


def test_with_tiering_off_every_prompt_goes_to_level_1() -> None:
    plain = SchedulerSettings(tiering=False)
    stable = neighbours(10)  # would skip
    marked = neighbours(7, other=HIGH)  # would go to Level-2
    for ns, text in ((stable, "Explain how binary search works."), (marked, "Explain how binary search works."),
                     (neighbours(0), "What dose of ibuprofen is safe?")):  # a risk topic
        assert route(ns, text=text).route is not Route.LEVEL_1
        decision = route(ns, text=text, settings=plain)
        assert decision.route is Route.LEVEL_1 and decision.reused_reward is None
        assert "tiering is off" in decision.reason


CLOSE = SchedulerSettings(min_close_paraphrases=3, close_similarity=0.85, close_agreement=0.5)


def paraphrases(means: list[float], similarities: list[float] | None = None, far: int = 7) -> list[Neighbour]:
    """Close low-variance paraphrases first, then ``far`` stable prompts under the similarity floor."""
    similarities = similarities or [0.9] * len(means)
    close = [Neighbour(f"p{i}", s, stats(LOW, mean=m))
             for i, (m, s) in enumerate(zip(means, similarities, strict=True))]
    return close + [Neighbour(f"f{i}", 0.7, stats(LOW, mean=1.0)) for i in range(far)]


def test_a_first_sighting_skips_on_three_agreeing_close_paraphrases() -> None:
    ns = paraphrases([3.0, 3.2, 3.4])
    decision = route(ns, settings=CLOSE)
    assert decision.route is Route.SKIP and "close paraphrases: 3 of the 10" in decision.reason
    assert decision.reused_from == ("p0", "p1", "p2")
    assert decision.reused_reward == pytest.approx(3.2)
    r10_alone = route(ns, settings=CLOSE.model_copy(update={"min_close_paraphrases": 0}))
    assert r10_alone.route is Route.LEVEL_1 and "3 of the 10" in r10_alone.reason
    audited = audit(decision, "self", "r", share=1.0)  # audited like every skip, naming what it would reuse
    assert audited.route is Route.LEVEL_1 and audited.audited_reward == pytest.approx(3.2)


@pytest.mark.parametrize(
    ("ns", "why"),
    [
        (paraphrases([3.0, 3.2, 3.4], [0.9, 0.9, 0.84]), "the third is not close enough"),
        (paraphrases([3.0, 3.2, 3.6]), "their means disagree by more than close_agreement"),
        ([Neighbour("self", 1.0, stats(MID, mean=3.2)), *paraphrases([3.0, 3.2, 3.4], far=6)],
         "the prompt's own usable rewards vary: they speak for it"),
        ([dataclasses.replace(n, distrusted_at=NOW - 1) if n.prompt_hash == "p0" else n
          for n in paraphrases([3.0, 3.2, 3.4])], "an audit distrusted one of them"),
    ],
)
def test_close_paraphrases_do_not_skip_when(ns: list[Neighbour], why: str) -> None:
    assert route(ns, settings=CLOSE).route is not Route.SKIP, why


def test_close_paraphrases_must_be_fewer_than_k() -> None:
    with pytest.raises(ValueError, match="min_close_paraphrases"):
        SchedulerSettings(k=5, min_low_variance_neighbours=5, min_close_paraphrases=6)

