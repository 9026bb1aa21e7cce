"""Settings of ``strata diagnose``: where the services are and every check's thresholds.

Each field is a ``--flag`` and a ``STRATA_<NAME>`` variable. Addresses default to the local stack's
ports (``strata stack``: scheduler 50051, probe 50052, generator-l1 50053, generator-l2 50054, learner
50055, reward 50056) and metrics ports (9150 + the same last digit, see docs/observability.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field

from strata.config import StrataSettings
from strata_tools.diagnose.memory import MIB, MemoryConfig
from strata_tools.diagnose.repetition import DEFAULT_PROMPT, RepetitionConfig
from strata_tools.diagnose.rm_noise import RmNoiseConfig
from strata_tools.diagnose.rm_overfit import RmOverfitConfig

if TYPE_CHECKING:
    from strata_tools.diagnose.shift import ShiftConfig


class DiagnoseSettings(StrataSettings):
    """``strata diagnose rm-noise|shift|rm-overfit|memory|repetition|all``."""

    # Where the services are.
    reward_address: str = Field("127.0.0.1:50056", description="svc_reward gRPC address")
    ensemble_reward_address: str | None = Field(
        None, description="a second svc_reward configured with the R8 ensemble/temperature, shown beside rm-noise"
    )
    generator_address: str = Field("127.0.0.1:50053", description="Level-1 svc_generator gRPC address")
    generator_l2_address: str = Field("127.0.0.1:50054", description="Level-2 svc_generator gRPC address")
    generator_tier: Literal[1, 2] = Field(1, description="which generator memory and repetition check")
    generator_metrics_url: str = Field(
        "http://127.0.0.1:9153/metrics", description="Prometheus endpoint of the checked generator (memory)"
    )
    learner_address: str = Field("127.0.0.1:50055", description="svc_learner gRPC address (current policy)")
    annotation_address: str = Field("127.0.0.1:50057", description="svc_annotation gRPC address (annotator drift)")
    rpc_timeout_s: float = Field(300.0, gt=0, description="deadline of one gRPC call")
    generate_chunk: int = Field(8, ge=1, description="samples per Generate call (<= the generator's limit)")
    items_seed: int = Field(0, description="seed of the default (prompt, response) items")

    # rm-noise
    rm_noise_responses: int = Field(100, ge=1, description="responses scored repeatedly")
    rm_noise_repeats: int = Field(10, ge=2, description="scorings of each response")
    rm_noise_max_spread: float = Field(0.1, ge=0, description="mean per-response std (0-5) above which it alarms")
    pairs_file: Path | None = Field(
        None, description="JSONL of {prompt, response, score?} to score instead of the zoo suite's fresh pairs"
    )

    # shift
    shift_min_mean_logprob: float = Field(-150.0, description="mean rollout log-prob under which it alarms")
    shift_samples: int = Field(64, ge=1, description="most recent rollouts read from strata.rollouts.generated")
    shift_window_s: float = Field(3600.0, gt=0, description="only rollouts generated this recently count")
    shift_tier: int = Field(1, ge=0, le=2, description="tier of the rollouts read (1: the policy's; 0: all)")
    shift_policy: str | None = Field(None, description="policy directory; unset = the learner's current checkpoint")
    shift_device: str = Field("auto", description="device for the policy forward passes")

    # rm-overfit
    overfit_pairs: int = Field(120, ge=2, description="fresh (prompt, response) pairs scored")
    overfit_min_spearman: float = Field(0.7, description="Spearman under which it alarms")
    overfit_reference: Literal["oracle", "strong"] = Field(
        "oracle", description="rank against the oracle (or the pairs file's scores), or the strong RM"
    )

    # memory
    memory_rounds: int = Field(5, ge=1, description="rollout rounds measured after the warm-up")
    memory_warmup_rounds: int = Field(1, ge=0, description="rollout rounds before the baseline")
    memory_samples_per_round: int = Field(8, ge=1, description="responses per round")
    memory_max_growth_mib: float = Field(16.0, ge=0, description="growth per round (MiB) above which it alarms")

    # repetition
    repetition_rollouts: int = Field(20, ge=2, description="rollouts of the same prompt")
    repetition_max_duplicate_share: float = Field(0.4, ge=0, le=1, description="duplicate share above which it alarms")
    repetition_prompt: str = Field(DEFAULT_PROMPT, description="the prompt rolled out")
    repetition_temperature: float | None = Field(None, description="request this temperature; unset = the server's")
    repetition_top_p: float | None = Field(None, description="request this top_p; unset = the server's")

    # exporter (stack-wide metrics, strata_tools.diagnose.exporter)
    exporter_port: int = Field(9157, ge=0, le=65535, description="port of `strata diagnose exporter`'s /metrics")
    lag_groups: str = Field(
        "svc-scheduler-stats,svc-probe,svc-generator-l1,svc-generator-l2,svc-reward,svc-learner",
        description="consumer groups whose lag the exporter reports (comma-separated)",
    )

    @property
    def checked_generator(self) -> str:
        return self.generator_address if self.generator_tier == 1 else self.generator_l2_address

    def rm_noise(self) -> RmNoiseConfig:
        return RmNoiseConfig(self.rm_noise_responses, self.rm_noise_repeats, self.rm_noise_max_spread)

    def shift(self) -> ShiftConfig:
        from strata_tools.diagnose.shift import ShiftConfig  # torch: imported only when the check runs

        return ShiftConfig(self.shift_min_mean_logprob, self.shift_samples)

    def rm_overfit(self) -> RmOverfitConfig:
        return RmOverfitConfig(self.overfit_pairs, self.overfit_min_spearman)

    def memory(self) -> MemoryConfig:
        return MemoryConfig(self.memory_rounds, self.memory_warmup_rounds, self.memory_samples_per_round,
                            self.memory_max_growth_mib * MIB)

    def repetition(self) -> RepetitionConfig:
        return RepetitionConfig(self.repetition_rollouts, self.repetition_max_duplicate_share)
