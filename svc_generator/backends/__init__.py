"""Generation backends behind one interface: Hugging Face transformers (default) and vLLM (GPU)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from strata.errors import ServiceConfigError
from svc_generator.backends.base import Backend, GenerationOutput, GenerationRequest
from svc_generator.config import GeneratorSettings

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def create_backend(settings: GeneratorSettings, model_path: str) -> Backend:
    """The configured backend; vLLM is imported only when selected (extra ``vllm``, GPU).

    Rollout dropout (R17) asked for explicitly is refused where it cannot happen: vLLM's fused
    kernels have no dropout and no place for a hook, and a model with neither ``nn.Dropout`` modules
    nor attention / MLP blocks to hook would sample exactly as without it. By default (Level-1) it is
    switched off there with a warning that says why.
    """
    explicit = settings.rollout_dropout_enabled is True
    if settings.backend == "vllm":
        if explicit:
            raise ServiceConfigError("rollout_dropout_enabled=true needs backend=hf: the vllm backend cannot keep "
                                     "dropout on during rollout (R17); set backend=hf or rollout_dropout_enabled=false")
        if settings.wants_rollout_dropout:
            log.warning("rollout dropout (R17) is off on the vllm backend: its fused attention and MLP kernels have "
                        "no dropout and no place for a hook; backend=hf keeps it on (docs/models.md)")
        from svc_generator.backends.vllm_backend import VllmBackend

        return VllmBackend(model_path, settings)
    from svc_generator.backends.hf import HfBackend, can_drop_out

    backend = HfBackend(model_path, settings.device, settings.dtype)
    if settings.wants_rollout_dropout and not can_drop_out(backend.lm.model):
        model_type = getattr(backend.lm.model.config, "model_type", "unknown")
        why = (f"the {model_type!r} model at {model_path} has neither torch.nn.Dropout modules nor self_attn / mlp "
               "blocks to drop the outputs of, so rollout dropout would change nothing")
        if explicit:
            raise ServiceConfigError(f"rollout_dropout_enabled=true but {why}; set rollout_dropout_enabled=false")
        log.warning("rollout dropout (R17) is off: %s", why)
    return backend


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether rollout dropout changes what ``model`` samples (``hf.rollout_dropout``)."""
    from svc_generator.backends.hf import can_drop_out

    return can_drop_out(model)


__all__ = ["Backend", "GenerationOutput", "GenerationRequest", "create_backend", "has_dropout"]
