"""Settings of one generator deployment (one tier)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from strata.config import StrataSettings
from strata.contract import limits
from strata.sampling import Sampling, SamplingBounds


class GeneratorSettings(StrataSettings):
    """``python -m svc_generator --tier 1 --model PATH``; every field is also ``STRATA_<NAME>``."""

    tier: Literal[1, 2] = Field(1, description="which tier this deployment serves (Level-1 or Level-2)")
    model: str | None = Field(None, description="local model directory; unset = the zoo's model for the tier")
    backend: Literal["hf", "vllm"] = Field("hf", description="hf (transformers, CPU or GPU) or vllm (GPU)")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    policy_checkpoint_root: Path | None = Field(
        None, description="PolicyUpdated paths must lie under this directory (the learner's --checkpoint-dir); "
        "unset: any path (docs/reliability.md)"
    )
    dtype: str = Field("auto", description="auto, float32, bfloat16, float16")
    grpc_port: int | None = Field(
        None, ge=0, le=65535, description="gRPC port; unset = 50053 for tier 1, 50054 for tier 2; 0 = any free port")

    # Dynamic batching (R15): requests that arrive together are generated in one batch.
    max_batch_size: int = Field(16, ge=1, description="most sequences per generate call")
    max_wait_ms: float = Field(20.0, ge=0, description="how long the first request waits for company")

    # Sampling defaults and the R16 bounds.
    temperature: float = Field(0.8, description="default sampling temperature")
    top_p: float = Field(0.9, description="default nucleus sampling threshold")
    max_new_tokens: int = Field(limits.DEFAULT_MAX_NEW_TOKENS, ge=1, description="default response length limit")
    min_temperature: float = Field(limits.MIN_TEMPERATURE, description="temperature must be above this (R16)")
    max_top_p: float = Field(limits.MAX_TOP_P, description="top_p must be below this (R16)")
    max_new_tokens_limit: int = Field(limits.MAX_NEW_TOKENS, ge=1, description="largest max_new_tokens asked")
    allow_out_of_range_sampling: bool = Field(False, description="accept R16 violations with a warning")
    rollout_dropout_enabled: bool | None = Field(
        None, description="keep dropout on during rollout (R17); unset: on for Level-1 where the backend can (hf: "
        "dropout modules, or hooks on attention and MLP outputs), off for Level-2 (a fixed model) and on vllm"
    )
    rollout_dropout: float = Field(0.1, ge=0, lt=1, description="dropout probability when on (R17)")

    # Request limits.
    max_prompt_chars: int = Field(limits.MAX_PROMPT_CHARS, ge=1, description="longest prompt accepted")
    max_samples_per_request: int = Field(limits.MAX_N_SAMPLES, ge=1, description="largest n_samples accepted")

    # Weights.
    policy_version: int = Field(0, ge=0, description="version stamped on rollouts until a policy update")
    follow_policy_updates: bool | None = Field(
        None, description="load weights from policy-updated events; unset = yes for tier 1, no for tier 2"
    )
    group_id: str | None = Field(None, description="consumer group; unset = svc-generator-l<tier>")

    @field_validator("tier", mode="before")
    @classmethod
    def _tier_from_text(cls, value: object) -> object:
        # STRATA_TIER=2 arrives as the text "2", which a Literal of ints does not take as 2.
        return int(value) if isinstance(value, str) and value.strip() in ("1", "2") else value

    @property
    def resolved_grpc_port(self) -> int:
        # 0 means a free port, as for every other service (tests run two tiers side by side).
        if self.grpc_port is not None:
            return self.grpc_port
        return 50053 if self.tier == 1 else 50054

    @property
    def follows_policy(self) -> bool:
        return self.tier == 1 if self.follow_policy_updates is None else self.follow_policy_updates

    @property
    def consumer_group(self) -> str:
        return self.group_id or f"svc-generator-l{self.tier}"

    @property
    def wants_rollout_dropout(self) -> bool:
        """Rollout dropout asked for, or by default (Level-1): the policy's rollouts, not Level-2's fixed model."""
        return self.tier == 1 if self.rollout_dropout_enabled is None else self.rollout_dropout_enabled

    def sampling_defaults(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.max_new_tokens, None,
                        self.rollout_dropout if self.wants_rollout_dropout else None)

    def sampling_bounds(self) -> SamplingBounds:
        return SamplingBounds(self.min_temperature, limits.MAX_TEMPERATURE, self.max_top_p, self.max_new_tokens_limit,
                              self.allow_out_of_range_sampling)
