"""Tiny models and in-process services for the diagnose tests (built in tmp dirs in a second)."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GPT2ForSequenceClassification, GPT2LMHeadModel, PreTrainedTokenizerFast

from strata.config import StrataSettings
from strata.contract.template import format_prompt
from strata.models.training import ModelShape, gpt2_config
from strata.rpc import ServiceBinding
from strata.service import ServiceParts, start_service, stop_service
from strata.v1 import generator_pb2, generator_pb2_grpc
from strata_tools.task import corpus
from strata_tools.task.suite import load_suite
from strata_tools.zoo.train import train_tokenizer
from svc_generator.backends.base import Backend, GenerationOutput, GenerationRequest
from svc_generator.batcher import DynamicBatcher
from svc_generator.config import GeneratorSettings
from svc_generator.servicer import GeneratorServicer

SHAPE = ModelShape(n_embd=64, n_layer=2, n_head=2)
N_BINS = 11


@dataclass(frozen=True)
class TinyModels:
    lm: Path            # the generator and the healthy policy
    drifted_lm: Path    # the same LM with every weight pushed far away (a shifted policy)
    strong_rm: Path     # an RM whose scores vary strongly with the input
    light_rm: Path      # a distilled-looking copy of the strong RM (small weight noise)
    random_rm: Path     # an unrelated random RM (what an RM fit to noise ranks like)
    dropout_rm: Path    # the strong RM with dropout 0.3 in its config (noisy once dropout is on)


def tokenizer() -> PreTrainedTokenizerFast:
    rng = random.Random(0)
    records = load_suite("train")[:200]
    texts = [format_prompt(r.text, [r.intent]) + " " + corpus.reference_response(r, rng) for r in records]
    return train_tokenizer(texts, vocab_size=400)


def _save(model: torch.nn.Module, tok: PreTrainedTokenizerFast, out: Path) -> Path:
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _perturbed(model: torch.nn.Module, std: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * std)


def _rm(tok: PreTrainedTokenizerFast, seed: int, **config: float) -> GPT2ForSequenceClassification:
    torch.manual_seed(seed)
    rm = GPT2ForSequenceClassification(gpt2_config(tok, SHAPE, 256, num_labels=N_BINS))
    for key, value in config.items():
        setattr(rm.config, key, value)
    with torch.no_grad():
        rm.score.weight.normal_(0.0, 0.5)  # logits of a few units: rewards spread over the 0-5 range
    return rm.eval()


def build_models(root: Path) -> TinyModels:
    tok = tokenizer()
    cfg = gpt2_config(tok, SHAPE, 256)
    cfg.tie_word_embeddings = False
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(cfg)
    with torch.no_grad():
        lm.lm_head.weight.normal_(0.0, 0.75)  # peaked enough that a near-zero temperature is greedy
    lm.eval()
    lm_dir = _save(lm, tok, root / "lm")
    _perturbed(lm, 0.5, seed=1)
    drifted = _save(lm, tok, root / "drifted_lm")
    strong = _rm(tok, seed=0)
    strong_dir = _save(strong, tok, root / "strong_rm")
    _perturbed(strong, 0.003, seed=2)
    light_dir = _save(strong, tok, root / "light_rm")
    random_dir = _save(_rm(tok, seed=7), tok, root / "random_rm")
    dropout_dir = _save(_rm(tok, seed=0, resid_pdrop=0.3, embd_pdrop=0.3, attn_pdrop=0.3), tok, root / "dropout_rm")
    return TinyModels(lm_dir, drifted, strong_dir, light_dir, random_dir, dropout_dir)


def service_settings(infra: StrataSettings, **extra: object) -> dict[str, object]:
    return {"kafka_bootstrap": infra.kafka_address, "redis_url": infra.redis_address, "device": "cpu",
            "consumer_session_timeout_ms": 6000, "consumer_heartbeat_interval_ms": 1000, "grpc_port": 0, **extra}


@contextmanager
def serving(*parts: ServiceParts) -> Iterator[list[int]]:
    """Start services in-process; yields their gRPC ports; stops them afterwards."""
    running = []
    try:
        for p in parts:
            running.append(start_service(p))
        yield [r.port for r in running]
    finally:
        for p, r in zip(parts, running, strict=False):
            stop_service(p, r, grace_s=0)


def generator_parts(settings: GeneratorSettings, backend: Backend) -> ServiceParts:
    """The generator's gRPC side as ``svc_generator.__main__.build`` wires it, around ``backend``,
    without the Kafka worker (the memory and repetition checks use Generate only)."""
    batcher = DynamicBatcher(backend, settings.max_batch_size, settings.max_wait_ms / 1000, settings.policy_version)
    servicer = GeneratorServicer(settings, batcher, None, backend.tokenizer_id)
    binding = ServiceBinding(generator_pb2_grpc.add_GeneratorServicer_to_server, servicer,
                             generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name)
    return ServiceParts("test-generator", settings, [binding], 0, loops=[batcher.run])


class LeakyBackend:
    """A backend that keeps what every batch allocated, like a rollout loop that never drops its
    outputs / KV cache: ``leak_bytes`` of touched memory per batch stay referenced."""

    def __init__(self, inner: Backend, leak_bytes: int) -> None:
        self._inner = inner
        self._leak_elems = leak_bytes // 4
        self.kept: list[torch.Tensor] = []
        self.model_id, self.tokenizer_id = inner.model_id, inner.tokenizer_id

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationOutput]:
        outputs = self._inner.generate(requests)
        self.kept.append(torch.ones(self._leak_elems))  # (N,) float32, pages touched
        return outputs

    def load_weights(self, path: str) -> None:
        self._inner.load_weights(path)

    def release_memory(self) -> None:
        self._inner.release_memory()  # releases the cache, not what is still referenced
