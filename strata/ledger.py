"""The cost ledger (R4): what every stage of a rollout cost, in Redis, and the saving it implies.

Every service books its own stage when its work is done (and, where work can be redelivered, once:
the generator's claim winner, the reward worker with its done keys):

| stage          | booked by                         | tier | per item                                       |
|----------------|-----------------------------------|------|------------------------------------------------|
| ``encoder``    | the scheduler, per submitted prompt | 0  | the prompt's share of the batch's encode time  |
| ``probe``      | the probe worker, per prompt        | 0  | the prompt's share of the batch's forward time |
| ``generate``   | the generator, per sample           | 1, 2 | the sample's token share of its batch       |
| ``rm_light``   | the reward worker, per sample       | 1  | every ensemble member's share of the batch     |
| ``rm_strong``  | the reward worker, per sample       | 2  | the sample's token share of the batch          |
| ``human_review`` | the reward worker, per annotation request | 2 | configured seconds per item (not device time) |

Each charge carries device-seconds (measured on this machine) and parameters x tokens (the
FLOPs-proportional cost: ~2 x params x tokens for a forward pass, the same on every machine).
Charges are added to one aggregate hash per (stage, tier) and to one hash per (prompt, request),
so a report can be cut per stage, per tier and per prompt.

The saving against all-Level-2 needs a baseline: a measured one comes from ``strata bench tiers``
(every prompt of the same set at Level-2, scored by the strong RM). Without one, :func:`summarise`
gives an *estimate* and says so: every final sample priced once at the cost of one Level-2 sample
(generation + strong RM) measured in this ledger. An escalated prompt's Level-1 samples are not
final, so the baseline counts each prompt's sample once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import redis

STAGES = ("encoder", "probe", "generate", "rm_light", "rm_strong", "human_review")
METRICS = ("items", "tokens", "device_seconds", "param_tokens", "human_seconds")  # fields of Charge and StageCost
TIERS = (1, 2)
COUNTS_KEY = "strata:ledger:counts"
_STAGE_KEY = "strata:ledger:stage:{stage}:{tier}"
_REQUEST_KEY = "strata:ledger:request:{prompt_hash}:{request_id}"
# Level-2's cost per sample in the all-Level-2 baseline: its generation and the strong RM's score.
LEVEL2_SAMPLE_STAGES = (("generate", 2), ("rm_strong", 2))


@dataclass(frozen=True)
class Charge:
    """One stage's cost for one item (a prompt, a sample, an annotation)."""

    stage: str
    tier: int
    tokens: int = 0
    device_seconds: float = 0.0
    param_tokens: float = 0.0
    human_seconds: float = 0.0
    items: int = 1
    params: float = 0.0  # parameters of the model that did the work (its ensemble's, summed); 0 for people

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"unknown ledger stage {self.stage!r}; one of {', '.join(STAGES)}")


@dataclass(frozen=True)
class StageCost:
    stage: str
    tier: int
    items: int = 0
    tokens: int = 0
    device_seconds: float = 0.0
    param_tokens: float = 0.0
    human_seconds: float = 0.0
    params: float = 0.0  # the size of the model booked last at this stage (0: unknown, an older ledger)

    @property
    def seconds_per_token(self) -> float | None:
        return self.device_seconds / self.tokens if self.tokens else None


@dataclass(frozen=True)
class TierCost:
    """Generation at one tier (kept for the tier-mix views)."""

    tier: int
    rollouts: int
    tokens: int
    device_seconds: float

    @property
    def seconds_per_token(self) -> float | None:
        return self.device_seconds / self.tokens if self.tokens else None


@dataclass(frozen=True)
class Baseline:
    """What the same work would have cost at Level-2, and how that figure was obtained."""

    device_seconds: float
    param_tokens: float
    label: str                # e.g. "estimate: 366 final samples x Level-2's cost per sample here"
    measured: bool            # True only for a baseline run on the same prompts


@dataclass(frozen=True)
class CostSummary:
    stages: tuple[StageCost, ...]
    counts: Mapping[str, int]  # escalations, final_tier1, final_tier2, ...
    baseline: Baseline | None
    tiers: tuple[TierCost, ...] = field(default=())

    @property
    def total_device_seconds(self) -> float:
        return sum(s.device_seconds for s in self.stages)

    @property
    def total_param_tokens(self) -> float:
        return sum(s.param_tokens for s in self.stages)

    @property
    def human_seconds(self) -> float:
        return sum(s.human_seconds for s in self.stages)

    @property
    def all_level2_device_seconds(self) -> float | None:
        return self.baseline.device_seconds if self.baseline else None

    @property
    def saving(self) -> float | None:
        """1 - device-seconds / the baseline's (None without a baseline)."""
        if self.baseline is None or not self.baseline.device_seconds:
            return None
        return 1.0 - self.total_device_seconds / self.baseline.device_seconds

    @property
    def param_token_saving(self) -> float | None:
        if self.baseline is None or not self.baseline.param_tokens:
            return None
        return 1.0 - self.total_param_tokens / self.baseline.param_tokens

    def tier(self, tier: int) -> TierCost:
        return next(t for t in self.tiers if t.tier == tier)


def charge_generation(tier: int, params: int, prompt_tokens: int, response_tokens: int,
                      device_seconds: float) -> Charge:
    # The forward pass reads the prompt once and each new token once (with the KV cache).
    return Charge("generate", tier, response_tokens, device_seconds, float(params) * (prompt_tokens + response_tokens),
                  params=float(params))


def split_by_tokens(total_seconds: float, tokens: Sequence[int]) -> list[float]:
    """A batch's time shared by its items in proportion to their tokens (equally if none)."""
    total = sum(tokens)
    if not tokens:
        return []
    if total <= 0:
        return [total_seconds / len(tokens)] * len(tokens)
    return [total_seconds * t / total for t in tokens]


def book(client: redis.Redis, prompt_hash: str, request_id: str, charges: Iterable[Charge], ttl_s: int,
         pipe: redis.client.Pipeline | None = None) -> None:
    """Add ``charges`` to the aggregates and to the (prompt, request) record; one round trip.

    Pass ``pipe`` to add the writes to a caller's transaction (e.g. with its done keys).
    """
    own = pipe is None
    target = pipe if pipe is not None else client.pipeline(transaction=True)
    request_key = _REQUEST_KEY.format(prompt_hash=prompt_hash, request_id=request_id or "-")
    for c in charges:
        stage_key = _STAGE_KEY.format(stage=c.stage, tier=c.tier)
        for name in METRICS:
            value = getattr(c, name)
            if not value:
                continue
            if isinstance(value, int):
                target.hincrby(stage_key, name, value)
                target.hincrby(request_key, f"{c.stage}:{c.tier}:{name}", value)
            else:
                target.hincrbyfloat(stage_key, name, value)
                target.hincrbyfloat(request_key, f"{c.stage}:{c.tier}:{name}", value)
        if c.params:  # a size, not a sum: the newest booking's (a promoted RM version may differ in size)
            target.hset(stage_key, "params", c.params)
            target.hset(request_key, f"{c.stage}:{c.tier}:params", c.params)
        target.expire(request_key, ttl_s)
    if own:
        target.execute()


def count(client: redis.Redis, name: str, amount: int = 1) -> None:
    client.hincrby(COUNTS_KEY, name, amount)


_COUNTED = ("items", "tokens")  # integers; the other metrics are floats


def _stage_cost(stage: str, tier: int, raw: Mapping[str, str]) -> StageCost:
    metrics: dict[str, Any] = {name: (int if name in _COUNTED else float)(raw.get(name, 0)) for name in METRICS}
    return StageCost(stage, tier, **metrics, params=float(raw.get("params", 0)))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decode(raw: Mapping[Any, Any]) -> dict[str, str]:
    return {_text(k): _text(v) for k, v in raw.items()}


def estimate_baseline(stages: Sequence[StageCost], counts: Mapping[str, int]) -> Baseline | None:
    """Every final sample once at Level-2's measured cost per sample; None without a Level-2 sample."""
    level2 = [s for s in stages if (s.stage, s.tier) in LEVEL2_SAMPLE_STAGES]
    generated = next((s.items for s in level2 if s.stage == "generate"), 0)
    finals = sum(v for k, v in counts.items() if k.startswith("final_tier"))
    if not generated or not finals:
        return None
    per_sample_seconds = sum(s.device_seconds for s in level2) / generated
    per_sample_param_tokens = sum(s.param_tokens for s in level2) / generated
    return Baseline(finals * per_sample_seconds, finals * per_sample_param_tokens,
                    f"estimate, not measured: {finals} final samples x the cost of one Level-2 sample "
                    f"(generation + strong RM) measured here over {generated} Level-2 samples; "
                    "`strata bench tiers` measures the baseline on the same prompts", measured=False)


def summarise(stages: Sequence[StageCost], counts: Mapping[str, int], baseline: Baseline | None = None
              ) -> CostSummary:
    """Totals and the saving; without a measured ``baseline`` the estimate (see the module doc)."""
    if baseline is None:
        baseline = estimate_baseline(stages, counts)
    tiers = tuple(TierCost(s.tier, s.items, s.tokens, s.device_seconds)
                  for s in stages if s.stage == "generate")
    return CostSummary(tuple(stages), dict(counts), baseline, tiers)


def read_stages(client: redis.Redis) -> list[StageCost]:
    stages = []
    for stage in STAGES:
        for tier in (0, 1, 2):
            raw = _decode(client.hgetall(_STAGE_KEY.format(stage=stage, tier=tier)))
            if raw or (stage == "generate" and tier in TIERS):
                stages.append(_stage_cost(stage, tier, raw))
    return stages


def read_counts(client: redis.Redis) -> dict[str, int]:
    return {_text(k): int(v) for k, v in client.hgetall(COUNTS_KEY).items()}


def read(client: redis.Redis, baseline: Baseline | None = None) -> CostSummary:
    return summarise(read_stages(client), read_counts(client), baseline)


def read_request(client: redis.Redis, prompt_hash: str, request_id: str) -> list[StageCost]:
    """One (prompt, request)'s charges, per stage and tier."""
    raw = _decode(client.hgetall(_REQUEST_KEY.format(prompt_hash=prompt_hash, request_id=request_id or "-")))
    return _group(raw)


def read_prompt(client: redis.Redis, prompt_hash: str) -> dict[str, list[StageCost]]:
    """Every request of one prompt: request id -> its charges."""
    prefix = _REQUEST_KEY.format(prompt_hash=prompt_hash, request_id="")
    out = {}
    for key in client.scan_iter(match=f"{prefix}*", count=500):
        request_id = _text(key)[len(prefix):]
        out[request_id] = _group(_decode(client.hgetall(key)))
    return out


def _group(raw: Mapping[str, str]) -> list[StageCost]:
    fields: dict[tuple[str, int], dict[str, str]] = {}
    for name, value in raw.items():
        stage, tier, metric = name.rsplit(":", 2)
        fields.setdefault((stage, int(tier)), {})[metric] = value
    order = sorted(fields, key=lambda key: (STAGES.index(key[0]) if key[0] in STAGES else len(STAGES), key))
    return [_stage_cost(stage, tier, fields[(stage, tier)]) for stage, tier in order]


def subtract(after: Sequence[StageCost], before: Sequence[StageCost]) -> list[StageCost]:
    """Charges booked between two reads of the aggregates (a bench arm's cost)."""
    earlier = {(s.stage, s.tier): s for s in before}
    out = []
    for s in after:
        b = earlier.get((s.stage, s.tier), StageCost(s.stage, s.tier))
        out.append(replace(s, **{name: getattr(s, name) - getattr(b, name) for name in METRICS}))
    return out


def add(first: Sequence[StageCost], second: Sequence[StageCost]) -> list[StageCost]:
    """Two spans' charges together, stage by stage (an arm run in parts)."""
    totals = {(s.stage, s.tier): s for s in first}
    for s in second:
        a = totals.get((s.stage, s.tier), StageCost(s.stage, s.tier))
        totals[(s.stage, s.tier)] = replace(s, params=s.params or a.params,
                                            **{name: getattr(a, name) + getattr(s, name) for name in METRICS})
    return list(totals.values())


_TIER_LABEL = {0: "-", 1: "Level-1", 2: "Level-2"}


def stage_table(stages: Sequence[StageCost]) -> list[str]:
    """Rows of device-seconds, tokens and params x tokens per stage and tier."""
    lines = [f"{'stage':<13} {'tier':<8} {'items':>7} {'tokens':>9} {'device s':>10} {'ms/token':>9} "
             f"{'params x tokens':>16} {'human s':>9}"]
    for s in stages:
        per_token = f"{1000 * s.seconds_per_token:.2f}" if s.seconds_per_token else "-"
        human = f"{s.human_seconds:.0f}" if s.human_seconds else "-"
        lines.append(f"{s.stage:<13} {_TIER_LABEL.get(s.tier, str(s.tier)):<8} {s.items:>7} {s.tokens:>9} "
                     f"{s.device_seconds:>10.2f} {per_token:>9} {s.param_tokens:>16.3g} {human:>9}")
    return lines
