"""The annotation desk's rules (R3, R18). No I/O: the Redis store applies them atomically, the
worker and the servicer translate events and requests into these types.

An *item* is one sample of one request (prompt, response, request, sample index) that a human
scores 0-5. Most items need one score; a ``double_share`` of them, chosen by item id, need two
(agreement between annotators). An *assignment* gives an item to one annotator until it goes
stale (``assignment_ttl_s``); a stale one returns to the queue. Past ``annotation_deadline_s`` an
item closes: with the scores it has (the human's mean becomes the sample's final reward), or with
none (the reward service's provisional reward becomes final). *Gold* items have a known score and
are mixed into each annotator's stream at ``gold_share`` to track drift (R18); their scores are
never rewards.
"""

from __future__ import annotations

import hashlib
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata.contract.identity import sample_identity
from strata.hashing import stable_fraction

SCORE_MIN = 0.0
SCORE_MAX = 5.0
# Annotator ids become Redis hash fields, metric labels and a comma-joined RewardScored.annotator_id.
ANNOTATOR_ID = re.compile(r"[A-Za-z0-9._@-]{1,64}")
ITEM_ID = re.compile(r"(gold-)?[0-9a-f]{32}")

# Item states (the ``state`` field of an item in Redis).
PENDING = "pending"      # waiting for scores
COMPLETE = "complete"    # its scores are in (all it needs, or some at the deadline)
EXPIRED = "expired"      # no score by the deadline: the provisional reward is final
GOLD = "gold"            # a gold item: open to every annotator, once each, never closed
RETIRED = "retired"      # a gold item no longer in the gold file


# -- errors: each says what to fix; the servicer maps the class to a gRPC status ---------------------

class DeskError(Exception):
    """A request the desk refuses."""


class InvalidRequestError(DeskError, ValueError):
    """A bad field (INVALID_ARGUMENT); ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class UnknownItemError(DeskError, LookupError):
    """No such item (NOT_FOUND)."""


class NotAssignedError(DeskError):
    """The item is not (or no longer) assigned to this annotator, or it is closed (FAILED_PRECONDITION)."""


class AlreadyScoredError(DeskError):
    """This annotator already scored this item (ALREADY_EXISTS); the first score stands."""


# -- the types ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rules:
    double_share: float         # share of items scored by two annotators, chosen by item id
    gold_share: float           # share of an annotator's assignments that are gold items
    assignment_ttl_s: float     # an assignment older than this is stale: the item returns to the queue
    annotation_deadline_s: float  # past this the item closes (human scores so far, else the provisional reward)


@dataclass(frozen=True)
class Item:
    item_id: str
    prompt_hash: str
    response_hash: str
    request_id: str
    sample_index: int
    needs: int                  # scores wanted: 1, or 2 for a double item (0 for gold: unlimited, once each)
    enqueued_at: float          # when the desk queued it (epoch seconds): the queue's order
    deadline_at: float          # enqueued_at + annotation_deadline_s
    awaits_final: bool          # the desk publishes the sample's final reward (a provisional one awaits it)
    state: str = PENDING
    gold_score: float | None = None  # gold items only: the known score
    event: bytes = b""          # the AnnotationRequested as it came; opaque here, the worker reads it

    @property
    def gold(self) -> bool:
        return self.gold_score is not None


@dataclass(frozen=True)
class Score:
    annotator: str
    score: float
    unsafe: bool
    off_topic: bool
    scored_at: float            # epoch seconds


@dataclass(frozen=True)
class Offer:
    """What ``next_item`` hands an annotator."""

    item_id: str
    prompt: str
    response: str
    assigned_until: float       # epoch seconds
    new: bool                   # False: the annotator's open assignment, handed back


@dataclass(frozen=True)
class GoldItem:
    prompt: str
    response: str
    score: float


@dataclass(frozen=True)
class FinalReward:
    """The human side of a sample's final reward."""

    reward: float               # mean of the scores
    spread: float               # population standard deviation of the scores (0 for one)
    annotators: str             # comma-joined, in the order they scored
    unsafe: bool                # any annotator flagged it


@dataclass(frozen=True)
class AnnotatorStats:
    scored: int = 0
    gold_scored: int = 0
    assignments: int = 0
    mean_score: float = 0.0
    has_open_assignment: bool = False


@dataclass(frozen=True)
class DeskStatus:
    queue_depth: int            # items still waiting for a score
    assigned: int               # assignments held right now
    enqueued: int
    completed: int
    expired: int                # closed with no score: the provisional reward became final
    gold_items: int
    annotators: Mapping[str, AnnotatorStats]


# -- the rules ---------------------------------------------------------------------------------------

def item_id_of(prompt_hash: str, response_hash: str, request_id: str, sample_index: int) -> str:
    """One sample of one request, whatever event brings it: 32 hex digits."""
    identity = sample_identity(prompt_hash, response_hash, request_id, sample_index)
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:32]


def gold_item_id(prompt_hash: str, response_hash: str) -> str:
    return "gold-" + hashlib.sha256(f"{prompt_hash}:{response_hash}".encode()).hexdigest()[:32]


def is_double(item_id: str, double_share: float) -> bool:
    """True for the items scored by two annotators: a fixed share, chosen by item id alone."""
    return stable_fraction(f"double:{item_id}") < double_share


def scores_needed(item_id: str, double_share: float) -> int:
    return 2 if is_double(item_id, double_share) else 1


def gold_due(annotator: str, assignments: int, gold_share: float) -> bool:
    """Whether an annotator's next assignment (after ``assignments`` so far) is a gold item.

    A stable pseudo-random draw per (annotator, position): a ``gold_share`` of each stream on
    average, with no period an annotator could learn.
    """
    return gold_share > 0 and stable_fraction(f"gold:{annotator}:{assignments}") < gold_share


def has_free_slot(needs: int, scored: int, held_by_others: int) -> bool:
    """An item can go to one more annotator. (The store's Lua scripts apply this same rule.)"""
    return scored + held_by_others < needs


def is_stale(assigned_until: float, now: float) -> bool:
    return now >= assigned_until


def deadline_of(enqueued_at: float, rules: Rules) -> float:
    return enqueued_at + rules.annotation_deadline_s


def final_reward(scores: Sequence[Score]) -> FinalReward:
    """The sample's reward from its human scores: their mean, who gave them, any unsafe flag."""
    if not scores:
        raise ValueError("a final reward needs at least one score")
    values = [s.score for s in scores]
    return FinalReward(reward=statistics.fmean(values), spread=statistics.pstdev(values),
                       annotators=",".join(s.annotator for s in scores), unsafe=any(s.unsafe for s in scores))


# -- validation --------------------------------------------------------------------------------------

def check_score(score: float, field: str = "score") -> float:
    if not math.isfinite(score):
        raise InvalidRequestError(field, f"must be a finite number, got {score}")
    if not SCORE_MIN <= score <= SCORE_MAX:
        raise InvalidRequestError(field, f"must be in [{SCORE_MIN:g}, {SCORE_MAX:g}], got {score:g}")
    return float(score)


def check_annotator(annotator: str, field: str = "annotator_id") -> str:
    if not annotator:
        raise InvalidRequestError(field, "must not be empty (which annotator is asking?)")
    if not ANNOTATOR_ID.fullmatch(annotator):
        raise InvalidRequestError(field, "must be 1-64 letters, digits or . _ @ -")
    return annotator


def check_item_id(item_id: str, field: str = "item_id") -> str:
    if not item_id:
        raise InvalidRequestError(field, "must not be empty")
    if not ITEM_ID.fullmatch(item_id):
        raise InvalidRequestError(field, "is not an item id (as Next returned it)")
    return item_id


def parse_gold(value: object, where: str) -> GoldItem:
    """One line of the gold file: ``{"prompt": ..., "response": ..., "score": 0-5}``. Errors name
    ``where`` (file:line) and never quote the texts."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected an object with prompt, response and score")
    prompt, response, score = value.get("prompt"), value.get("response"), value.get("score")
    for name, text in (("prompt", prompt), ("response", response)):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{where}: {name} must be a non-empty string")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise ValueError(f"{where}: score must be a number")
    try:
        known = check_score(float(score))
    except InvalidRequestError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    return GoldItem(prompt, response, known)  # type: ignore[arg-type]
