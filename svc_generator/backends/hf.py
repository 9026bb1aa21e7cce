"""Hugging Face transformers backend (CPU or GPU): batched ``model.generate`` per sampling group."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from strata.models.loading import LoadedModel, from_pretrained, load_causal_lm
from strata.models.prompts import PromptFormat, cut_at_stop, stop_token_ids
from strata.models.tokens import tokenizer_id
from strata.sampling import Sampling
from svc_generator.backends.base import GenerationOutput, GenerationRequest

log = logging.getLogger(__name__)


def _group_key(sampling: Sampling) -> tuple:
    # model.generate takes one sampling configuration (and one RNG state) per call.
    return (sampling.temperature, sampling.top_p, sampling.max_new_tokens, sampling.seed, sampling.rollout_dropout)


def _sort_key(sampling: Sampling) -> tuple:
    """``_group_key`` made orderable: a batch mixes requests with and without a seed (or dropout)."""
    return tuple((value is not None, value if value is not None else 0) for value in _group_key(sampling))


# Where a decoder block's residual branches end in Llama, Qwen2, Mistral, Gemma and Phi-3 (their
# attention dropout is functional and their MLPs have none): rollout dropout drops these outputs.
DROPOUT_SITES = frozenset({"self_attn", "mlp"})


def dropout_modules(model: torch.nn.Module) -> list[torch.nn.Dropout]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]


def dropout_sites(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The attention and MLP blocks whose outputs a forward hook drops, for models without
    ``nn.Dropout`` modules (GPT-2 style dropout sits at the same places: after attention and MLP)."""
    return [m for name, m in model.named_modules() if name.rsplit(".", 1)[-1] in DROPOUT_SITES]


def can_drop_out(model: torch.nn.Module) -> bool:
    """Whether rollout dropout changes what ``model`` samples: it has dropout modules or hook sites."""
    return bool(dropout_modules(model) or dropout_sites(model))


def _drop_output(p: float) -> Callable[[torch.nn.Module, Any, Any], Any]:
    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, tuple):  # attention: (hidden states, weights, ...)
            return (torch.nn.functional.dropout(output[0], p, training=True), *output[1:])
        return torch.nn.functional.dropout(output, p, training=True)

    return hook


@contextmanager
def rollout_dropout(model: torch.nn.Module, p: float | None) -> Iterator[None]:
    """Dropout on during generation (R17). A model with ``nn.Dropout`` modules gets only those
    switched to training mode at ``p``; one without (Llama and kin) gets ``p`` applied by forward hooks
    to its attention and MLP outputs, removed afterwards. ``None`` or 0: off."""
    if not p:
        yield
        return
    dropouts = dropout_modules(model)
    if not dropouts:
        handles = [site.register_forward_hook(_drop_output(p)) for site in dropout_sites(model)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        return
    saved = [(m.p, m.training) for m in dropouts]
    for module in dropouts:
        module.p = p
        module.train(True)
    try:
        yield
    finally:
        for module, (old_p, training) in zip(dropouts, saved, strict=True):
            module.p = old_p
            module.train(training)


class SampledTokenLogprobs(LogitsProcessor):
    """Records each sampled token's log-probability under the model's own distribution.

    ``generate`` runs a caller's processors before its sampling warpers, so the scores seen here are the
    model's logits, before temperature and top-p (a test pins it). The token drawn from step t's scores is
    the last input id at step t + 1, and the final step's is read from the returned sequences
    (:meth:`per_token`). One (B, V) tensor is held, not the whole run's logits."""

    def __init__(self) -> None:
        self._previous: torch.Tensor | None = None  # (B, V) log-softmax of the latest step's scores
        self._steps: list[torch.Tensor] = []        # (B,) per step whose token is known

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self._steps.append(self._previous.gather(1, input_ids[:, -1:]).squeeze(1))
        self._previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def per_token(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(B, T_new) log-probabilities of ``new_tokens`` (the generated part of the sequences)."""
        if self._previous is not None and new_tokens.shape[1] > len(self._steps):
            last = new_tokens[:, len(self._steps):len(self._steps) + 1]
            self._steps.append(self._previous.gather(1, last).squeeze(1))
            self._previous = None
        if not self._steps:
            return torch.zeros((new_tokens.shape[0], 0))
        return torch.stack(self._steps, dim=1)[:, : new_tokens.shape[1]]


class HfBackend:
    def __init__(self, model_path: str, device: str = "auto", dtype: str = "auto") -> None:
        self._lm: LoadedModel = load_causal_lm(model_path, device=device, dtype=dtype)
        self.model_id = str(self._lm.path)
        self.tokenizer_id = tokenizer_id(self._lm.tokenizer)
        self.prompt_format = PromptFormat.of(self._lm.tokenizer)
        # Instruct models end a turn with their own token (<|eot_id|>, <|im_end|>), listed in the
        # generation config beside the tokenizer's EOS.
        self.stop_ids = stop_token_ids(self._lm.tokenizer, getattr(self._lm.model, "generation_config", None))

    @property
    def lm(self) -> LoadedModel:
        return self._lm

    @property
    def n_params(self) -> int:
        return self._lm.n_params

    @property
    def device(self) -> str:
        return str(self._lm.device)

    def load_weights(self, path: str) -> None:
        fresh = from_pretrained(AutoModelForCausalLM, path, dtype=next(self._lm.model.parameters()).dtype)
        self._lm.model.load_state_dict(fresh.state_dict())
        self._lm.model.eval()
        self.model_id = path
        log.info("loaded weights from %s", path)

    def release_memory(self) -> None:
        if self._lm.device.type == "cuda":
            torch.cuda.empty_cache()

    @torch.no_grad()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        outputs: dict[int, GenerationOutput] = {}
        order = sorted(range(len(requests)), key=lambda i: _sort_key(requests[i].sampling))
        for _key, members in itertools.groupby(order, key=lambda i: _group_key(requests[i].sampling)):
            indices = list(members)
            for index, output in zip(indices, self._generate_group([requests[i] for i in indices]), strict=True):
                outputs[index] = output
        return [outputs[i] for i in range(len(requests))]

    def _generate_group(self, group: list[GenerationRequest]) -> list[GenerationOutput]:
        tokenizer, model = self._lm.tokenizer, self._lm.model
        sampling = group[0].sampling
        texts = [self.prompt_format.generator_text(r.prompt, r.directions) for r in group]
        batch = self.prompt_format.encode(texts, return_tensors="pt", padding=True).to(self._lm.device)  # left pad
        prompt_lengths = batch["attention_mask"].sum(dim=1).tolist()
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        recorder = SampledTokenLogprobs()
        with rollout_dropout(model, sampling.rollout_dropout):
            generated = model.generate(
                **batch,
                max_new_tokens=sampling.max_new_tokens,
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=0,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=list(self.stop_ids),
                logits_processor=LogitsProcessorList([recorder]),
            )  # (B, T_prompt + T_new)
        generated_part = generated[:, batch["input_ids"].shape[1]:]  # (B, T_new)
        logprobs = recorder.per_token(generated_part).tolist()
        stops, pad = set(self.stop_ids), tokenizer.pad_token_id
        results = []
        for row, prompt_length, row_logprobs in zip(generated_part.tolist(), prompt_lengths, logprobs, strict=True):
            row, finished = cut_at_stop(row, stops)
            text = tokenizer.decode([t for t in row if t not in stops and t != pad], skip_special_tokens=True).strip()
            results.append(GenerationOutput(text, tuple(row), int(prompt_length), finished,
                                            tuple(row_logprobs[: len(row)])))
        return results
