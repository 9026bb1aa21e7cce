"""Generation backends behind one interface: Hugging Face transformers (default) and vLLM (GPU)."""

from __future__ import annotations

from svc_generator.backends.base import Backend, GenerationOutput, GenerationRequest
from svc_generator.config import GeneratorSettings


def create_backend(settings: GeneratorSettings, model_path: str) -> Backend:
    """The configured backend; vLLM is imported only when selected (extra ``vllm``, GPU)."""
    if settings.backend == "vllm":
        from svc_generator.backends.vllm_backend import VllmBackend

        return VllmBackend(model_path, settings)
    from svc_generator.backends.hf import HfBackend

    return HfBackend(model_path, settings.device, settings.dtype)


__all__ = ["Backend", "GenerationOutput", "GenerationRequest", "create_backend"]
