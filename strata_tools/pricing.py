"""``--price-as``: the same measured decisions and tokens, priced at model sizes the user names (issue 62).

The zoo's models are tiny and their cost structure is the inverse of a deployment's: the scheduler's 22M
encoder and the RMs cost more per token than the 5M Level-1. The ledger books, per stage, the tokens
each model read and its size (``StageCost.params``), so params × tokens can be recomputed with another
size per role while every routing decision, escalation and token count stays the measured one. The
result is a **projection**, labelled so beside the measured ledger, which stays the headline: it holds
the work fixed and says nothing of a larger model's different answers (a larger Level-1 escalates
less, a larger light RM reads better).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from strata.ledger import Baseline, StageCost

# (stage, tier) -> the model role whose size prices it; the strong RM at tier 1 is the live audit's.
ROLE_OF: Mapping[tuple[str, int], str] = {
    ("encoder", 0): "encoder", ("probe", 0): "probe", ("generate", 1): "level1", ("generate", 2): "level2",
    ("rm_light", 1): "rm_light", ("rm_strong", 1): "rm_strong", ("rm_strong", 2): "rm_strong",
}
ROLES = ("encoder", "probe", "level1", "level2", "rm_light", "rm_strong")

# Named sizes: the article's (a 1.3B probe, 7B Level-1, 3B light RM, 13B Level-2; the strong RM as large
# as Level-2) and a common open-model deployment; the encoder is MiniLM's 22M in both.
PRESETS: Mapping[str, Mapping[str, float]] = {
    "article": {"encoder": 2.2e7, "probe": 1.3e9, "level1": 7e9, "rm_light": 3e9, "level2": 13e9, "rm_strong": 13e9},
    "deployment": {"encoder": 2.2e7, "probe": 1.3e9, "level1": 1.5e9, "rm_light": 1e9, "level2": 8e9,
                   "rm_strong": 8e9},
}


@dataclass(frozen=True)
class PriceAs:
    sizes: Mapping[str, float]  # role -> parameters
    label: str  # "article" or the sizes as given

    def describe(self) -> str:
        sizes = ", ".join(f"{role} {self.sizes[role]:.3g}" for role in ROLES if role in self.sizes)
        return f"projection at {self.label} sizes ({sizes}): the measured decisions and tokens, repriced"


def parse_price_as(text: str) -> PriceAs:
    """A preset name (``article``, ``deployment``) or ``role=size,...`` (e.g. ``level1=1.5e9,level2=8e9``);
    roles not named keep their measured size. ValueError naming what to fix."""
    text = text.strip()
    if text in PRESETS:
        return PriceAs(dict(PRESETS[text]), text)
    sizes: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        role, sep, value = part.partition("=")
        role = role.strip()
        if not sep or role not in ROLES:
            raise ValueError(f"--price-as: {part!r} is not role=size with a role in {', '.join(ROLES)} "
                             f"(or name a preset: {', '.join(PRESETS)})")
        try:
            size = float(value)
        except ValueError:
            raise ValueError(f"--price-as: the size of {role} ({value.strip()!r}) is not a number") from None
        if not size > 0:
            raise ValueError(f"--price-as: the size of {role} must be > 0, got {value.strip()}")
        sizes[role] = size
    if not sizes:
        raise ValueError(f"--price-as: give role=size pairs or a preset ({', '.join(PRESETS)})")
    return PriceAs(sizes, text)


def reprice(stages: Sequence[StageCost], price: PriceAs) -> tuple[list[StageCost], list[str]]:
    """``stages`` with params × tokens at ``price``'s sizes (each stage scaled by new size ÷ the size it ran
    at), and the stages left at their measured cost because the ledger does not say what size ran them."""
    out, unpriced = [], []
    for stage in stages:
        role = ROLE_OF.get((stage.stage, stage.tier))
        size = price.sizes.get(role) if role is not None else None
        if size is None or not stage.param_tokens:
            out.append(stage)
        elif not stage.params:
            out.append(stage)
            unpriced.append(f"{stage.stage}/{stage.tier}")
        else:
            out.append(replace(stage, param_tokens=stage.param_tokens * size / stage.params, params=size))
    return out, unpriced


def reprice_baseline(baseline: Baseline, measured: Sequence[StageCost], price: PriceAs) -> Baseline:
    """A measured baseline priced at ``price``: ``measured`` is the all-Level-2 arm's stages it summed."""
    repriced, _ = reprice(measured, price)
    return replace(baseline, param_tokens=sum(s.param_tokens for s in repriced),
                   label=f"{baseline.label}; repriced at {price.label} sizes")
