"""The reward models in service: light RM (or ensemble) and strong RM, each with its version (R7).

Scoring happens under a lock so that a later hot swap (``swap_light``) takes effect between batches:
a batch is scored entirely by one version, and every reward carries the version that produced it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata import ledger
from strata.contract.checksums import version_id, weights_checksum
from strata.devicetime import device_clock
from strata.models.loading import LoadedModel, load_reward_model
from strata.models.reward import reward_logits_and_lengths
from svc_reward.scoring import aggregate, tempered_reward

if TYPE_CHECKING:
    from svc_reward.config import RewardSettings


@dataclass(frozen=True)
class Scores:
    rewards: list[float]
    spreads: list[float]
    version: str
    charges: list[ledger.Charge]  # each item's cost, every ensemble member included (R4)


@dataclass(frozen=True)
class ScoringOptions:
    """How the reward models load and score: device and dtype, the scoring temperature and ensemble
    aggregation (R8), and the batch and token limits. Its defaults are RewardSettings': ``of``."""

    device: str
    dtype: str
    temperature: float
    aggregation: str
    batch_size: int
    max_length: int

    @classmethod
    def of(cls, settings: RewardSettings) -> ScoringOptions:
        """The service's settings (or their defaults, as a tool reads them)."""
        return cls(settings.device, settings.dtype, settings.temperature, settings.aggregation,
                   settings.score_batch_size, settings.max_length)


@dataclass
class _Scorer:
    members: list[LoadedModel]
    version: str


class RewardModels:
    def __init__(self, light_paths: Sequence[str], strong_path: str | None, options: ScoringOptions,
                 light_version: str | None = None, strong_version: str | None = None) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._light = self._load(light_paths, light_version, "light")
        self._strong = self._load([strong_path], strong_version, "strong") if strong_path else None
        self._clock = device_clock(self._light.members[0].device)  # device-seconds (R4)

    def _load(self, paths: Sequence[str], version: str | None, prefix: str) -> _Scorer:
        members = [load_reward_model(p, device=self._options.device, dtype=self._options.dtype) for p in paths]
        if version is None:
            version = "+".join(version_id(prefix, weights_checksum([p])) for p in paths)
        return _Scorer(members, version)

    @property
    def light_version(self) -> str:
        return self._light.version

    @property
    def strong_version(self) -> str | None:
        return self._strong.version if self._strong else None

    @property
    def has_strong(self) -> bool:
        return self._strong is not None

    def swap_light(self, paths: Sequence[str], version: str) -> None:
        """Load a new light RM version, then switch to it between two batches (R7)."""
        fresh = self._load(paths, version, "light")
        with self._lock:
            self._light = fresh

    def score(self, prompts: Sequence[str], responses: Sequence[str], strong: bool = False) -> Scores:
        with self._lock:
            started = self._clock()
            scorer = self._strong if strong else self._light
            if scorer is None:
                raise LookupError("no strong reward model is configured (--strong-rm)")
            member_rewards = []
            for i, m in enumerate(scorer.members):
                logits, lengths = reward_logits_and_lengths(m, prompts, responses, self._options.batch_size,
                                                             self._options.max_length)
                member_rewards.append(tempered_reward(logits, self._options.temperature))
                if i == 0:
                    tokens = lengths  # as the first member read them (the ledger's)
            rewards, spreads = aggregate(member_rewards, self._options.aggregation)
            seconds = self._clock() - started
        charges = self._charges(scorer, tokens, seconds, strong)
        return Scores(rewards.tolist(), spreads.tolist(), scorer.version, charges)

    def _charges(self, scorer: _Scorer, tokens: list[int], seconds: float, strong: bool) -> list[ledger.Charge]:
        """Each item's share of the batch's time by its tokens, as read by the RM (truncated)."""
        params = sum(m.n_params for m in scorer.members)
        stage, tier = ("rm_strong", 2) if strong else ("rm_light", 1)
        return [ledger.Charge(stage, tier, n, share, float(params) * n, items=len(scorer.members))
                for n, share in zip(tokens, ledger.split_by_tokens(seconds, tokens), strict=True)]
