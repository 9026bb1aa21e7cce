"""Identity of a tokenizer: the key under which token ids are stored in the content store.

Generators store response token ids under ``tokenizer_id(tokenizer)`` and the learner reads them back
with the same key, so it must depend only on the vocabulary (not on where the model lives).
"""

from __future__ import annotations

import hashlib
from typing import Any


def tokenizer_id(tokenizer: Any) -> str:
    """``tok-<sha256 of the sorted vocabulary, 12 hex>``."""
    vocab = tokenizer.get_vocab()
    return "tok-" + hashlib.sha256(repr(sorted(vocab.items())).encode()).hexdigest()[:12]
