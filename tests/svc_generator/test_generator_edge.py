"""The generator's door for a user's model: direction names by template, rollout dropout by backend.

A real gRPC server around the real servicer, batcher and HF backend on tiny GPT-2 (zoo template,
dropout layers) and Llama (chat template, no dropout layers: hooks on attention and MLP outputs) checkpoints.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strata import rpc
from strata.models.budget import TokenBudget
from strata.models.tiny import build_tiny_model
from strata.rpc import ServiceBinding, start_server
from strata.v1 import common_pb2, generator_pb2, generator_pb2_grpc
from svc_generator.backends import has_dropout
from svc_generator.backends.hf import HfBackend
from svc_generator.batcher import DynamicBatcher
from svc_generator.config import GeneratorSettings
from svc_generator.servicer import GeneratorServicer


def serve(model: Path) -> Iterator[generator_pb2_grpc.GeneratorStub]:
    settings = GeneratorSettings(model=str(model), device="cpu", max_new_tokens=4, grpc_reflection=False)
    backend = HfBackend(str(model), device="cpu")
    batcher = DynamicBatcher(backend, 4, 0.005)
    stop = threading.Event()
    loop = threading.Thread(target=batcher.run, args=(stop,), daemon=True)
    loop.start()
    servicer = GeneratorServicer(settings, batcher, None, backend.tokenizer_id, TokenBudget.of_model("Level-1", model),
                                 rollout_dropout_ok=has_dropout(backend.lm.model))
    server = start_server([ServiceBinding(generator_pb2_grpc.add_GeneratorServicer_to_server, servicer,
                                          generator_pb2.DESCRIPTOR.services_by_name["Generator"].full_name)],
                          port=0, settings=settings, host="127.0.0.1")
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as channel:
            yield generator_pb2_grpc.GeneratorStub(channel)
    finally:
        server.stop(0)
        stop.set()
        loop.join()


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[generator_pb2_grpc.GeneratorStub]:
    yield from serve(build_tiny_model("llama", tmp_path_factory.mktemp("llama") / "m"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[generator_pb2_grpc.GeneratorStub]:
    yield from serve(build_tiny_model("gpt2", tmp_path_factory.mktemp("gpt2") / "m"))


def generate(stub: generator_pb2_grpc.GeneratorStub, direction: str, dropout: float | None = None
             ) -> generator_pb2.GenerateResponse:
    sampling = common_pb2.SamplingParams(max_new_tokens=4)
    if dropout is not None:
        sampling.rollout_dropout = dropout
    request = generator_pb2.GenerateRequest(prompt="Please help me sort a list.", sampling=sampling,
                                            directions=[common_pb2.Direction(name=direction)])
    return stub.Generate(request, timeout=60)


def test_a_chat_model_takes_a_users_own_direction_and_the_zoo_template_refuses_it(llama, gpt2) -> None:
    assert len(generate(llama, "cite_sources").generations) == 1
    with pytest.raises(grpc.RpcError) as refused:
        generate(gpt2, "cite_sources")
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "directions[0].name" in refused.value.details() and "unknown direction" in refused.value.details()
    with pytest.raises(grpc.RpcError) as malformed:
        generate(llama, "Cite Sources!")
    assert malformed.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def test_rollout_dropout_is_served_on_gpt2_by_its_layers_and_on_llama_by_hooks(llama, gpt2) -> None:
    assert len(generate(gpt2, "give_code", dropout=0.1).generations) == 1  # GPT-2 has nn.Dropout layers
    assert len(generate(llama, "give_code", dropout=0.1).generations) == 1  # Llama: hooks, no layers


def test_a_model_rollout_dropout_cannot_reach_is_refused_at_the_door(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("svc_generator.backends.hf.DROPOUT_SITES", frozenset())  # a Llama with nothing to hook
    for stub in serve(build_tiny_model("llama", tmp_path / "m")):
        with pytest.raises(grpc.RpcError) as refused:
            generate(stub, "give_code", dropout=0.1)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("sampling.rollout_dropout:")
