"""The routing rules R10-R12 as pure functions over plain dataclasses. No I/O.

For a new prompt the scheduler hands :func:`decide` the k nearest historical prompts (with their
cosine similarity, reward statistics and high-uncertainty mark), the risk match of the prompt and
the current policy / reward-model versions. With ``tiering`` off every prompt goes to Level-1 (a plain
rollout, for baselines). Otherwise the rules, in order:

1. **Risk topic** (medical, legal: keywords or closeness to exemplars)          -> Level-2 (R3).
2. **The prompt itself was flagged unsafe** (a neighbour with its own hash)     -> Level-2 (R12).
3. **Known reward of the prompt itself** (``own_history_skip``): the prompt was rolled out before
   and its own statistics are usable with a variance under ``low_variance_threshold``
                                                                                -> skip, reuse its mean (R10).
4. **High-uncertainty neighbourhood**: at least ``min_marked_neighbours`` similar neighbours are
   marked (their reward variance went over ``high_variance_threshold``), or show such a variance
   now                                                                          -> Level-2 (R11).
   **Marked cluster** (``cluster_marking``): the prompt's cluster (the most similar neighbour that
   leads one, at cosine ``cluster_similarity`` or more) was marked: a prompt in it had a reward
   variance over ``high_variance_threshold``                                   -> Level-2 (R11).
5. **Known reward of the neighbourhood**: at least ``min_low_variance_neighbours`` of the k
   neighbours are *usable* and have a variance under ``low_variance_threshold`` -> skip, reuse (R10).
   **Close paraphrases** (``min_close_paraphrases``, 3 by default; 0: off): a prompt with no usable
   history of its own whose ``min_close_paraphrases`` usable low-variance neighbours at cosine
   ``close_similarity`` or more agree (means within ``close_agreement``) -> skip, reuse theirs.
6. **Level-1's record** (issue 61, route before generating; off by default): the light RM escalated the
   Level-1 answers to the similar neighbours at a rate whose one-sided 95 % lower bound is at least
   ``route_before_escalation_rate``, on at least ``route_before_min_outcomes`` verdicts
                                                                                -> Level-2, no Level-1 cost.
7. Otherwise                                                                    -> Level-0 probe, then Level-1.

Rule 5's second form is a per-neighbourhood count: "7 of the 10 nearest" cannot be met by a prompt
whose own paraphrases number fewer than seven, however closely they agree, and then it reuses
whatever less similar prompts fill the count (other intents of the subject, whose rewards are
another matter). A first sighting close to a few stable paraphrases that agree with one another
skips on those alone; its audits, distrust and similarity floors are rule 5's.

Rule 6 is cascade routing's estimate before generation (Dekoninck et al., ICML 2025); the light RM's
verdict on the answer is the estimate after. It pays only where a Level-2 route buys no more Level-2
answers than an escalation does (one): for one-sample requests whose neighbourhood's Level-1 answers
are nearly all escalated. A request of n >= 2 samples costs n Level-2 answers straight and one through
an escalation, so the rule is off by default (docs/scheduler.md measures it). It comes after the skips
(reusing a known reward costs nothing at all) and uses the verdicts of neighbours that are only short
of samples too: a verdict needs no variance.

Rule 3 is R10's exact-prompt case: a prompt seen before is its own nearest neighbour (cosine 1), and
its own rewards are the most direct evidence there is. It needs no six stable paraphrases besides,
and it outranks a marked neighbourhood (R11 is about what the neighbours' rewards say about a prompt
that has none of its own); risk and an unsafe flag still come first.

A neighbour is *usable* only if it is similar enough (cosine >= ``min_similarity``: a neighbour's
similarity, not only its rank, decides whether its reward says anything about this prompt), has at
least ``min_samples_per_neighbour`` rewards, statistics younger than ``stats_ttl_s``, a light-RM
history made by the current light RM (``rm_version_policy``; the strong RM's rewards are the scale it
is distilled to), a newest sample at most ``max_policy_lag`` policy versions old, was never
flagged unsafe (R12), and carries no fresh *distrust* mark: an audited skip that reused its rewards
erred by more than ``audit_tolerance`` (the audit tightens the neighbourhood it caught, for
``audit_distrust_ttl_s``). Every other neighbour still counts in the denominator k:
"7 of the 10 nearest", not "7 of those that happen to be usable".

The similarity floor is per neighbourhood where the audits measured one: a neighbour whose rewards an
erring audit reused for a prompt at cosine *s* gets its own floor *s* (the highest such *s*, kept for
``audit_similarity_floor_ttl_s``), and is reused only for prompts closer to it than that. The global
``min_similarity`` holds where no audit erred; similarity scores of right and wrong reuses overlap, and
one global floor is the weak point (vCache, arXiv 2502.03771, learns one per cached prompt).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from strata import risk
from strata.hashing import stable_fraction
from strata.risk import RiskMatch
from svc_scheduler.config import SchedulerSettings
from svc_scheduler.stats import LIGHT, RewardStats, marks_high_uncertainty


class Route(Enum):
    SKIP = "skip"  # no rollout: the neighbours' mean reward is reused
    LEVEL_1 = "level_1"  # Level-0 probe, then Level-1 generation and the light RM
    LEVEL_2 = "level_2"  # straight to Level-2: large model, strong RM, human review


@dataclass(frozen=True)
class VersionState:
    """What the scheduler knows of the versions currently in use."""

    policy_version: int  # newest policy version seen (0: none seen yet)
    rm_version: str | None  # reward model currently promoted (None: none known yet: any is accepted)


@dataclass(frozen=True)
class Neighbour:
    """One historical prompt returned by the index for a new prompt."""

    prompt_hash: str
    similarity: float  # cosine similarity to the new prompt (normalised embeddings, inner product)
    stats: RewardStats | None  # its reward statistics; None: never scored (or expired from Redis)
    marked_at: float | None = None  # unix seconds its neighbourhood was marked high-uncertainty; None: not
    cluster: str | None = None  # the cluster it belongs to (its leader's hash; its own when it leads one)
    cluster_marked_at: float | None = None  # when it leads a cluster: unix seconds that cluster was marked
    distrusted_at: float | None = None  # unix seconds an audited skip that reused its rewards erred; None: never
    similarity_floor: float | None = None  # its own floor: the highest cosine at which a reuse of it erred


@dataclass(frozen=True)
class Decision:
    """What the scheduler decided for one prompt, and why (returned to the user by Submit)."""

    route: Route  # skip / Level-1 / Level-2
    reason: str  # one human-readable sentence; carried on the routed event and in SubmitResponse
    reused_reward: float | None  # SKIP: similarity-weighted mean reward of the low-variance neighbours
    reused_reward_std: float | None  # SKIP: spread of that estimate (pooled within + between neighbours)
    reused_rm_version: str | None  # SKIP: reward-model version of the reused statistics (the most common)
    neighbours: int  # neighbours the index returned (at most k)
    similar_neighbours: int  # of those, at or above the similarity floor
    low_variance_neighbours: int  # usable neighbours with variance under low_variance_threshold
    marked_neighbours: int  # similar neighbours in a high-uncertainty neighbourhood
    risk: RiskMatch | None  # the risk topic that sent the prompt to Level-2, if any
    ignored: Mapping[str, int]  # neighbours not usable, by reason ("below similarity floor": 3, ...)
    audited_reward: float | None = None  # an audited skip rolled out anyway: the reward it would have reused
    cluster: str | None = None  # the prompt's cluster (a leader's hash, or its own: it leads a new one)
    reused_from: tuple[str, ...] = ()  # SKIP, and audited skips: the neighbours whose rewards made the reward
    reused_similarity: tuple[float, ...] = ()  # their cosine similarity to the prompt, in the same order
    level1_record: Level1Record | None = None  # tiering on: the neighbourhood's record (passed on with Level-1)

    @property
    def caution(self) -> bool:
        """Flag the routed event: the generator and reward model should be careful (risk, uncertainty)."""
        return self.route is Route.LEVEL_2


# -- risk topics -------------------------------------------------------------------------------------

def detect_risk(
    text: str, exemplar_similarity: Mapping[str, float], settings: SchedulerSettings
) -> RiskMatch | None:
    """Is ``text`` on a high-risk topic? ``strata.risk``'s policy (whole-word keywords, then closeness
    to the topic's exemplars) with this scheduler's keyword lists and similarity floor.

    ``exemplar_similarity`` maps a topic ("medical", "legal") to the prompt's highest cosine with
    that topic's exemplar prompts (computed by the encoder; empty when there are no exemplars).
    """
    keywords = {"medical": settings.risk_keywords_medical, "legal": settings.risk_keywords_legal}
    return risk.detect_risk(text, exemplar_similarity, settings.risk_exemplar_min_similarity, keywords)


# -- neighbours --------------------------------------------------------------------------------------


def unusable_reason(
    neighbour: Neighbour, now: float, versions: VersionState, settings: SchedulerSettings, prompt_hash: str = ""
) -> str | None:
    """Why this neighbour's reward says nothing about the new prompt (``prompt_hash``); None when it is usable."""
    if neighbour.similarity < settings.min_similarity:
        return "below similarity floor"
    stats = neighbour.stats
    if stats is None:
        return "no rewards yet"
    if stats.unsafe:
        return "flagged unsafe"
    if neighbour.distrusted_at is not None and now - neighbour.distrusted_at <= settings.audit_distrust_ttl_s:
        return "audit erred"
    if (settings.audit_similarity_floor_ttl_s > 0 and neighbour.similarity_floor is not None
            and neighbour.prompt_hash != prompt_hash and neighbour.similarity <= neighbour.similarity_floor):
        return "below its audited similarity floor"  # a floor is about other prompts: never the prompt's own
    if now - stats.updated_at > settings.stats_ttl_s:
        return "expired"
    light = stats.rm_versions.get(LIGHT)
    if settings.rm_version_policy == "current" and versions.rm_version is not None and (
        light is not None and light != versions.rm_version
    ):
        return "older reward model"
    if versions.policy_version - stats.newest_policy_version > settings.max_policy_lag:
        return "older policy"
    if stats.count < settings.min_samples_per_neighbour:
        return "too few samples"
    return None


def is_high_uncertainty(neighbour: Neighbour, now: float, usable: bool, settings: SchedulerSettings) -> bool:
    """A similar neighbour whose neighbourhood is marked (and the mark is fresh), or whose usable
    statistics show a variance over the threshold right now (the mark may not have landed yet)."""
    if neighbour.similarity < settings.min_similarity:
        return False
    if neighbour.marked_at is not None and now - neighbour.marked_at <= settings.mark_ttl_s:
        return True
    return usable and neighbour.stats is not None and marks_high_uncertainty(
        neighbour.stats, settings.min_samples_per_neighbour, settings.high_variance_threshold
    )


def _reused_reward(low: Sequence[Neighbour]) -> tuple[float, float]:
    """Similarity-weighted mean of the neighbours' means, and the pooled standard deviation."""
    weights = [max(n.similarity, 1e-6) for n in low]
    total = sum(weights)
    means = [n.stats.mean for n in low if n.stats is not None]
    variances = [n.stats.variance for n in low if n.stats is not None]
    mean = sum(w * m for w, m in zip(weights, means, strict=True)) / total
    within = sum(w * v for w, v in zip(weights, variances, strict=True)) / total
    between = sum(w * (m - mean) ** 2 for w, m in zip(weights, means, strict=True)) / total
    return mean, math.sqrt(within + between)


@dataclass(frozen=True)
class Level1Record:
    """How Level-1 answers to a prompt's similar neighbours fared: the estimate before generation."""

    scored: float  # weight of the light RM's verdicts on them
    escalated: float  # weight of the escalations among them
    neighbours: int  # similar neighbours with a verdict on record
    labelled: float = 0.0  # weight of people's labels of them
    bad: float = 0.0  # weight of those labels that say bad

    @property
    def rate(self) -> float:
        return self.escalated / self.scored if self.scored > 0 else math.nan

    @property
    def low(self) -> float:
        """Wilson's one-sided 95 % lower bound on the escalation rate (0 with no verdicts)."""
        n = self.scored
        if n <= 0:
            return 0.0
        p = min(1.0, max(0.0, self.escalated / n))
        z2 = ROUTE_BEFORE_Z * ROUTE_BEFORE_Z
        centre = p + z2 / (2 * n)
        spread = ROUTE_BEFORE_Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
        return max(0.0, (centre - spread) / (1 + z2 / n))


ROUTE_BEFORE_Z = 1.645  # one-sided 95 %: route before generating only on a record, not on noise


def level1_record(neighbours: Sequence[Neighbour], reasons: Mapping[str, str | None]) -> Level1Record:
    """The Level-1 record of the similar neighbours whose statistics still speak for the prompt (usable, or
    only short of samples: a verdict counts even where the variance does not yet)."""
    scored = escalated = labelled = bad = 0.0
    count = 0
    for n in neighbours:
        if n.stats is None or reasons.get(n.prompt_hash) not in (None, "too few samples") or n.stats.level1_scored <= 0:
            continue
        scored += n.stats.level1_scored
        escalated += n.stats.level1_escalated
        labelled += n.stats.level1_labelled
        bad += n.stats.level1_bad
        count += 1
    return Level1Record(scored, escalated, count, labelled, bad)


def routes_before(record: Level1Record, settings: SchedulerSettings) -> bool:
    """Send the prompt straight to Level-2: its neighbours' Level-1 answers were escalated too often to pay
    for another (cascade routing's estimate before generation; the light RM's verdict is the one after)."""
    return (settings.route_before_escalation_rate < 1 and record.scored >= settings.route_before_min_outcomes
            and record.low >= settings.route_before_escalation_rate)


def cluster_of(prompt_hash: str, neighbours: Sequence[Neighbour], settings: SchedulerSettings) -> Neighbour | None:
    """The leader of the prompt's cluster: the most similar neighbour that leads a cluster, at cosine
    ``cluster_similarity`` or more (the prompt itself when it leads one); None: it leads a new cluster.

    Membership is by closeness to the leader, not to any member, so a cluster cannot drift along a
    chain of paraphrases; a leader farther than the k nearest neighbours is too far to count.
    """
    leaders = [n for n in neighbours
               if n.cluster == n.prompt_hash and n.similarity >= settings.cluster_similarity]
    own = next((n for n in leaders if n.prompt_hash == prompt_hash), None)
    return own or max(leaders, key=lambda n: n.similarity, default=None)


def cluster_marked(leader: Neighbour, now: float, settings: SchedulerSettings) -> bool:
    """Whether the cluster ``leader`` leads carries a fresh high-uncertainty mark (and marking is on)."""
    return (settings.cluster_marking and leader.cluster_marked_at is not None
            and now - leader.cluster_marked_at <= settings.mark_ttl_s)


def close_paraphrases(itself: Neighbour | None, low: Sequence[Neighbour], reasons: Mapping[str, str | None],
                      settings: SchedulerSettings) -> list[Neighbour]:
    """The low-variance neighbours that let a first sighting skip on its close paraphrases alone (rule 5's
    second form); empty when the rule is off, the prompt has usable history of its own (its own rewards
    speak for it), too few are close enough, or their means disagree."""
    if not settings.min_close_paraphrases or (itself is not None and reasons.get(itself.prompt_hash) is None):
        return []
    close = [n for n in low if n.similarity >= settings.close_similarity and n.stats is not None]
    if len(close) < settings.min_close_paraphrases:
        return []
    means = [n.stats.mean for n in close if n.stats is not None]
    return close if max(means) - min(means) <= settings.close_agreement else []


# -- the decision ------------------------------------------------------------------------------------


def decide(
    prompt_hash: str,
    neighbours: Sequence[Neighbour],
    risk: RiskMatch | None,
    now: float,
    versions: VersionState,
    settings: SchedulerSettings,
) -> Decision:
    """Route one prompt (rules 1-6 of the module docstring)."""
    considered = list(neighbours)[: settings.k]
    similar = [n for n in considered if n.similarity >= settings.min_similarity]
    reasons = {n.prompt_hash: unusable_reason(n, now, versions, settings, prompt_hash) for n in considered}
    ignored = Counter(r for r in reasons.values() if r is not None)
    usable = [n for n in considered if reasons[n.prompt_hash] is None]
    low = [n for n in usable if n.stats is not None and n.stats.variance < settings.low_variance_threshold]
    marked = [n for n in considered if is_high_uncertainty(n, now, reasons[n.prompt_hash] is None, settings)]
    leader = cluster_of(prompt_hash, considered, settings)
    cluster = leader.prompt_hash if leader is not None else prompt_hash
    record = level1_record(considered, reasons)

    def make(route: Route, reason: str, reused: tuple[float, float] | None = None,
             reused_from: Sequence[Neighbour] | None = None) -> Decision:
        sources = low if reused_from is None else reused_from
        return Decision(
            route=route,
            reason=reason,
            reused_reward=None if reused is None else reused[0],
            reused_reward_std=None if reused is None else reused[1],
            reused_rm_version=None if reused is None else Counter(
                n.stats.rm_version for n in sources if n.stats is not None
            ).most_common(1)[0][0],
            neighbours=len(considered),
            similar_neighbours=len(similar),
            low_variance_neighbours=len(low),
            marked_neighbours=len(marked),
            risk=risk if route is Route.LEVEL_2 else None,
            ignored=dict(ignored),
            cluster=cluster,
            reused_from=tuple(n.prompt_hash for n in sources) if route is Route.SKIP else (),
            reused_similarity=tuple(n.similarity for n in sources) if route is Route.SKIP else (),
            level1_record=record if settings.tiering else None,
        )

    if not settings.tiering:
        return make(Route.LEVEL_1, "Level-1: tiering is off (every prompt to Level-1, no skip, no Level-2)")
    if risk is not None:
        return make(Route.LEVEL_2, f"Level-2: high-risk topic ({risk.topic}: {risk.evidence})")
    itself = next((n for n in considered if n.prompt_hash == prompt_hash), None)
    if itself is not None and itself.stats is not None and itself.stats.unsafe:
        return make(Route.LEVEL_2, "Level-2: a response to this prompt was flagged unsafe; its reward is never reused")
    own = next((n for n in low if n.prompt_hash == prompt_hash), None) if settings.own_history_skip else None
    if own is not None and own.stats is not None:
        return make(
            Route.SKIP,
            f"skip: this prompt has {own.stats.count} rewards of its own with variance {own.stats.variance:.3f} < "
            f"{settings.low_variance_threshold:g}; reusing its mean reward {own.stats.mean:.3f}",
            (own.stats.mean, math.sqrt(own.stats.variance)),
            reused_from=[own],
        )
    if len(marked) >= settings.min_marked_neighbours:
        return make(
            Route.LEVEL_2,
            f"Level-2: {len(marked)} of the {len(considered)} nearest prompts are in a high-uncertainty "
            f"neighbourhood (reward variance > {settings.high_variance_threshold:g})",
        )
    if leader is not None and cluster_marked(leader, now, settings):
        return make(
            Route.LEVEL_2,
            f"Level-2: its cluster (prompts within cosine {settings.cluster_similarity:g} of "
            f"{leader.prompt_hash[:12]}) is marked high-uncertainty (a reward variance > "
            f"{settings.high_variance_threshold:g} in it)",
        )
    if len(low) >= settings.min_low_variance_neighbours:
        reused = _reused_reward(low)
        return make(
            Route.SKIP,
            f"skip: {len(low)} of the {len(considered)} nearest prompts (cosine >= {settings.min_similarity:g}) "
            f"have reward variance < {settings.low_variance_threshold:g}; reusing their mean reward {reused[0]:.3f}",
            reused,
        )
    close = close_paraphrases(itself, low, reasons, settings)
    if close:
        reused = _reused_reward(close)
        return make(
            Route.SKIP,
            f"skip: close paraphrases: {len(close)} of the {len(considered)} nearest prompts (cosine >= "
            f"{settings.close_similarity:g}) have reward variance < {settings.low_variance_threshold:g} and mean "
            f"rewards within {settings.close_agreement:g} of one another; reusing their mean reward {reused[0]:.3f}",
            reused,
            reused_from=close,
        )
    if routes_before(record, settings):
        return make(
            Route.LEVEL_2,
            f"Level-2 before generating: the light RM escalated {record.escalated:.1f} of {record.scored:.1f} "
            f"(weighted) Level-1 answers to {record.neighbours} similar prompts (95 % lower bound {record.low:.2f} >= "
            f"{settings.route_before_escalation_rate:g}): a Level-1 answer would cost and then be escalated",
        )
    why = ", ".join(f"{count} {reason}" for reason, count in sorted(ignored.items()))
    return make(
        Route.LEVEL_1,
        f"Level-1: {len(low)} of the {len(considered)} nearest prompts have a known low-variance reward "
        f"(need {settings.min_low_variance_neighbours})" + (f"; not usable: {why}" if why else ""),
    )


# -- audit -------------------------------------------------------------------------------------------


def audit_draw(prompt_hash: str, request_id: str) -> float:
    """A uniform number in [0, 1) fixed by the prompt and the request: the same request audits the same
    way on every replica and every retry, and a prompt skipped again under a new request is drawn again."""
    return stable_fraction(f"{prompt_hash}:{request_id}")


def audit(decision: Decision, prompt_hash: str, request_id: str, share: float) -> Decision:
    """Roll ``share`` of the would-be skips out anyway (Level-1), keeping the reward they would have
    reused, so that the reused reward can be compared with fresh ones. It also gives every skipped prompt
    a standing chance to be retried: GRESO (arXiv 2506.02177) finds ~20 % of prompts skipped for zero
    variance become useful again later."""
    if decision.route is not Route.SKIP or decision.reused_reward is None:
        return decision
    if audit_draw(prompt_hash, request_id) >= share:
        return decision
    return replace(
        decision, route=Route.LEVEL_1,
        reason=f"Level-1 (audit of {share:.0%} of skips): would have skipped reusing {decision.reused_reward:.3f}; "
               f"rolled out to check it. {decision.reason}",
        reused_reward=None, reused_reward_std=None, reused_rm_version=None, audited_reward=decision.reused_reward,
    )


def audit_erred(reused: float, fresh_count: int, fresh_sum: float, expected: int, tolerance: float) -> bool:
    """Whether an audit whose ``fresh_count``-th fresh reward was just folded in caught its skip erring: it is
    judged once, on its first ``expected`` (the request's n_samples) fresh rewards, and errs when their mean
    is further than ``tolerance`` from the reward the skip would have reused."""
    return expected > 0 and fresh_count == expected and abs(fresh_sum / fresh_count - reused) > tolerance
