"""What the vLLM backend runs inside vLLM's GPU worker: in-place weight reload from safetensors files.

vLLM's RLHF pattern (examples/offline_inference/rlhf_utils.py): a plain class named by its qualified
name as ``LLM(worker_extension_cls=...)`` is mixed into whatever worker class the engine uses, and its
methods are called on every worker with ``llm.collective_rpc(name, args=...)``. The worker may live
in another process (vLLM V1 runs the engine core apart), so the class must be importable by name there,
takes plain arguments (file paths) and returns plain values.

The method names carry a ``strata_`` prefix: vLLM refuses an extension whose attribute names clash with
the worker's own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

EXTENSION = "svc_generator.backends.vllm_worker.StrataWorkerExtension"
LOAD_METHOD = "strata_load_safetensors"
DIGEST_METHOD = "strata_weights_digest"


def read_safetensors(files: Sequence[str]) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` for every tensor of ``files``, read one at a time onto the CPU."""
    from safetensors import safe_open

    for path in files:
        with safe_open(path, framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield name, handle.get_tensor(name)


class StrataWorkerExtension:
    """Mixed into vLLM's worker; ``self.model_runner`` is the worker's (vLLM sets it up)."""

    model_runner: Any

    def strata_load_safetensors(self, files: Sequence[str]) -> int:
        """Load the checkpoint's tensors into the running model in place; returns how many were read.

        ``model.load_weights`` takes the Hugging Face names and does vLLM's own mapping (fused
        q/k/v and gate/up projections, tied embeddings, padded vocabulary), as at engine start.
        Unquantized weights need nothing more; quantized ones would need vLLM's post-load processing.
        """
        import torch

        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in read_safetensors(files):
                count += 1
                yield item

        self.model_runner.model.load_weights(weights=counted())
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the copies are done before the next batch is scheduled
        return count

    def strata_weights_digest(self) -> float:
        """Sum of |w| over the served parameters, in float64: shows which weights are loaded (tests)."""
        import torch

        with torch.no_grad():
            return float(sum(p.detach().double().abs().sum().item()
                             for p in self.model_runner.model.parameters()))
