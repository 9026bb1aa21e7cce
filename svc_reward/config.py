"""Settings of the reward service (R2, R3, R5-R8)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from strata.config import StrataSettings
from strata.errors import ServiceConfigError
from strata.rpc_auth import TokenFileError, TokenTable
from svc_reward.decide import describe_threshold

if TYPE_CHECKING:
    from svc_reward.calibrate import ScoreCalibration


class RewardSettings(StrataSettings):
    """``python -m svc_reward``; every field is also ``STRATA_<NAME>``."""

    light_rm: str | None = Field(
        None, description="light RM directory, or several separated by commas for an ensemble (R8); unset = zoo"
    )
    strong_rm: str | None = Field(None, description="strong RM directory (Level-2), or an ensemble directory of "
                                  "members (`strata rm ensemble`: their mean score); unset = the zoo's")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    dtype: str = Field("auto", description="auto, float32, bfloat16, float16")
    grpc_port: int = Field(50056, ge=0, le=65535)
    escalation_threshold: float | None = Field(
        None, description="Level-1 rewards under this escalate to Level-2 (R3); on the oracle's 0-5 scale (the light "
        "RM's calibrated score) when the served light RM has a calibration and use_calibration is on, else on the "
        "raw score's: `strata calibrate escalation` prints both. Unset: the threshold stored with the served light "
        "RM's calibration (`strata calibrate escalation --write`: the lowest catching its target share of bad "
        "cases), so that a promoted version brings its own; without one, the brief's 3.2"
    )
    use_calibration: bool = Field(
        True, description="compare the escalation threshold with the light RM's calibrated score (oracle scale) when "
        "the served light RM has a calibration (`strata calibrate escalation --write`); off: the raw score. The "
        "published reward is the raw score either way"
    )
    escalate_on_caution: bool = Field(True, description="a cautious Level-1 sample escalates whatever its score")
    temperature: float = Field(
        1.0, gt=0, description="scoring temperature on the RM's score bins; < 1 sharpens (R8 suggests 0.3)"
    )
    aggregation: Literal["mean", "median", "min", "lcb"] = Field(
        "mean", description="how ensemble members are combined (R8): mean, median, or conservatively (issue 61) "
        "min, or lcb = mean - aggregation_spread_k x the members' spread"
    )
    aggregation_spread_k: float = Field(1.0, ge=0, description="the spread's weight in the lcb aggregation")
    annotate_level2: bool = Field(True, description="request human annotation for Level-2 samples (R3)")
    annotate_level1_share: float = Field(
        0.05, ge=0, le=1, description="share of Level-1 answers also sent to the annotators, drawn by response hash: "
        "fresh on-policy labels for `strata rm refresh` (the RMs otherwise see humans score only escalations); "
        "their routing never waits on the score; each is booked as human review"
    )
    await_annotation: bool | None = Field(
        None, description="a Level-2 reward sent for annotation is not final: svc_annotation publishes the final "
        "reward (the human score, or this one past its deadline; docs/annotation.md). Unset: on wherever the desk "
        "has annotators (annotators_file names one), as the article's Level-2 is the large model plus human review"
    )
    annotators_file: Path | None = Field(
        None, description="the desk's annotators: svc_annotation's tokens file ('<name> <token>' lines), where a "
        "desk runs; naming one turns await_annotation on by default. Not the shared grpc_tokens_file: a stack "
        "can check tokens without running a desk, and then nobody would ever score"
    )
    flag_unsafe: bool = Field(
        True, description="flag responses with unsafe advice (strata.risk): never reused, never final at Level-1 (R12)"
    )
    review_seconds_per_item: float = Field(
        60.0, ge=0, description="human seconds one annotation costs, booked in the ledger apart from device time"
    )
    # -- live audit (issue 61, strata/audit.py) -------------------------------------------------------
    audit_level1_share: float = Field(
        0.05, ge=0, le=1, description="share of Level-1 answers (escalated or not, drawn by response hash) also "
        "scored by the strong RM: the live hacking gap, catch and false-pass estimates; booked as rm_strong at "
        "tier 1. 0: off (and off where no strong RM is loaded)"
    )
    audit_bad_below: float | None = Field(
        None, ge=0, le=5, description="an audited answer whose strong-RM reward is under this counts as bad (the "
        "catch and false-pass estimates); unset: under the escalation threshold served with the light RM, the "
        "strong score read on that threshold's scale (the strong RM's own score would have escalated it)"
    )
    hacking_gap_bound: float = Field(
        0.25, ge=0, description="the hacking alarm fires when the gap between the light RM and a judge (the "
        "strong RM, or people at the desk) grew by more than this (one-sided 95 %) from the first audited policy "
        "versions to the newest"
    )
    hacking_min_audits: int = Field(
        30, ge=2, description="audits a window of policy versions needs before its gap is compared"
    )
    audit_ttl_s: int = Field(7 * 24 * 3600, ge=1, description="how long a policy version's audit tally is kept")
    audit_refresh_s: float = Field(
        10.0, ge=0, description="how often (at most) a replica re-reads the audit tallies for its gauges, the alarm "
        "and the defence, after a batch with audits"
    )
    audit_labels_kept: int = Field(
        50_000, ge=0, description="audited answers whose strong-RM reward is kept as a label for `strata rm refresh` "
        "(a Redis stream, newest kept; 0: none)"
    )
    hacking_defence: bool = Field(
        True, description="while the hacking alarm fires, raise the strong-RM share of Level-1 answers (their "
        "published reward the strong RM's), brake the learner's KL coefficient and request a re-distillation of the "
        "light RM (svc_reward/defence.py); off: the alarm only reports"
    )
    defence_share_step: float = Field(
        0.1, gt=0, le=1, description="share added per newer policy version the alarm fires on (and taken off per "
        "version once the gap's growth is under half hacking_gap_bound)"
    )
    defence_max_share: float = Field(
        0.5, ge=0, le=1, description="the most the defence adds to audit_level1_share"
    )
    defence_kl_factor: float = Field(
        2.0, ge=1, description="the KL brake: the learner's KL coefficient is multiplied by this per newer policy "
        "version the alarm fires on (and divided by it per version once the gap's growth is under half "
        "hacking_gap_bound); 1: off"
    )
    defence_max_kl_scale: float = Field(
        8.0, ge=1, description="the most the KL brake multiplies the learner's KL coefficient by"
    )
    light_rm_version: str | None = Field(None, description="version label of the light RM; unset = from checksum")
    strong_rm_version: str | None = Field(None, description="version label of the strong RM; unset = from checksum")
    max_items_per_request: int = Field(256, ge=1, description="largest Score request")
    max_text_chars: int = Field(16000, ge=1, description="longest prompt or response scored")
    score_batch_size: int = Field(32, ge=1, description="RM forward batch size")
    max_length: int = Field(256, ge=16, description="tokens of (prompt, response) the RM reads")
    group_id: str = Field("svc-reward", description="consumer group of the rollout-generated topic")
    # Hot swap (R7, svc_reward/rm_watch.py).
    rm_watch: bool = Field(
        True, description="follow strata.rm.updated: serve the promoted light RM, swapped in between batches"
    )
    rm_verify_checksum: bool = Field(
        True, description="load a promoted RM only if its weights match the event's checksum"
    )
    rm_model_root: Path | None = Field(
        None, description="RmUpdated paths must lie under this directory (where `strata rm` writes versions); "
        "unset: any path (docs/reliability.md)"
    )

    def threshold_served(self, calibration: ScoreCalibration | None) -> str:
        """The log line saying which escalation threshold is served with the light RM's ``calibration``."""
        calibrated = self.use_calibration and calibration is not None
        return describe_threshold(self.escalation_threshold, calibrated,
                                  calibration.escalation_threshold if calibration is not None else None)

    def annotators(self) -> list[str]:
        """The client names of the desk's tokens file (``annotators_file``): who can score at the desk.
        [] when it is not set; ServiceConfigError naming the setting when the file is unusable."""
        if self.annotators_file is None:
            return []
        try:
            return [name for _, name in TokenTable.load(self.annotators_file).clients]
        except TokenFileError as exc:
            raise ServiceConfigError(f"--annotators-file (STRATA_ANNOTATORS_FILE), the desk's tokens file: {exc}"
                                     ) from exc

    def level2_humans(self) -> tuple[bool, str]:
        """Whether Level-2 rewards await the desk's human scores, and the sentence that says so at start."""
        if self.await_annotation is not None:
            if self.await_annotation:
                return True, ("Level-2 awaits human scores (await_annotation on): the strong RM's reward is "
                              "provisional until the desk scores the answer or its deadline passes")
            return False, ("Level-2 runs without humans (await_annotation off): the strong RM's reward is final; "
                           "the desk's scores, if any, reach the reward models only")
        if not self.annotate_level2:
            return False, ("Level-2 runs without humans: annotate_level2 is off, only answers with unsafe advice "
                           "go to the desk, and their strong-RM reward is final")
        names = self.annotators()
        if names:
            return True, (f"Level-2 awaits human scores: {len(names)} annotator(s) named in {self.annotators_file}; "
                          "the strong RM's reward is provisional until the desk scores the answer or its deadline "
                          "passes")
        return False, ("Level-2 runs without humans: no annotators named (set STRATA_ANNOTATORS_FILE to the desk's "
                       "tokens file, or STRATA_AWAIT_ANNOTATION=true); the strong RM's reward is final")
