"""Generation backends behind one interface: Hugging Face transformers (default) and vLLM (GPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from strata.errors import ServiceConfigError
from svc_generator.backends.base import Backend, GenerationOutput, GenerationRequest
from svc_generator.config import GeneratorSettings

if TYPE_CHECKING:
    import torch


def create_backend(settings: GeneratorSettings, model_path: str) -> Backend:
    """The configured backend; vLLM is imported only when selected (extra ``vllm``, GPU).

    Rollout dropout (R17) is refused where it would not happen: vLLM's kernels have no dropout, and a
    model without ``nn.Dropout`` modules (Llama, Qwen2, Mistral apply attention dropout functionally)
    would sample exactly as without it.
    """
    if settings.backend == "vllm":
        if settings.rollout_dropout_enabled:
            raise ServiceConfigError("rollout_dropout_enabled=true needs backend=hf: the vllm backend cannot keep "
                                     "dropout on during rollout (R17); set backend=hf or rollout_dropout_enabled=false")
        from svc_generator.backends.vllm_backend import VllmBackend

        return VllmBackend(model_path, settings)
    from svc_generator.backends.hf import HfBackend

    backend = HfBackend(model_path, settings.device, settings.dtype)
    if settings.rollout_dropout_enabled and not has_dropout(backend.lm.model):
        model_type = getattr(backend.lm.model.config, "model_type", "unknown")
        raise ServiceConfigError(f"rollout_dropout_enabled=true but the {model_type!r} model at {model_path} has no "
                                 "torch.nn.Dropout modules, so rollout dropout would change nothing (its attention "
                                 "dropout is functional); set rollout_dropout_enabled=false, or serve a model with "
                                 "dropout layers (e.g. GPT-2)")
    return backend


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether ``model`` has modules that rollout dropout switches on (``hf.rollout_dropout``)."""
    import torch  # here: importing the package stays light (base.py's dataclasses)

    return any(isinstance(module, torch.nn.Dropout) for module in model.modules())


__all__ = ["Backend", "GenerationOutput", "GenerationRequest", "create_backend", "has_dropout"]
