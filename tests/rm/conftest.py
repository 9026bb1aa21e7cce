"""Tiny reward models built in tmp_path (no zoo needed)."""

from rmutil import make_rm, tiny_tokenizer
from torchutil import one_torch_thread

__all__ = ["make_rm", "one_torch_thread", "tiny_tokenizer"]
