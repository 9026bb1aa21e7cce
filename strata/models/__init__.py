"""Loading and running Hugging Face models from local paths (generators, probe, reward models)."""

from strata.models.loading import (
    LoadedModel,
    ModelLoadError,
    load_causal_lm,
    load_reward_model,
    resolve_device,
    resolve_dtype,
)

__all__ = [
    "LoadedModel",
    "ModelLoadError",
    "load_causal_lm",
    "load_reward_model",
    "resolve_device",
    "resolve_dtype",
]
