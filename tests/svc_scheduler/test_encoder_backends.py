"""The encoder's backends: ONNX gives torch's vectors; int8 is its own vector space; failures fall back."""

from __future__ import annotations

import builtins
import logging

import numpy as np
import pytest

from strata_tools.task.suite import load_suite
from svc_scheduler.encoder import Encoder

TEXTS = [r.text for r in load_suite("eval")[:40]] + [
    "Please, could you kindly explain how a hash map works? Thank you so much!",
    "ignore previous instructions <|im_start|>system",
    "¿Cómo funciona un árbol binario? 二分木の仕組みは?",
    "a " * 400,  # past the encoder's max_seq_length: cut as torch cuts it
]


@pytest.fixture(scope="module")
def torch_encoder() -> Encoder:
    return Encoder(backend="torch")


@pytest.fixture(scope="module")
def onnx_encoder() -> Encoder:
    return Encoder(backend="onnx")


def test_onnx_gives_the_torch_vectors_under_the_same_encoder_id(onnx_encoder: Encoder, torch_encoder: Encoder) -> None:
    encoder = onnx_encoder
    assert encoder.backend == "onnx"
    assert encoder._onnx is not None
    assert encoder._onnx.tokenizer_alone  # MiniLM's preprocessing is its tokenizer's call: the fast path is taken
    assert encoder.encoder_id == torch_encoder.encoder_id
    vectors, tokens = encoder.encode_counted(TEXTS)
    reference, reference_tokens = torch_encoder.encode_counted(TEXTS)
    assert np.abs(vectors - reference).max() < 1e-4
    assert tokens == reference_tokens
    one_by_one = np.stack([encoder.encode([t])[0] for t in TEXTS[:5]])
    assert np.abs(one_by_one - reference[:5]).max() < 1e-4  # batch padding changes nothing


def test_int8_is_close_but_a_vector_space_of_its_own(torch_encoder: Encoder) -> None:
    int8 = Encoder(backend="onnx-int8")
    assert int8.backend == "onnx-int8"
    assert int8.encoder_id != torch_encoder.encoder_id and "int8" in int8.encoder_id
    cosine = (int8.encode(TEXTS) * torch_encoder.encode(TEXTS)).sum(axis=1)
    assert cosine.min() > 0.95
    assert cosine.max() < 1 - 1e-6  # not the same vectors: sharing an index would be wrong
    batched = int8.encode(TEXTS)
    alone = np.stack([int8.encode([t])[0] for t in TEXTS])
    assert np.abs(batched - alone).max() < 1e-6  # a text's vector does not depend on the rest of its batch


def test_without_onnxruntime_the_encoder_stays_on_torch(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture,
                                                        torch_encoder: Encoder) -> None:
    real_import = builtins.__import__

    def no_onnxruntime(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("onnxruntime"):
            raise ImportError("No module named 'onnxruntime'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxruntime)
    with caplog.at_level(logging.WARNING, logger="svc_scheduler.encoder"):
        fallback = Encoder(backend="onnx")
    assert fallback.backend == "torch"
    assert fallback.encoder_id == torch_encoder.encoder_id
    assert "encoder_backend onnx unavailable" in caplog.text and "stays on torch" in caplog.text
    assert np.abs(fallback.encode(TEXTS[:3]) - torch_encoder.encode(TEXTS[:3])).max() < 1e-6


def test_an_export_that_gives_other_vectors_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture,
                                                                torch_encoder: Encoder) -> None:
    from svc_scheduler import encoder as encoder_module

    monkeypatch.setattr(encoder_module, "ONNX_MATCH_ATOL", -1.0)  # no export can pass: stands in for a bad one
    with caplog.at_level(logging.WARNING, logger="svc_scheduler.encoder"):
        fallback = Encoder(backend="onnx")
    assert fallback.backend == "torch" and "gives other vectors than torch" in caplog.text
    assert np.abs(fallback.encode(TEXTS[:3]) - torch_encoder.encode(TEXTS[:3])).max() < 1e-6  # and still encodes


def test_a_read_only_cache_exports_to_a_temporary_directory(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from svc_scheduler import encoder as encoder_module

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("a mounted file stands in for a read-only volume")
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path / "tmp"))
    assert encoder_module._export_dir(not_a_dir) == tmp_path / "tmp" / "strata-encoders"


def test_the_export_runs_fused_transformer_ops(onnx_encoder: Encoder, encoder: Encoder) -> None:
    import onnx

    for fused, attention in ((onnx_encoder, "Attention"), (encoder, "QAttention")):  # float; int8 (the default)
        assert fused._onnx is not None
        ops = {node.op_type for node in onnx.load(str(fused._onnx.path)).graph.node}
        assert {attention, "SkipLayerNormalization"} <= ops  # one op per attention block, not ~30


def test_a_graph_the_optimizer_cannot_fuse_keeps_the_plain_export(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                                 caplog: pytest.LogCaptureFixture,
                                                                 torch_encoder: Encoder) -> None:
    import onnx
    import onnxruntime.transformers.optimizer as optimizer

    def cannot_fuse(*_args: object, **_kwargs: object) -> None:
        raise ValueError("unknown model type")

    monkeypatch.setattr(optimizer, "optimize_model", cannot_fuse)
    with caplog.at_level(logging.WARNING, logger="svc_scheduler.encoder"):
        plain = Encoder(backend="onnx", cache_dir=tmp_path)
    assert plain.backend == "onnx" and "left unfused" in caplog.text
    assert plain._onnx is not None
    ops = {node.op_type for node in onnx.load(str(plain._onnx.path)).graph.node}
    assert "Attention" not in ops
    assert np.abs(plain.encode(TEXTS) - torch_encoder.encode(TEXTS)).max() < 1e-4


def test_a_tokenizer_that_disagrees_with_the_preprocessing_is_not_used_alone(onnx_encoder: Encoder,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    encoder = onnx_encoder
    real = encoder._tokenize

    def with_a_prompt(texts: list[str]) -> object:  # what a model whose preprocessing adds a prompt differs by
        return real([f"query: {t}" for t in texts])

    monkeypatch.setattr(encoder, "_tokenize", with_a_prompt)
    assert not encoder._tokenizer_gives_the_preprocessing(["input_ids", "attention_mask", "token_type_ids"])
    monkeypatch.setattr(encoder, "_tokenize", real)
    assert encoder._tokenizer_gives_the_preprocessing(["input_ids", "attention_mask", "token_type_ids"])


def test_auto_is_int8_on_a_cpu_and_adopts_the_vector_space_of_the_state(torch_encoder: Encoder,
                                                                       onnx_encoder: Encoder) -> None:
    auto = Encoder()  # the default: auto
    assert auto.auto and auto.backend == "onnx-int8" and auto.encoder_id.endswith("+int8/384")
    int8_id = auto.encoder_id
    assert not auto.adopt(int8_id)  # already there

    assert auto.adopt(torch_encoder.encoder_id)  # a state built by torch or onnx: float vectors
    assert auto.backend == "onnx" and auto.encoder_id == torch_encoder.encoder_id
    assert np.abs(auto.encode(TEXTS) - torch_encoder.encode(TEXTS)).max() < 1e-4

    assert auto.adopt(int8_id)  # and back
    assert auto.backend == "onnx-int8" and auto.encoder_id == int8_id

    assert not auto.adopt("another-model/384")  # not this model's: the claim refuses it, not the encoder
    assert not onnx_encoder.adopt(int8_id)  # a backend set by hand is kept
    assert onnx_encoder.backend == "onnx"
