"""The reward models in service: light RM (or ensemble) and strong RM, each with its version (R7).

Scoring happens under a lock so that a later hot swap (``swap_light``) takes effect between batches:
a batch is scored entirely by one version, and every reward carries the version that produced it.

The light RM's score calibration (``svc_reward.calibration_store``, fitted by ``strata calibrate
escalation --write``) is read with its weights and swapped with them: a batch's calibrated scores
come from the calibration of the version that scored it. A calibration fitted for other weights,
or a malformed file, is logged and ignored: the version is served uncalibrated.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata import ledger
from strata.contract.checksums import version_id, weights_checksum
from strata.devicetime import device_clock
from strata.models.loading import LoadedModel, load_reward_model
from strata.models.reward import reward_logits_and_lengths
from svc_reward.calibrate import ScoreCalibration
from svc_reward.calibration_store import calibration_path, read_calibration, read_rule, rule_path
from svc_reward.escalation_rule import EscalationRule
from svc_reward.scoring import aggregate, tempered_reward

if TYPE_CHECKING:
    from svc_reward.config import RewardSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scores:
    rewards: list[float]
    spreads: list[float]
    version: str
    charges: list[ledger.Charge]  # each item's cost, every ensemble member included (R4)
    calibrated: list[float] | None = None  # rewards on the oracle's scale: light RM with a calibration only
    calibrated_threshold: float | None = None  # the escalation threshold stored with that calibration
    rule: EscalationRule | None = None  # the learned escalation rule stored with the light RM that scored


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
    spread_k: float = 1.0  # the spread's weight under the lcb aggregation

    @classmethod
    def of(cls, settings: RewardSettings) -> ScoringOptions:
        """The service's settings (or their defaults, as a tool reads them)."""
        return cls(settings.device, settings.dtype, settings.temperature, settings.aggregation,
                   settings.score_batch_size, settings.max_length, settings.aggregation_spread_k)


@dataclass
class _Scorer:
    members: list[LoadedModel]
    version: str
    calibration: ScoreCalibration | None = None  # light RM only, fitted for these weights
    rule: EscalationRule | None = None  # light RM only: the learned escalation rule fitted for these weights


def served_calibration(paths: Sequence[str], options: ScoringOptions) -> ScoreCalibration | None:
    """The calibration stored with the light RM ``paths`` (first member's directory), if it was
    fitted for exactly these weights and scores computed as ``options`` computes them; otherwise
    None, with a warning saying why."""
    directory = paths[0]
    try:
        calibration = read_calibration(directory)
        if calibration is None:
            return None
        checksum = weights_checksum(paths)
    except (OSError, ValueError) as exc:  # a bad file must not stop the service: it serves raw scores
        log.warning("calibration %s not usable, serving uncalibrated: %s", calibration_path(directory), exc)
        return None
    if calibration.checksum != checksum:
        log.warning("calibration in %s was fitted for %s, weights are %s: serving uncalibrated", directory,
                    calibration.checksum[:12] or "unknown weights", checksum[:12])
        return None
    if calibration.temperature is not None and calibration.temperature != options.temperature:
        log.warning("calibration in %s was fitted on scores at temperature %s, served at %s: serving uncalibrated",
                    directory, calibration.temperature, options.temperature)
        return None
    if len(paths) > 1 and calibration.aggregation not in (None, options.aggregation):
        log.warning("calibration in %s was fitted on the members' %s, served with their %s: serving uncalibrated",
                    directory, calibration.aggregation, options.aggregation)
        return None
    log.info("light RM calibration from %s: %d knots, fitted on %d answers", directory, len(calibration.raw),
             calibration.answers)
    return calibration


def served_rule(paths: Sequence[str]) -> EscalationRule | None:
    """The escalation rule stored with the light RM ``paths`` (first member's directory), if it was fitted
    for exactly these weights; otherwise None (the threshold decides), with a warning saying why."""
    directory = paths[0]
    try:
        rule = read_rule(directory)
        if rule is None:
            return None
        checksum = weights_checksum(paths)
    except (OSError, ValueError) as exc:  # a bad file must not stop the service: the threshold decides
        log.warning("escalation rule %s not usable, escalating on the threshold: %s", rule_path(directory), exc)
        return None
    if rule.checksum != checksum:
        log.warning("escalation rule in %s was fitted for %s, weights are %s: escalating on the threshold",
                    directory, rule.checksum[:12] or "unknown weights", checksum[:12])
        return None
    log.info("light RM escalation rule from %s: %s, escalating at P(bad) >= %.3f", directory,
             ", ".join(rule.features), rule.threshold)
    return rule


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
        if prefix != "light":
            return _Scorer(members, version)
        return _Scorer(members, version, served_calibration(paths, self._options), served_rule(paths))

    @property
    def light_version(self) -> str:
        return self._light.version

    @property
    def light_calibration(self) -> ScoreCalibration | None:
        """The served light RM's calibration (None: its scores are served uncalibrated)."""
        return self._light.calibration

    @property
    def strong_version(self) -> str | None:
        return self._strong.version if self._strong else None

    @property
    def has_strong(self) -> bool:
        return self._strong is not None

    def swap_light(self, paths: Sequence[str], version: str) -> None:
        """Load a new light RM version and its calibration, then switch to both between two batches (R7)."""
        fresh = self._load(paths, version, "light")
        if fresh.calibration is None and self._light.calibration is not None:
            log.warning("light RM %s has no calibration, %s had one: with use_calibration, the escalation threshold "
                        "now compares raw scores (strata calibrate escalation --light-rm %s --write)", fresh.version,
                        self._light.version, ",".join(paths))
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
            rewards, spreads = aggregate(member_rewards, self._options.aggregation, self._options.spread_k)
            seconds = self._clock() - started
        charges = self._charges(scorer, tokens, seconds, strong)
        raw = rewards.tolist()
        calibration = scorer.calibration
        calibrated = calibration.apply_all(raw) if calibration is not None else None
        return Scores(raw, spreads.tolist(), scorer.version, charges, calibrated,
                      calibration.escalation_threshold if calibration is not None else None, scorer.rule)

    def _charges(self, scorer: _Scorer, tokens: list[int], seconds: float, strong: bool) -> list[ledger.Charge]:
        """Each item's share of the batch's time by its tokens, as read by the RM (truncated)."""
        params = sum(m.n_params for m in scorer.members)
        stage, tier = ("rm_strong", 2) if strong else ("rm_light", 1)
        return [ledger.Charge(stage, tier, n, share, float(params) * n, items=len(scorer.members), params=float(params))
                for n, share in zip(tokens, ledger.split_by_tokens(seconds, tokens), strict=True)]
