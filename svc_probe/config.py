"""Settings of the Level-0 probe (R1)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from strata import risk
from strata.config import StrataSettings

# Safety net beside the model's own risk head: strata.risk's keywords (R3), the scheduler's too,
# matched as whole words ("lease" is not in "please").
DEFAULT_RISK_KEYWORDS = ",".join(risk.MEDICAL_KEYWORDS + risk.LEGAL_KEYWORDS)


class ProbeSettings(StrataSettings):
    """``python -m svc_probe``; every field is also ``STRATA_<NAME>``."""

    model: str | None = Field(None, description="local causal-LM directory; unset = the zoo's probe")
    probe_method: Literal["auto", "head", "likelihood"] = Field(
        "auto", description="auto: the directions head when the model directory has one (strata probe train), "
        "else the likelihood of the direction names, on the zoo's probe only; head; likelihood (any LM)"
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    dtype: str = Field("auto", description="auto, float32, bfloat16, float16")
    grpc_port: int = Field(50052, ge=0, le=65535)
    top_k: int = Field(3, ge=1, description="directions returned per prompt (R1: 3)")
    forward_directions: int = Field(
        1, ge=0, description="of the top_k directions, how many the probe forwards with each prompt: the generator's "
        "Directions: line (the API still returns top_k). Three directions lowered Level-1's oracle mean on the default "
        "zoo where one did not (strata bench level0; its run is in docs/results.md)")
    min_confidence: float = Field(
        0.3, ge=0, le=1, description="below this top-direction probability the probe is cautious (low confidence)"
    )
    risk_threshold: float = Field(0.5, ge=0, le=1, description="P(risk) above which the prompt is cautious")
    risk_keywords: str = Field(
        DEFAULT_RISK_KEYWORDS, description="comma-separated risk-topic keywords, matched as whole words or phrases"
    )
    max_prompt_chars: int = Field(8000, ge=1)
    max_prompt_tokens: int = Field(128, ge=8, description="prompt tokens the probe reads (the rest is cut)")
    torch_threads: int | None = Field(
        1, ge=1, description="torch CPU threads of this process on the CPU (unset: torch's default, one per core); "
        "a small model's one forward gains nothing from more, and spinning threads stall when other services "
        "share the cores (docs/performance.md)")
    group_id: str = Field("svc-probe", description="consumer group of the Level-0 topic")

    def keywords(self) -> tuple[str, ...]:
        return tuple(k.strip().lower() for k in self.risk_keywords.split(",") if k.strip())
