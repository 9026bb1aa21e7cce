"""vLLM backend (GPU, extra ``vllm``). Imported only when ``--backend vllm`` is selected.

vLLM batches internally (continuous batching); the service's dynamic batcher still groups requests so
that one ``LLM.generate`` call carries many prompts. Weight sync reloads the weights in place through
the engine's ``collective_rpc`` hook when available, else by rebuilding the engine (slower, but safe).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from strata.contract.template import format_prompt
from strata.models.loading import params_on_disk
from svc_generator.backends.base import GenerationOutput, GenerationRequest
from svc_generator.config import GeneratorSettings

log = logging.getLogger(__name__)


class VllmBackend:
    def __init__(self, model_path: str, settings: GeneratorSettings) -> None:
        try:
            import vllm
        except ImportError as exc:
            raise RuntimeError(
                "backend 'vllm' selected but vllm is not installed: pip install 'strata-rollout[vllm]' "
                "(needs a CUDA GPU), or use --backend hf"
            ) from exc
        self._vllm = vllm
        self._settings = settings
        self._path = model_path
        self._llm = self._build(model_path)
        self.model_id = model_path
        self.tokenizer_id = f"vllm-{model_path.rstrip('/').split('/')[-1]}"
        self.n_params = params_on_disk(model_path)
        self.device = "cuda"

    def _build(self, path: str) -> Any:
        dtype = "auto" if self._settings.dtype == "auto" else self._settings.dtype
        return self._vllm.LLM(model=path, dtype=dtype, max_num_seqs=self._settings.max_batch_size,
                              enforce_eager=True, seed=0)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        prompts = [format_prompt(r.prompt, r.directions) for r in requests]
        params = [
            self._vllm.SamplingParams(
                temperature=r.sampling.temperature, top_p=r.sampling.top_p, max_tokens=r.sampling.max_new_tokens,
                seed=r.sampling.seed,
            )
            for r in requests
        ]
        results = self._llm.generate(prompts, params, use_tqdm=False)
        outputs = []
        for result in results:
            completion = result.outputs[0]
            outputs.append(GenerationOutput(
                completion.text.strip(), tuple(completion.token_ids), len(result.prompt_token_ids),
                completion.finish_reason == "stop",
            ))
        return outputs

    def load_weights(self, path: str) -> None:
        # Rebuilding is the portable path across vLLM versions; in-place reload APIs change often.
        del self._llm
        self._llm = self._build(path)
        self.model_id = path
        log.info("vLLM engine rebuilt with weights from %s", path)

    def release_memory(self) -> None:
        pass  # vLLM manages its own KV-cache pool
