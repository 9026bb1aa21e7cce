"""vLLM backend (CUDA GPU, extra ``vllm``). Imported only when ``--backend vllm`` is selected.

It keeps the HF backend's contract (``base.py``) so that a rollout means the same whichever backend
wrote it (docs/gpu.md):

- **token ids**: stored under ``tokenizer_id(tokenizer)`` of the model's own tokenizer, the key the
  HF backend and the learner use; vLLM is fed the prompt as token ids from
  ``PromptFormat.of(tokenizer).prompt_ids``, the ids the learner rebuilds from the texts;
- **sampling**: temperature and top_p as asked, top_k off, a per-request seed, stopping on the model's
  stop tokens (``stop_token_ids``); the response ids come back as generated, the stop token included;
- **device**: a CUDA GPU only (``cpu`` is refused); ``cuda:N`` narrows ``CUDA_VISIBLE_DEVICES`` to GPU N;
- **rollout dropout** (R17) cannot be done inside vLLM's kernels: refused (``create_backend``, and any
  request that asks for it);
- **weight sync**: in place, vLLM's RLHF pattern: a worker extension (``vllm_worker.py``) loads the new
  checkpoint's safetensors into the running model through ``LLM.collective_rpc``, then the prefix cache
  (KV computed with the old weights) is reset. A vLLM without ``worker_extension_cls`` or
  ``collective_rpc`` rebuilds the engine instead. ``last_reload_s`` holds the time of the last reload.

vLLM batches internally (continuous batching); the service's dynamic batcher still groups requests so
that one ``LLM.generate`` call carries many prompts.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, GenerationConfig

from strata.models.loading import ModelLoadError, _load_tokenizer, check_model_dir, params_on_disk, resolve_dtype
from strata.models.prompts import PromptFormat, stop_token_ids
from strata.models.tokens import tokenizer_id
from strata.sampling import Sampling
from svc_generator.backends.base import GenerationOutput, GenerationRequest
from svc_generator.backends.vllm_worker import DIGEST_METHOD, EXTENSION, LOAD_METHOD
from svc_generator.config import GeneratorSettings

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
# config.json fields a weight reload must not change (the engine's shapes are built from them).
_SHAPE_KEYS = ("model_type", "architectures", "vocab_size", "hidden_size", "intermediate_size",
               "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")


def claim_cuda_device(spec: str) -> str:
    """The GPU the engine will run on, as ``cuda:N``; for ``cuda:N`` with ``CUDA_VISIBLE_DEVICES``
    unset, sets it to ``N`` (vLLM runs on the first visible GPU). Raises ``ModelLoadError``.

    Call it before anything in the process touches CUDA: the visible GPUs are read once.
    """
    spec = spec.strip().lower()
    if spec == "cpu":
        raise ModelLoadError("device 'cpu': the vllm backend runs on a CUDA GPU only; use --backend hf on the CPU, "
                             "or --device auto, cuda or cuda:N on a GPU machine")
    if spec in ("auto", "cuda"):
        index = None
    elif spec.startswith("cuda:") and spec[5:].isdigit():
        index = int(spec[5:])
    else:
        raise ModelLoadError(f"bad device {spec!r} for the vllm backend: use auto, cuda or cuda:N")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    changed = False
    if index:  # cuda:0 is the first visible GPU whatever the setting
        if visible is not None:
            gpus = [g.strip() for g in visible.split(",") if g.strip()]
            pick = gpus[index] if index < len(gpus) else "<gpu>"
            raise ModelLoadError(
                f"device {spec!r} conflicts with CUDA_VISIBLE_DEVICES={visible!r}: vLLM runs on the first visible "
                f"GPU; set CUDA_VISIBLE_DEVICES={pick} and --device cuda:0, or unset CUDA_VISIBLE_DEVICES")
        if torch.cuda.is_initialized():
            raise ModelLoadError(
                f"device {spec!r}: CUDA is already initialised in this process, so the engine can no longer be "
                f"moved to GPU {index}; set CUDA_VISIBLE_DEVICES={index} before starting and use --device cuda:0")
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
        changed = True
        log.info("CUDA_VISIBLE_DEVICES=%d for the vLLM engine (--device %s)", index, spec)
    if not torch.cuda.is_available():
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        where = f" with CUDA_VISIBLE_DEVICES={shown}" if shown is not None else ""
        if changed:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        raise ModelLoadError(f"device {spec!r}: the vllm backend needs a CUDA GPU and none is visible{where}; "
                             "use --backend hf on a machine without one")
    return f"cuda:{index or 0}"


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files ``from_pretrained`` reads: the index's shards, else ``model.safetensors``.

    Other safetensors in a learner checkpoint (``value_head.safetensors``) are not the LM's weights.
    """
    index = model_dir / WEIGHTS_INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / shard for shard in shards]
    if (model_dir / WEIGHTS_FILE).is_file():
        return [model_dir / WEIGHTS_FILE]
    raise ModelLoadError(f"no weights to load in {model_dir}: expected {WEIGHTS_FILE} (or {WEIGHTS_INDEX} and its "
                         "shards), as save_pretrained writes them")


def generation_config(model_dir: Path) -> Any:
    """The generation config ``from_pretrained`` would give the model: its file, else from config.json."""
    if (model_dir / "generation_config.json").is_file():
        return GenerationConfig.from_pretrained(model_dir, local_files_only=True)
    return GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir, local_files_only=True))


def _shape_config(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text())
    return {key: config[key] for key in _SHAPE_KEYS if key in config}


def _vllm_dtype(spec: str) -> str:
    """The dtype the HF backend would pick on a GPU (``auto``: bfloat16 where supported), as vLLM names it."""
    return str(resolve_dtype(spec, torch.device("cuda"))).removeprefix("torch.")


class VllmBackend:
    """One vLLM engine on one GPU; see the module docstring for the contract."""

    def __init__(self, model_path: str, settings: GeneratorSettings,
                 engine_options: Mapping[str, Any] | None = None) -> None:
        """``engine_options``: more keyword arguments for ``vllm.LLM`` (e.g. ``gpu_memory_utilization``)."""
        self.device = claim_cuda_device(settings.device)  # before vLLM (or anything) initialises CUDA
        try:
            import vllm
        except ImportError as exc:
            raise RuntimeError(
                "backend 'vllm' selected but vllm is not installed: pip install 'strata-rollout[vllm]' "
                "(needs a CUDA GPU), or use --backend hf"
            ) from exc
        self._vllm = vllm
        self._settings = settings
        self._options = dict(engine_options or {})
        model_dir = check_model_dir(model_path)
        # The tokenizer as the HF backend loads it: same id, same prompt ids, same pad and stop tokens.
        self.tokenizer = _load_tokenizer(model_dir, padding_side="left")
        self.tokenizer_id = tokenizer_id(self.tokenizer)
        self.prompt_format = PromptFormat.of(self.tokenizer)
        self.stop_ids = stop_token_ids(self.tokenizer, generation_config(model_dir))
        self.n_params = params_on_disk(model_dir)
        self.dtype = _vllm_dtype(settings.dtype)
        self.model_id = str(model_path)
        self._shape = _shape_config(model_dir)
        self._view: tempfile.TemporaryDirectory[str] | None = None  # see _engine_dir
        self.last_reload_s: float | None = None  # seconds of the last load_weights
        self.last_reload_mode: str | None = None  # "in_place" or "rebuild"
        self._llm, self.in_place_reload = self._build(model_dir)
        log.info("vLLM %s engine on %s (%s) from %s; weight sync %s; %d stop ids, %s prompt format",
                 getattr(vllm, "__version__", "?"), self.device, self.dtype, model_dir,
                 "in place" if self.in_place_reload else "by rebuild", len(self.stop_ids), self.prompt_format.kind)

    # -- engine ------------------------------------------------------------------------------------

    def _engine_dir(self, model_dir: Path) -> Path:
        """``model_dir``, or a directory of links to it without its extra safetensors: vLLM loads every
        ``*.safetensors`` of a directory without an index, and a learner checkpoint holds the value head."""
        try:
            wanted = set(weight_files(model_dir))
        except ModelLoadError:
            return model_dir  # e.g. .bin weights: vLLM reads them itself
        if set(model_dir.glob("*.safetensors")) <= wanted:
            return model_dir
        self._view = tempfile.TemporaryDirectory(prefix="strata-vllm-")
        view = Path(self._view.name)
        for path in model_dir.iterdir():
            if path.is_file() and (path.suffix != ".safetensors" or path in wanted):
                (view / path.name).symlink_to(path.resolve())
        return view

    def _build(self, model_dir: Path) -> tuple[Any, bool]:
        """A new engine on ``model_dir``, and whether it can reload weights in place."""
        options = {"model": str(self._engine_dir(model_dir)), "dtype": self.dtype,
                   "max_num_seqs": self._settings.max_batch_size, "enforce_eager": True, "seed": 0, **self._options}
        try:
            llm = self._vllm.LLM(**options, worker_extension_cls=EXTENSION)
        except TypeError as exc:  # vLLM before worker extensions (0.7.x): rebuild on every weight sync
            if "worker_extension_cls" not in str(exc):
                raise
            log.warning("this vLLM has no worker_extension_cls: weight sync will rebuild the engine")
            return self._vllm.LLM(**options), False
        if not hasattr(llm, "collective_rpc"):
            log.warning("this vLLM has no LLM.collective_rpc: weight sync will rebuild the engine")
            return llm, False
        return llm, True

    def _rebuild(self, model_dir: Path) -> None:
        """Drop the engine (its GPU memory first: two engines do not fit) and build one on ``model_dir``;
        if that fails, build one on the weights served before and raise."""
        previous = check_model_dir(self.model_id)
        self._drop_engine()
        try:
            self._llm, self.in_place_reload = self._build(model_dir)
        except Exception:
            log.exception("could not build a vLLM engine on %s; rebuilding on %s", model_dir, previous)
            self._llm, self.in_place_reload = self._build(previous)
            raise

    def _drop_engine(self) -> None:
        self._llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- Backend -----------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        for request in requests:
            if request.sampling.rollout_dropout:
                raise ValueError("sampling.rollout_dropout: the vllm backend cannot keep dropout on during rollout "
                                 "(R17); send it to a generator with --backend hf")
        prompt_ids = [self.prompt_format.prompt_ids(r.prompt, r.directions) for r in requests]
        params = [self.sampling_params(r.sampling) for r in requests]
        results = self._llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        return [self._output(ids, result) for ids, result in zip(prompt_ids, results, strict=True)]

    def sampling_params(self, sampling: Sampling) -> Any:
        """vLLM's ``SamplingParams`` for the HF backend's sampling: top_k off (-1 in every vLLM version)."""
        return self._vllm.SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p, top_k=-1,
                                         max_tokens=sampling.max_new_tokens, seed=sampling.seed,
                                         stop_token_ids=list(self.stop_ids))

    def _output(self, prompt_ids: list[int], result: Any) -> GenerationOutput:
        completion = result.outputs[0]
        token_ids = tuple(int(t) for t in completion.token_ids)  # the stop token included when it came
        finished = completion.finish_reason == "stop"
        stops, pad = set(self.stop_ids), self.tokenizer.pad_token_id
        text = self.tokenizer.decode([t for t in token_ids if t not in stops and t != pad],
                                     skip_special_tokens=True).strip()  # as the HF backend decodes
        return GenerationOutput(text, token_ids, len(prompt_ids), finished)

    def load_weights(self, path: str) -> None:
        """Swap in the checkpoint at ``path`` (same architecture and tokenizer): in place when the engine
        allows it, else by rebuilding the engine. The time taken is ``last_reload_s`` (and logged)."""
        started = time.perf_counter()
        model_dir = check_model_dir(path)
        shape = _shape_config(model_dir)
        # Only fields both configs name: another transformers version may write a default out (head_dim).
        changed = sorted(k for k in set(shape) & set(self._shape) if shape[k] != self._shape[k])
        if changed:
            raise ModelLoadError(f"cannot load {model_dir} into the running engine: config.json differs in "
                                 f"{', '.join(changed)}; a weight sync keeps the architecture (restart to change it)")
        files = [str(f) for f in weight_files(model_dir)]
        mode = "rebuild"
        if self.in_place_reload:
            try:
                counts = self._llm.collective_rpc(LOAD_METHOD, args=(files,))
            except Exception:  # a half-loaded model must not serve: rebuild from the checkpoint
                log.exception("in-place weight load from %s failed; rebuilding the engine", model_dir)
                self._rebuild(model_dir)
            else:
                # Prefix-cache blocks hold KV computed with the old weights (vllm-project/vllm#9744).
                if hasattr(self._llm, "reset_prefix_cache"):
                    self._llm.reset_prefix_cache()
                mode = "in_place"
                log.debug("loaded %s tensors per worker", counts)
        else:
            self._rebuild(model_dir)
        self.last_reload_s = time.perf_counter() - started
        self.last_reload_mode = mode
        self.model_id = path
        log.info("vLLM weights from %s loaded (%s) in %.3f s", path, mode, self.last_reload_s)

    def weights_digest(self) -> float | None:
        """Sum of |w| over the served weights (``vllm_worker``); None without ``collective_rpc``."""
        if not self.in_place_reload:
            return None
        return float(self._llm.collective_rpc(DIGEST_METHOD)[0])

    def release_memory(self) -> None:
        pass  # vLLM keeps its own KV-cache pool; emptying torch's cache would not give it back
